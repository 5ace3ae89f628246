"""Load patterns: closed-loop concurrency bound, Poisson arrivals, request and time bounds."""

from __future__ import annotations

import asyncio
import statistics
import time

from fishserve.bench.client import RequestRecord
from fishserve.bench.load import LevelPlan, poisson_arrivals, run_closed_loop, run_poisson


class FakeServer:
    """Answers after `delay` seconds and tracks how many requests are open at once."""

    def __init__(self, delay: float) -> None:
        self.delay, self.open, self.most_open, self.started = delay, 0, 0, []

    async def send(self, index: int, t0: float | None) -> RequestRecord:
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        self.started.append(time.perf_counter())
        await asyncio.sleep(self.delay)
        self.open -= 1
        return RequestRecord(index, 0, "x", 0.0, "200", latency_s=self.delay, audio_s=1.0)


def test_closed_loop_keeps_exactly_c_in_flight_and_stops_at_the_count():
    server, done = FakeServer(0.01), []
    records = asyncio.run(run_closed_loop(LevelPlan(3, 10, 60.0), server.send, done.append))
    assert [r.index for r in records] == list(range(10))
    assert server.most_open == 3 and len(done) == 10


def test_closed_loop_ramp_spreads_the_first_requests():
    server = FakeServer(0.5)
    plan = LevelPlan(4, 4, 60.0, ramp_s=0.4)  # workers start 0, 0.1, 0.2, 0.3 s in
    asyncio.run(run_closed_loop(plan, server.send, lambda r: None))
    offsets = [t - server.started[0] for t in server.started]
    assert offsets == sorted(offsets)
    assert [round(x, 1) for x in offsets] == [0.0, 0.1, 0.2, 0.3]


def test_ramp_waits_only_for_workers_that_will_send():
    server = FakeServer(0.05)
    plan = LevelPlan(4, 1, 60.0, ramp_s=80.0)  # one request: workers 1-3 never send
    start = time.perf_counter()
    records = asyncio.run(run_closed_loop(plan, server.send, lambda r: None))
    assert len(records) == 1 and time.perf_counter() - start < 2.0
    plan = LevelPlan(4, 100, 0.5, ramp_s=80.0)  # workers 1-3 would start after the duration
    start = time.perf_counter()
    records = asyncio.run(run_closed_loop(plan, server.send, lambda r: None))
    assert 1 <= len(records) <= 12 and time.perf_counter() - start < 2.0
    plan = LevelPlan(4, 3, 60.0, ramp_s=8.0)  # worker 0 takes all 3 before the others wake
    start = time.perf_counter()
    records = asyncio.run(run_closed_loop(plan, server.send, lambda r: None))
    assert len(records) == 3 and time.perf_counter() - start < 1.0


def test_closed_loop_stops_starting_requests_after_the_duration():
    server = FakeServer(0.05)
    records = asyncio.run(run_closed_loop(LevelPlan(1, 1000, 0.12), server.send, lambda r: None))
    assert 1 <= len(records) <= 4  # 0.05 s each: about 3 start within 0.12 s


def test_poisson_arrivals_are_seeded_with_the_right_mean_gap():
    times = poisson_arrivals(4.0, 2000, seed=1)
    assert times == poisson_arrivals(4.0, 2000, seed=1)
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert abs(statistics.mean(gaps) - 0.25) < 0.02


def test_poisson_runs_open_loop_and_respects_max_inflight():
    server = FakeServer(0.2)
    plan = LevelPlan(200.0, 12, 60.0)  # arrivals every ~5 ms, each request takes 200 ms
    records = asyncio.run(run_poisson(plan, server.send, lambda r: None, seed=0, max_inflight=4))
    assert sorted(r.index for r in records) == list(range(12))
    assert server.most_open == 4


def test_quiet_collector_holds_full_collections_off_for_a_level_and_collects_after() -> None:
    import gc
    import weakref

    from fishserve.bench.shares import quiet_collector
    from fishserve.server.gc_control import NO_AUTO_FULL

    class Node:
        pass

    gc.unfreeze()  # a process without a freeze of its own (a test before may have made one)
    saved = gc.get_threshold()
    with quiet_collector():
        assert gc.get_threshold()[2] == NO_AUTO_FULL
        assert gc.get_freeze_count() > 0  # what existed before the level is not walked
        node = Node()
        node.self = node  # garbage only the collector can free, made during the level
        probe = weakref.ref(node)
        del node
    assert probe() is None  # collected after the level
    assert gc.get_threshold() == saved and gc.get_freeze_count() == 0


def test_quiet_collector_keeps_a_freeze_made_before_it() -> None:
    import gc

    from fishserve.bench.shares import quiet_collector

    gc.freeze()  # e.g. a server's start-up freeze in the same process
    frozen = gc.get_freeze_count()
    try:
        with quiet_collector():
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen  # not undone
    finally:
        gc.unfreeze()
