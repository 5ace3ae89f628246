"""The relay between the HTTP process's stream pipelines and the engine core (`server.relay`):
frames packed per step, chunks decoded in the core, errors and releases routed back."""

from __future__ import annotations

import asyncio
import pickle
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np
import pytest

from fishserve.audio.streaming import ChunkPolicy
from fishserve.engine.async_engine import EngineBusyError, EngineDeadError
from fishserve.engine.engine import EngineEvent, GenerationRequest
from fishserve.models.firefly import FireflyConfig
from fishserve.server.engine_core import portable_exception
from fishserve.server.relay import (
    CoreRelay,
    FrameBatch,
    RelayClient,
    RelaySpec,
    run_calls,
)


def test_a_frame_batch_survives_pickling_in_order():
    frames = np.arange(40, dtype=np.int64).reshape(5, 8)
    events = [
        EngineEvent("a", frames[0], 0),
        EngineEvent("b", frames[1], 2),
        EngineEvent("a", frames[2], 0, finished=True, finish_reason="length"),
        EngineEvent("c", None, 1, finished=True, finish_reason="error", error="prompt of 9"),
        EngineEvent("b", frames[3], 2),
        EngineEvent("d", None, 0, finished=True, finish_reason="cancelled"),
    ]
    back = pickle.loads(pickle.dumps(FrameBatch(events))).events()
    assert [(e.request_id, e.segment, e.finished, e.finish_reason, e.error) for e in back] == [
        (e.request_id, e.segment, e.finished, e.finish_reason, e.error) for e in events
    ]
    for got, sent in zip(back, events, strict=True):
        assert (got.codes is None) == (sent.codes is None)
        if sent.codes is not None:
            assert np.array_equal(got.codes, sent.codes) and got.codes.dtype == np.int64
    assert pickle.loads(pickle.dumps(FrameBatch([]))).events() == []


class FakeOutbox:
    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def put(self, message: tuple) -> None:
        self.sent.append(message)


class FakeDecodeWorker:
    """Resolves each job's future at once (samples = the job's new codes, flattened), or
    keeps them queued (`hold`)."""

    def __init__(self, hold: bool = False) -> None:
        self.jobs, self.hold = [], hold

    def submit(self, job, deadline=None, request_id=""):
        future: Future = Future()
        self.jobs.append((job, deadline, future))
        if not self.hold:
            future.set_result(job.codes[:, job.context_frames :].astype(np.float32).ravel())
        return future


class FakeEngine:
    def __init__(self, refuse: Exception | None = None) -> None:
        self.refuse, self.submitted, self.cancelled = refuse, [], []

    def submit(self, request, loop=None, sink=None):
        if self.refuse is not None:
            raise self.refuse
        self.submitted.append((request, sink))

    def cancel(self, request_id):
        self.cancelled.append(request_id)


def core(
    engine: FakeEngine | None = None, hold: bool = False
) -> tuple[CoreRelay, FakeOutbox, FakeDecodeWorker]:
    outbox, worker = FakeOutbox(), FakeDecodeWorker(hold)
    runtime = SimpleNamespace(engine=engine or FakeEngine(), decode_worker=worker)
    return CoreRelay(runtime, outbox, portable_exception), outbox, worker  # type: ignore[arg-type]


def test_the_core_decodes_chunks_and_says_what_failed():
    relay, outbox, worker = core()
    codes = np.arange(16, dtype=np.int64).reshape(2, 8)
    relay.handle(("decode", 7, "r", codes, 3, False, 12.5))
    assert outbox.sent[-1][:2] == ("audio", 7)
    assert np.array_equal(outbox.sent[-1][2], codes[:, 3:].astype(np.float32).ravel())
    assert worker.jobs[-1][1] == 12.5 and worker.jobs[-1][0].state is None
    relay.handle(("decode", 8, "r", codes, 8, False, None))  # no new frame: an invalid job
    kind, job_id, error = outbox.sent[-1]
    assert (kind, job_id) == ("decode_error", 8) and isinstance(error, ValueError)


