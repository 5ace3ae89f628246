"""Load patterns: a closed loop at fixed concurrency, or open-loop Poisson arrivals.

Closed loop (concurrency c): c workers each send a request, wait for its last byte, and send
the next, so c requests are always in flight. Open loop (rate r requests/s): requests start at
the arrival times of a Poisson process (exponential gaps of mean 1/r seconds, seeded) whether
or not earlier ones have finished; `max_inflight` bounds the open requests (an arrival waits
while the bound is reached).

Both stop starting requests after `num_requests` or once `duration_s` has passed since the
level started; requests in flight then run to completion (bounded by the client timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fishserve.bench.client import RequestRecord

# send(index, t0) -> the finished record of request `index` of the level, timed from t0
# (a `time.perf_counter()` value; None = now).
SendFn = Callable[[int, float | None], Awaitable[RequestRecord]]
DoneFn = Callable[[RequestRecord], None]


@dataclass(frozen=True)
class LevelPlan:
    """Bounds of one level.

    Attributes:
        level: concurrency (closed loop) or arrival rate in requests/s (Poisson).
        num_requests: requests to start at most.
        duration_s: no request starts after this many seconds from the level's start.
        ramp_s: closed loop: worker i sends its first request ``i * ramp_s / level`` seconds
            after the level starts, so arrivals spread out instead of one burst (steady state
            for capacity measurements); 0 starts every worker at once.
    """

    level: float
    num_requests: int
    duration_s: float
    ramp_s: float = 0.0


async def run_closed_loop(plan: LevelPlan, send: SendFn, on_done: DoneFn) -> list[RequestRecord]:
    """Keep `plan.level` requests in flight; return the records in start order."""
    deadline = time.perf_counter() + plan.duration_s
    next_index = 0
    records: list[RequestRecord] = []

    all_taken = asyncio.Event()  # set when the last request is handed out

    async def worker(position: int) -> None:
        nonlocal next_index
        delay = position * plan.ramp_s / plan.level
        if position >= plan.num_requests or delay >= plan.duration_s:
            return  # this worker would never start a request
        with contextlib.suppress(TimeoutError):  # wait out the ramp, unless nothing is left
            await asyncio.wait_for(all_taken.wait(), delay)
        while next_index < plan.num_requests and time.perf_counter() < deadline:
            index, next_index = next_index, next_index + 1
            if next_index == plan.num_requests:
                all_taken.set()
            record = await send(index, None)
            records.append(record)
            on_done(record)

    await asyncio.gather(*(worker(i) for i in range(int(plan.level))))
    return sorted(records, key=lambda r: r.index)


def poisson_arrivals(rate: float, count: int, seed: int) -> list[float]:
    """`count` arrival times (seconds from 0) of a Poisson process of `rate` per second."""
    rng = random.Random(seed)
    times, t = [], 0.0
    for _ in range(count):
        t += rng.expovariate(rate)
        times.append(t)
    return times


async def run_poisson(
    plan: LevelPlan, send: SendFn, on_done: DoneFn, seed: int, max_inflight: int
) -> list[RequestRecord]:
    """Start requests at Poisson arrival times; return the records in start order."""
    start = time.perf_counter()
    slots = asyncio.Semaphore(max_inflight)
    tasks: list[asyncio.Task[RequestRecord]] = []

    async def one(index: int, scheduled: float) -> RequestRecord:
        try:
            record = await send(index, scheduled)
        finally:
            slots.release()
        on_done(record)
        return record

    for index, at in enumerate(poisson_arrivals(plan.level, plan.num_requests, seed)):
        if at > plan.duration_s:
            break
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        await slots.acquire()
        tasks.append(asyncio.create_task(one(index, start + at)))
    return list(await asyncio.gather(*tasks))