def test_a_stateful_stream_keeps_its_state_in_the_core_until_released():
    engine = FakeEngine()
    relay, _, worker = core(engine)
    codes = np.zeros((2, 4), dtype=np.int64)
    relay.handle(("decode", 1, "r", codes, 0, True, None))
    relay.handle(("decode", 2, "r", codes, 0, True, None))
    relay.handle(("decode", 3, "other", codes, 0, True, None))
    states = [job.state for job, *_ in worker.jobs]
    assert states[0] is states[1] and states[2] is not states[0] and states[0] is not None
    relay.handle(("release", "r"))
    assert "r" not in relay.states and "other" in relay.states and engine.cancelled == ["r"]
    relay.handle(("decode", 4, "r", codes, 0, True, None))
    assert worker.jobs[-1][0].state is not states[0]  # a new request of that id starts afresh


def test_a_release_cancels_the_request_s_queued_chunks():
    engine = FakeEngine()
    relay, outbox, worker = core(engine, hold=True)
    codes = np.zeros((2, 4), dtype=np.int64)
    for job_id, rid in enumerate(["gone", "gone", "stays"]):
        relay.handle(("decode", job_id, rid, codes, 1, False, None))
    relay.handle(("release", "gone"))
    futures = [future for *_, future in worker.jobs]
    assert [f.cancelled() for f in futures] == [True, True, False]
    assert outbox.sent == [] and list(relay.queued) == ["stays"]  # no answer for cancelled
    futures[2].set_result(np.zeros(3, np.float32))
    assert outbox.sent[-1][:2] == ("audio", 2) and relay.queued == {}


def test_a_refused_request_goes_back_with_its_error_and_frames_go_out_per_step():
    relay, outbox, _ = core(FakeEngine(refuse=EngineBusyError("3 requests waiting")))
    relay.handle(("submit", GenerationRequest("x", request_id="r")))
    kind, rid, error = outbox.sent[-1]
    assert (kind, rid) == ("submit_error", "r") and isinstance(error, EngineBusyError)
    engine = FakeEngine()
    relay, outbox, _ = core(engine)
    relay.handle(("submit", GenerationRequest("x", request_id="s")))
    sink = engine.submitted[0][1]
    sink([EngineEvent("s", np.zeros(2, np.int64)), EngineEvent("s", finished=True)])
    assert len(outbox.sent) == 1 and outbox.sent[0][0] == "frames"
    assert len(outbox.sent[0][1].events) == 2


SPEC = RelaySpec(FireflyConfig(), ChunkPolicy(), False, None, 0.25)


def client() -> tuple[RelayClient, list[tuple]]:
    sent: list[tuple] = []
    return RelayClient(SPEC, 44100, 4096, sent.append, lambda: True), sent


def route(relay: RelayClient, *messages: tuple) -> None:
    calls: dict = {}
    with relay.lock:
        for message in messages:
            assert relay.deliver(message, calls)
    run_calls(calls)


def test_the_client_routes_frames_audio_and_errors_to_their_waiters():
    relay, sent = client()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        a = relay.engine.submit(GenerationRequest("a", request_id="a"), loop)
        b = relay.engine.submit(GenerationRequest("b", request_id="b"), loop)
        assert [m[0] for m in sent] == ["submit", "submit"]
        frame = np.ones(8, np.int64)
        batch = FrameBatch([EngineEvent("a", frame), EngineEvent("b", frame)])
        route(relay, ("frames", pickle.loads(pickle.dumps(batch))))
        assert len(await asyncio.wait_for(a.next_batch(1), 1)) == 1
        assert len(await asyncio.wait_for(b.next_batch(1), 1)) == 1
        route(relay, ("submit_error", "b", EngineBusyError("busy")))
        with pytest.raises(EngineBusyError):
            await asyncio.wait_for(b.next_batch(1), 1)
        job = SimpleNamespace(codes=np.zeros((8, 3), np.int64), context_frames=1, state=None)
        first = relay.decode_worker.submit(job, 3.0, "a")  # type: ignore[arg-type]
        second = relay.decode_worker.submit(job, None, "a")  # type: ignore[arg-type]
        assert sent[-1][0] == "decode" and sent[-1][2:4] == ("a", job.codes)
        route(
            relay,
            ("audio", sent[-2][1], np.ones(4, np.float32)),
            ("decode_error", sent[-1][1], RuntimeError("decoder failed")),
            ("audio", 999, np.ones(4, np.float32)),  # a job nobody waits for any more
        )
        assert np.array_equal(await first, np.ones(4, np.float32))
        with pytest.raises(RuntimeError, match="decoder failed"):
            await second
        abandoned = relay.decode_worker.submit(job, None, "a")  # type: ignore[arg-type]
        abandoned.cancel()  # its waiter gave up: the core sends nothing back for it
        await asyncio.sleep(0)
        assert relay.decodes == {}
        relay.engine.cancel("a")
        relay.engine.cancel("a")  # released once
        assert [m for m in sent if m[0] == "release"] == [("release", "a")]
        assert relay.active == 1  # b still (released when its pipeline ends)

    asyncio.run(main())
    assert not relay.deliver(("chunk", 1, None), {})  # not a relay message


def test_frames_are_made_only_for_the_streams_of_each_loop():
    relay, _ = client()
    other = asyncio.new_event_loop()
    elsewhere = relay.engine.submit(GenerationRequest("x", request_id="x"), other)

    async def main() -> None:
        here = relay.engine.submit(
            GenerationRequest("h", request_id="h"), asyncio.get_running_loop()
        )
        batch = FrameBatch(
            [EngineEvent("x", np.zeros(8, np.int64)), EngineEvent("h", np.ones(8, np.int64))]
        )
        calls: dict = {}
        with relay.lock:
            relay.deliver(("frames", pickle.loads(pickle.dumps(batch))), calls)
        assert set(calls) == {other, asyncio.get_running_loop()}
        run_calls(calls)
        got = await asyncio.wait_for(here.next_batch(1), 1)
        assert len(got) == 1 and got[0].codes[0] == 1  # only its own frame
        relay.release("h")
        assert set(relay.loops) == {other}

    asyncio.run(main())
    other.run_until_complete(asyncio.sleep(0))  # the other loop's call
    assert [int(e.codes[0]) for e in elsewhere.ready()] == [0]
    other.close()


def test_a_dead_core_fails_every_stream_and_decode():
    relay, _ = client()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stream = relay.engine.submit(GenerationRequest("a", request_id="a"), loop)
        job = SimpleNamespace(codes=np.zeros((8, 3), np.int64), context_frames=0, state=None)
        future = relay.decode_worker.submit(job, None, "a")  # type: ignore[arg-type]
        calls: dict = {}
        relay.fail_all(EngineDeadError("gone"), calls)
        run_calls(calls)
        with pytest.raises(EngineDeadError):
            await asyncio.wait_for(stream.next_batch(1), 1)
        with pytest.raises(EngineDeadError):
            await asyncio.wait_for(future, 1)
        assert relay.active == 0
        with pytest.raises(EngineDeadError):  # and whatever comes after
            relay.engine.submit(GenerationRequest("b", request_id="b"), loop)
        with pytest.raises(EngineDeadError):
            relay.decode_worker.submit(job, None, "a")  # type: ignore[arg-type]

    asyncio.run(main())


def test_the_client_refuses_what_the_core_cannot_take():
    relay, _ = client()
    dead = RelayClient(SPEC, 44100, 4096, lambda m: None, lambda: False)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        relay.engine.submit(GenerationRequest("a", request_id="a"), loop)
        with pytest.raises(ValueError, match="duplicate"):
            relay.engine.submit(GenerationRequest("a", request_id="a"), loop)
        with pytest.raises(EngineDeadError):
            dead.engine.submit(GenerationRequest("a", request_id="z"), loop)

    asyncio.run(main())
    with pytest.raises(ValueError, match="event loop"):
        relay.engine.submit(GenerationRequest("b", request_id="b"), None)
