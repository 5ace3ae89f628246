"""Tests for fishserve.server.decode_worker: batching, earliest-deadline-first order, failures,
shutdown."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager
from types import SimpleNamespace

import numpy as np
import pytest

from fishserve.audio.batching import DecodeJob
from fishserve.server.decode_worker import DecodeWorker


class DoneCall:
    """A stand-in PendingDecode whose audio is ready when it is launched."""

    def __init__(self, audio: list[np.ndarray]) -> None:
        self.audio = audio

    def ready(self) -> bool:
        return True

    def wait_gpu(self) -> None:
        pass

    def result(self) -> list[np.ndarray]:
        return self.audio


class GatedRunner:
    """A stand-in DecoderRunner: records each call's job tags; the first call waits on a gate."""

    def __init__(self, max_batch: int, fail_tag: int | None = None) -> None:
        self.device = SimpleNamespace(type="cpu")
        self.launches_async = False  # decodes inside start_jobs, as the CPU's runner does
        self.max_batch = max_batch
        self.calls: list[list[int]] = []
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.fail_tag = fail_tag
        self.frames_decoded = 0

    def frame_bucket(self, frames: int) -> int:
        return -(-frames // 8) * 8

    def job_frames(self, job: DecodeJob) -> int:
        return job.total_frames

    def batch_bucket(self, jobs: int) -> int:
        return jobs

    def decode_jobs(self, jobs: list[DecodeJob]) -> list[np.ndarray]:
        tags = [int(job.codes[0, 0]) for job in jobs]
        self.calls.append(tags)
        if len(self.calls) == 1:
            self.entered.set()
            assert self.gate.wait(10)
        if self.fail_tag in tags:
            raise RuntimeError("decoder exploded")
        pairs = zip(jobs, tags, strict=True)
        return [np.full(job.new_frames, tag, dtype=np.float32) for job, tag in pairs]

    def start_jobs(self, jobs: list[DecodeJob]) -> DoneCall:
        return DoneCall(self.decode_jobs(jobs))


def job(tag: int, frames: int = 3) -> DecodeJob:
    return DecodeJob(np.full((2, frames), tag, dtype=np.int64), context_frames=1)


def busy_worker(max_batch: int, fail_tag: int | None = None) -> tuple[GatedRunner, DecodeWorker]:
    """A started worker inside its first call (job 0), so that later submissions queue up."""
    runner = GatedRunner(max_batch, fail_tag)
    worker = DecodeWorker(runner)  # type: ignore[arg-type]
    worker.start()
    worker.submit(job(0))
    assert runner.entered.wait(5)
    return runner, worker


def test_queued_jobs_run_earliest_deadline_first_in_batches() -> None:
    runner = GatedRunner(max_batch=2)
    worker = DecodeWorker(runner)  # type: ignore[arg-type]
    worker.start()
    first = worker.submit(job(0))
    assert runner.entered.wait(5)  # the worker is busy with job 0: the rest queue up
    deadlines = {1: 50.0, 2: 10.0, 3: 30.0, 4: 20.0}
    futures = {tag: worker.submit(job(tag), deadline=d) for tag, d in deadlines.items()}
    runner.gate.set()
    assert first.result(5).tolist() == [0.0, 0.0]
    assert {tag: f.result(5)[0] for tag, f in futures.items()} == {1: 1, 2: 2, 3: 3, 4: 4}
    worker.shutdown()
    assert runner.calls == [[0], [2, 4], [3, 1]]


@pytest.mark.parametrize(
    ("lengths", "calls"),
    [
        # short chunks go together: padding three of them to 80 frames for one more long job
        # decodes fewer frames per cost (35 / (64 + 3 * 16) > 113 / (64 + 4 * 80))
        ({1: 10, 2: 12, 3: 16, 4: 79}, [[1, 2, 3], [4]]),
        # a lone short chunk is cheaper padded into the long ones' call than in its own
        ({1: 10, 2: 79, 3: 70}, [[1, 2, 3]]),
    ],
)
def test_a_call_takes_the_frame_bucket_that_decodes_most_per_cost(
    lengths: dict[int, int], calls: list[list[int]]
) -> None:
    runner, worker = busy_worker(max_batch=4)
    futures = [worker.submit(job(t, n), deadline=10.0 * t) for t, n in lengths.items()]
    runner.gate.set()
    assert [len(f.result(5)) for f in futures] == [n - 1 for n in lengths.values()]
    worker.shutdown()
    assert runner.calls == [[0], *calls]


def test_a_failed_call_fails_its_jobs_only() -> None:
    runner = GatedRunner(max_batch=1, fail_tag=5)
    runner.gate.set()
    worker = DecodeWorker(runner)  # type: ignore[arg-type]
    worker.start()
    bad = worker.submit(job(5))
    with pytest.raises(RuntimeError, match="exploded"):
        bad.result(5)
    assert worker.submit(job(6)).result(5)[0] == 6
    worker.shutdown()


def test_a_bad_job_in_a_batch_fails_alone() -> None:
    runner, worker = busy_worker(max_batch=4, fail_tag=5)
    futures = {tag: worker.submit(job(tag)) for tag in (4, 5, 6)}  # one batch of three
    runner.gate.set()
    with pytest.raises(RuntimeError, match="exploded"):
        futures[5].result(5)
    assert futures[4].result(5)[0] == 4 and futures[6].result(5)[0] == 6
    worker.shutdown()
    assert runner.calls == [[0], [4, 5, 6], [4], [5], [6]]


def test_cancelled_jobs_are_skipped() -> None:
    runner, worker = busy_worker(max_batch=4)
    dropped = worker.submit(job(1))
    kept = worker.submit(job(2))
    assert dropped.cancel()
    runner.gate.set()
    assert kept.result(5)[0] == 2
    worker.shutdown()
    assert runner.calls == [[0], [2]]


def test_a_cancelled_job_neither_takes_a_slot_nor_sets_the_bucket() -> None:
    runner, worker = busy_worker(max_batch=2)
    gone = worker.submit(job(9, 79), deadline=1.0)  # would set an 80-frame bucket
    shorts = [worker.submit(job(t, 10), deadline=1.0 + t) for t in (1, 2)]
    long = worker.submit(job(3, 70), deadline=4.0)
    assert gone.cancel()
    runner.gate.set()
    assert [f.result(5)[0] for f in [*shorts, long]] == [1, 2, 3]
    worker.shutdown()
    assert runner.calls == [[0], [1, 2], [3]]


def test_submissions_after_shutdown_fail_at_once() -> None:
    runner = GatedRunner(max_batch=2)
    runner.gate.set()
    worker = DecodeWorker(runner)  # type: ignore[arg-type]
    worker.shutdown()  # before start: no hang, no error
    with pytest.raises(RuntimeError, match="stopped"):
        worker.submit(job(1)).result(1)


def test_a_runner_returning_too_few_chunks_is_retried_not_fatal() -> None:
    runner = GatedRunner(max_batch=4)
    decode = runner.decode_jobs
    runner.decode_jobs = lambda jobs: decode(jobs)[:-1] if len(jobs) > 1 else decode(jobs)
    worker = DecodeWorker(runner)  # type: ignore[arg-type]
    worker.start()
    worker.submit(job(0))
    assert runner.entered.wait(5)
    pair = [worker.submit(job(tag)) for tag in (1, 2)]  # one batch of two: one chunk short
    runner.gate.set()
    assert [f.result(5)[0] for f in pair] == [1, 2]  # retried one by one
    assert worker.submit(job(3)).result(5)[0] == 3  # the thread is still alive
    worker.shutdown()
    assert runner.calls == [[0], [1, 2], [1], [2], [3]]


def test_with_gpu_turns_a_call_waits_for_the_engine_step() -> None:
    from fishserve.engine.gpu_turns import GpuTurns

    runner = GatedRunner(max_batch=4)
    runner.gate.set()
    turns = GpuTurns()
    worker = DecodeWorker(runner, gpu_turns=turns)  # type: ignore[arg-type]
    worker.start()
    try:
        with turns.turn("engine"):  # a step is running: the decoder must not start
            futures = [worker.submit(job(tag)) for tag in (1, 2, 3)]
            assert not runner.entered.wait(0.2)
            assert runner.calls == []
        assert [f.result(5)[0] for f in futures] == [1, 2, 3]
        assert runner.calls == [[1, 2, 3]]  # jobs that queued during the wait share one call
    finally:
        worker.shutdown()


class PausingInbox:
    """Wraps the worker's inbox: a job's `put` waits for `go` (the moment between `submit`'s
    stop check and its queueing, where a concurrent `shutdown` used to slip in)."""

    def __init__(self, inbox: queue.SimpleQueue) -> None:
        self.inbox = inbox
        self.paused, self.go = threading.Event(), threading.Event()

    def put(self, item: object) -> None:
        if item is not None:
            self.paused.set()
            assert self.go.wait(10)
        self.inbox.put(item)

    def get(self) -> object:
        return self.inbox.get()

    def get_nowait(self) -> object:
        return self.inbox.get_nowait()

    def empty(self) -> bool:
        return self.inbox.empty()


def test_a_job_submitted_as_the_worker_shuts_down_is_decoded_or_failed_not_lost() -> None:
    runner = GatedRunner(max_batch=2)
    runner.gate.set()
    worker = DecodeWorker(runner)  # type: ignore[arg-type]
    worker.start()
    inbox = PausingInbox(worker._inbox)
    worker._inbox = inbox  # type: ignore[assignment]
    futures: list[Future[np.ndarray]] = []
    submitter = threading.Thread(target=lambda: futures.append(worker.submit(job(1))))
    submitter.start()
    assert inbox.paused.wait(5)  # submit has checked that the worker runs
    stopper = threading.Thread(target=worker.shutdown)
    stopper.start()
    stopper.join(0.3)  # unguarded, the loop stops here, before the job is queued
    inbox.go.set()
    submitter.join(5)
    stopper.join(15)
    try:
        samples = futures[0].result(5)  # a lost job never completes: TimeoutError
    except RuntimeError as exc:
        assert "stopped" in str(exc)
    else:
        assert samples[0] == 1


def test_jobs_of_a_worker_that_never_started_fail_at_shutdown() -> None:
    from fishserve.server.decode_worker import DecoderStoppedError

    worker = DecodeWorker(GatedRunner(max_batch=2))  # type: ignore[arg-type]
    queued = worker.submit(job(1))
    worker.shutdown()
    assert isinstance(queued.exception(5), DecoderStoppedError)
    worker.start()  # too late: nothing starts, later jobs fail at once
    assert isinstance(worker.submit(job(2)).exception(0), DecoderStoppedError)


class Fatal(BaseException):
    """Ends the decoder thread (what no `except Exception` catches)."""


class BrokenTurns:
    """A stand-in GpuTurns whose decoder turn ends the worker thread."""

    def turn(self, party: str) -> AbstractContextManager[object]:
        raise Fatal(party)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_jobs_left_when_the_thread_ends_fail_and_later_ones_fail_at_once() -> None:
    from fishserve.server.decode_worker import DecoderStoppedError

    runner = GatedRunner(max_batch=2)
    worker = DecodeWorker(runner, gpu_turns=BrokenTurns())  # type: ignore[arg-type]
    worker.start()
    left = worker.submit(job(1))  # taken from the inbox, then the thread dies before decoding
    assert isinstance(left.exception(5), DecoderStoppedError)
    assert isinstance(worker.submit(job(2)).exception(0), DecoderStoppedError)
    worker.shutdown()
    assert runner.calls == []


def windowed_worker(max_batch: int, batch_wait: float) -> tuple[GatedRunner, DecodeWorker]:
    """A started, idle worker with a batch window whose runner never blocks."""
    runner = GatedRunner(max_batch)
    runner.gate.set()
    worker = DecodeWorker(runner, batch_wait=batch_wait)  # type: ignore[arg-type]
    worker.start()
    return runner, worker


def primed(worker: DecodeWorker) -> None:
    """Decode three urgent jobs (tag 0) first: the next submission then makes four within
    the window, as under load (jobs after a quiet spell are never held)."""
    for _ in range(3):
        assert worker.submit(job(0)).result(5)[0] == 0


def test_with_a_batch_window_jobs_due_later_share_one_call() -> None:
    """Without the window the idle worker would decode the first job alone at once."""
    runner, worker = windowed_worker(max_batch=8, batch_wait=0.3)
    primed(worker)
    later = time.monotonic() + 60.0
    futures = [worker.submit(job(tag), deadline=later + tag) for tag in (1, 2, 3)]
    assert [f.result(5)[0] for f in futures] == [1, 2, 3]
    worker.shutdown()
    assert runner.calls == [[0], [0], [0], [1, 2, 3]]


def test_a_held_job_is_decoded_once_the_window_has_passed() -> None:
    _, worker = windowed_worker(max_batch=8, batch_wait=0.2)
    primed(worker)
    start = time.monotonic()
    held = worker.submit(job(1), deadline=start + 60.0)
    assert held.result(5)[0] == 1
    assert time.monotonic() - start >= 0.2  # it did wait for company
    worker.shutdown()


def test_urgent_jobs_and_full_calls_are_not_held() -> None:
    """A first chunk (no deadline: due now), a chunk due within URGENT_S, and a full call all
    go at once even with a 60 s window."""
    from fishserve.server.decode_worker import URGENT_S

    runner, worker = windowed_worker(max_batch=2, batch_wait=60.0)
    assert worker.submit(job(1)).result(5)[0] == 1
    soon = time.monotonic() + URGENT_S / 2
    assert worker.submit(job(2), deadline=soon).result(5)[0] == 2
    later = time.monotonic() + 60.0
    pair = [worker.submit(job(tag), deadline=later) for tag in (3, 4)]
    assert [f.result(5)[0] for f in pair] == [3, 4]
    worker.shutdown()
    assert runner.calls == [[1], [2], [3, 4]]


def test_held_jobs_are_decoded_at_shutdown_not_lost() -> None:
    runner, worker = windowed_worker(max_batch=8, batch_wait=60.0)
    primed(worker)
    held = worker.submit(job(1), deadline=time.monotonic() + 60.0)
    time.sleep(0.05)  # the worker has taken it and is holding it
    assert not held.done()
    worker.shutdown()
    assert held.result(5)[0] == 1
    assert runner.calls == [[0], [0], [0], [1]]


def test_a_job_after_a_quiet_spell_is_not_held() -> None:
    """A lone stream's chunk would wait the whole window for company that never comes."""
    _, worker = windowed_worker(max_batch=8, batch_wait=1.0)
    primed(worker)
    time.sleep(1.1)  # longer than the window: jobs arrive more slowly than one per window
    lone = worker.submit(job(1), deadline=time.monotonic() + 60.0)
    assert lone.result(0.8)[0] == 1  # well before the window would have passed
    worker.shutdown()


def test_cancelled_jobs_neither_fill_a_call_nor_make_it_urgent() -> None:
    runner = GatedRunner(max_batch=2)
    worker = DecodeWorker(runner, batch_wait=60.0)  # type: ignore[arg-type]
    worker.start()
    worker.submit(job(0))
    assert runner.entered.wait(5)  # busy: the next jobs queue up
    cancelled = [worker.submit(job(1)) for _ in range(2)]  # urgent, but their clients left
    held = worker.submit(job(2), deadline=time.monotonic() + 60.0)  # 4 jobs in the window
    assert all(future.cancel() for future in cancelled)
    runner.gate.set()
    time.sleep(0.2)
    assert not held.done()  # a cancelled job neither makes a full call nor an urgent one
    worker.shutdown()
    assert held.result(5)[0] == 2


@pytest.mark.parametrize("wait", [-0.1, float("nan"), float("inf"), 1e10])
def test_a_batch_window_out_of_range_is_refused(wait: float) -> None:
    with pytest.raises(ValueError, match="batch_wait"):
        DecodeWorker(GatedRunner(max_batch=2), batch_wait=wait)  # type: ignore[arg-type]


@pytest.mark.parametrize("deadline", [float("nan"), float("-inf"), float("inf")])
def test_a_deadline_that_is_not_a_finite_time_is_refused(deadline: float) -> None:
    worker = DecodeWorker(GatedRunner(max_batch=2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finite time"):
        worker.submit(job(1), deadline=deadline)


class HeldTurns:
    """A stand-in GpuTurns whose decoder turn waits until `release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.waiting = threading.Event()

    @contextlib.contextmanager
    def turn(self, party: str) -> Iterator[None]:
        self.waiting.set()
        assert self.release.wait(10)
        yield


def test_lag_counts_overdue_jobs_still_waiting_for_the_gpu_turn() -> None:
    """With gpu_sharing=turns a job may wait for the engine's step before its call."""
    turns = HeldTurns()
    runner = GatedRunner(max_batch=2)
    runner.gate.set()
    worker = DecodeWorker(runner, gpu_turns=turns)  # type: ignore[arg-type]
    worker.start()
    overdue = worker.submit(job(1), deadline=time.monotonic() - 2.0)
    assert turns.waiting.wait(5)
    assert worker.lag_seconds >= 2.0  # not yet in a call, but already late
    turns.release.set()
    assert overdue.result(5)[0] == 1
    worker.shutdown()


def test_cancelled_jobs_are_reported_finished_to_wait() -> None:
    from concurrent.futures import wait

    runner, worker = busy_worker(max_batch=2)
    cancelled = worker.submit(job(1))
    assert cancelled.cancel()
    runner.gate.set()
    done, _ = wait([cancelled], timeout=5)
    assert done == {cancelled}
    worker.shutdown()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_job_whose_bucket_cannot_be_computed_fails_and_the_thread_state_is_reported() -> None:
    from fishserve.server.decode_worker import DecoderStoppedError

    class NoBuckets(GatedRunner):
        def frame_bucket(self, frames: int) -> int:
            raise Stop

    worker = DecodeWorker(NoBuckets(max_batch=2))  # type: ignore[arg-type]
    assert not worker.alive
    future = worker.submit(job(1), deadline=time.monotonic() - 3.0)
    worker.start()
    assert isinstance(future.exception(5), DecoderStoppedError)  # not left pending forever
    worker._thread.join(5)
    assert not worker.alive and worker.lag_seconds == 0.0


class Stop(BaseException):
    """What no `except Exception` catches (e.g. KeyboardInterrupt, SystemExit)."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_jobs_of_a_call_that_ends_the_thread_fail_instead_of_waiting_forever() -> None:
    from fishserve.server.decode_worker import DecoderStoppedError

    class Exploding(GatedRunner):
        def decode_jobs(self, jobs: list[DecodeJob]) -> list[np.ndarray]:
            raise Stop

    worker = DecodeWorker(Exploding(max_batch=2))  # type: ignore[arg-type]
    futures = [worker.submit(job(tag)) for tag in (1, 2)]
    worker.start()
    for future in futures:
        assert isinstance(future.exception(5), DecoderStoppedError)
    worker._thread.join(5)  # its exception is reported within this test


@pytest.mark.parametrize(("device", "level"), [("cuda", "WARNING"), ("cpu", "DEBUG")])
def test_a_slow_decoder_call_is_logged(monkeypatch, caplog, device: str, level: str) -> None:
    """A warning on a GPU; on the CPU, where calls take seconds anyway, a debug line."""
    import fishserve.server.decode_worker as module

    monkeypatch.setattr(module, "SLOW_CALL_S", 0.0)
    runner, worker = windowed_worker(max_batch=2, batch_wait=0.0)
    runner.device = SimpleNamespace(type=device)
    with caplog.at_level("DEBUG", logger=module.__name__):
        assert worker.submit(job(1, frames=5)).result(5)[0] == 1
        worker.shutdown()
    (record,) = [r for r in caplog.records if "slow decoder call" in r.getMessage()]
    assert record.levelname == level and "1 chunks, 5 frames" in record.getMessage()


def test_lag_is_how_overdue_the_running_call_s_earliest_job_was_and_0_once_idle() -> None:
    runner = GatedRunner(max_batch=2)
    worker = DecodeWorker(runner)  # type: ignore[arg-type]
    assert worker.lag_seconds == 0.0
    worker.start()
    overdue = worker.submit(job(1), deadline=time.monotonic() - 5.0)  # its client ran dry 5 s ago
    assert runner.entered.wait(5)  # inside that call
    assert worker.lag_seconds >= 5.0
    runner.gate.set()
    assert overdue.result(5)[0] == 1
    for _ in range(100):  # the worker goes back to waiting for jobs
        if worker.lag_seconds == 0.0:
            break
        time.sleep(0.02)
    assert worker.lag_seconds == 0.0
    worker.shutdown()


def test_two_streams_chunks_close_together_are_not_held() -> None:
    """Fewer than BUSY_JOBS submissions in the window: nobody else is coming."""
    _, worker = windowed_worker(max_batch=8, batch_wait=1.0)
    later = time.monotonic() + 60.0
    first = worker.submit(job(1), deadline=later)
    time.sleep(0.05)
    second = worker.submit(job(2), deadline=later)
    assert first.result(0.8)[0] == 1 and second.result(0.8)[0] == 2  # not held for 1 s
    worker.shutdown()


class StepCall:
    """A stand-in PendingDecode whose GPU work ends when the test sets `done`."""

    def __init__(self, runner: StepRunner, tags: list[int], audio: list[np.ndarray]) -> None:
        self.runner, self.tags, self.audio = runner, tags, audio
        self.done = threading.Event()

    def ready(self) -> bool:
        self.runner.queries += 1
        return self.done.is_set()

    def wait_gpu(self) -> None:
        assert self.done.wait(10)

    def result(self) -> list[np.ndarray]:
        self.wait_gpu()
        self.runner.log.append(("result", self.tags))
        self.runner.in_flight -= 1
        if self.runner.fail_result in self.tags:
            raise RuntimeError("readback exploded")
        return self.audio


class StepRunner(GatedRunner):
    """A stand-in DecoderRunner whose calls run until the test ends them: logs each launch
    and each readback, and the most calls in flight at once."""

    def __init__(self, max_batch: int, auto_done: bool = False) -> None:
        super().__init__(max_batch)
        self.launches_async = True
        self.log: list[tuple[str, list[int]]] = []
        self.launched: queue.SimpleQueue[StepCall] = queue.SimpleQueue()
        self.fail_result: int | None = None
        self.auto_done = auto_done
        self.in_flight = self.most_in_flight = 0
        self.queries = 0  # StepCall.ready() calls (on CUDA each is an event query)

    def start_jobs(self, jobs: list[DecodeJob]) -> StepCall:  # type: ignore[override]
        tags = [int(job.codes[0, 0]) for job in jobs]
        self.log.append(("launch", tags))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        pairs = zip(jobs, tags, strict=True)
        audio = [np.full(job.new_frames, tag, dtype=np.float32) for job, tag in pairs]
        call = StepCall(self, tags, audio)
        if self.auto_done:
            call.done.set()
        self.launched.put(call)
        return call

    def decode_jobs(self, jobs: list[DecodeJob]) -> list[np.ndarray]:
        call = self.start_jobs(jobs)
        call.done.set()
        return call.result()

    def next_call(self) -> StepCall:
        return self.launched.get(timeout=5)

    def no_launch(self) -> bool:
        """True when nothing is launched within 0.2 s."""
        try:
            self.launched.get(timeout=0.2)
        except queue.Empty:
            return True
        return False


def test_the_next_call_launches_when_the_gpu_is_done_before_the_audio_is_handed_out() -> None:
    runner = StepRunner(max_batch=4)
    worker = DecodeWorker(runner)  # type: ignore[arg-type]
    worker.start()
    try:
        first = worker.submit(job(1))
        call_a = runner.next_call()
        rest = [worker.submit(job(tag)) for tag in (2, 3)]  # less than a full call
        assert runner.no_launch()  # they wait for the running call, to share the next one
        call_a.done.set()
        call_b = runner.next_call()
        assert call_b.tags == [2, 3]
        assert first.result(5)[0] == 1
        call_b.done.set()
        assert [f.result(5)[0] for f in rest] == [2, 3]
    finally:
        worker.shutdown()
    assert runner.log == [("launch", [1]), ("launch", [2, 3]), ("result", [1]), ("result", [2, 3])]


def test_pipelined_worker_learns_that_a_call_is_done_from_its_waiter_not_by_querying() -> None:
    runner = StepRunner(max_batch=2)
    worker = DecodeWorker(runner)  # type: ignore[arg-type]
    worker.start()
    try:
        futures = [worker.submit(job(1))]
        call_a = runner.next_call()
        futures += [worker.submit(job(tag)) for tag in (2, 3, 4, 5)]  # wake the worker often
        call_b = runner.next_call()  # a full call, behind the running one
        assert runner.no_launch()  # two in flight
        call_a.done.set()
        call_c = runner.next_call()  # launched once the waiter saw call A end
        assert call_c.tags == [4, 5]
        call_b.done.set()
        call_c.done.set()
        assert [f.result(5)[0] for f in futures] == [1, 2, 3, 4, 5]
    finally:
        worker.shutdown()
    assert runner.queries == 0


def test_a_full_call_queued_launches_behind_the_running_one_two_at_most() -> None:
    runner = StepRunner(max_batch=2)
    worker = DecodeWorker(runner)  # type: ignore[arg-type]
    worker.start()
    try:
        futures = [worker.submit(job(1))]
        call_a = runner.next_call()
        futures += [worker.submit(job(tag)) for tag in (2, 3, 4, 5, 6)]
        call_b = runner.next_call()
        assert call_b.tags == [2, 3]  # launched while call A still runs
        assert runner.no_launch()  # two in flight: no third
        call_a.done.set()
        call_c = runner.next_call()
        assert call_c.tags == [4, 5]
        runner.auto_done = True
        call_b.done.set()
        call_c.done.set()
        assert [f.result(5)[0] for f in futures] == [1, 2, 3, 4, 5, 6]
    finally:
        worker.shutdown()
    assert runner.most_in_flight == 2
    assert runner.log[:4] == [
        ("launch", [1]),
        ("launch", [2, 3]),
        ("result", [1]),
        ("launch", [4, 5]),
    ]


def test_without_pipelining_a_call_launches_after_the_last_ones_audio() -> None:
    runner = StepRunner(max_batch=2)
    worker = DecodeWorker(runner, pipeline=False)  # type: ignore[arg-type]
    assert worker.depth == 1
    worker.start()
    try:
        futures = [worker.submit(job(1))]
        call_a = runner.next_call()
        futures += [worker.submit(job(tag)) for tag in (2, 3, 4)]  # a full call queued
        assert runner.no_launch()
        runner.auto_done = True
        call_a.done.set()
        assert [f.result(5)[0] for f in futures] == [1, 2, 3, 4]
    finally:
        worker.shutdown()
    assert runner.most_in_flight == 1
    assert runner.log[:3] == [("launch", [1]), ("result", [1]), ("launch", [2, 3])]


def test_a_call_failing_at_readback_fails_only_the_bad_job() -> None:
    runner = StepRunner(max_batch=4, auto_done=True)
    runner.fail_result = 5
    worker = DecodeWorker(runner)  # type: ignore[arg-type]
    worker.start()
    try:
        worker.submit(job(0))
        call_a = runner.next_call()
        futures = {tag: worker.submit(job(tag)) for tag in (4, 5, 6)}  # one call of three
        call_a.done.set()
        with pytest.raises(RuntimeError, match="readback exploded"):
            futures[5].result(5)
        assert futures[4].result(5)[0] == 4 and futures[6].result(5)[0] == 6
        assert worker.submit(job(7)).result(5)[0] == 7  # the thread is still alive
    finally:
        worker.shutdown()
    assert ("launch", [4, 5, 6]) in runner.log and ("launch", [5]) in runner.log


def test_shutdown_hands_out_the_audio_of_calls_in_flight() -> None:
    runner = StepRunner(max_batch=2)
    worker = DecodeWorker(runner)  # type: ignore[arg-type]
    worker.start()
    future = worker.submit(job(1))
    call = runner.next_call()
    stopper = threading.Thread(target=worker.shutdown)
    stopper.start()
    stopper.join(0.2)
    assert stopper.is_alive()  # waits for the call in flight
    call.done.set()
    stopper.join(5)
    assert not stopper.is_alive() and future.result(0)[0] == 1


class SyncRunner(GatedRunner):
    """A stand-in for the CPU's runner: `start_jobs` decodes before it returns (slowly)."""

    def __init__(self) -> None:
        super().__init__(max_batch=4)
        self.gate.set()
        self.watch: Future[np.ndarray] | None = None
        self.watched_done_at_launch: list[bool] = []

    def start_jobs(self, jobs: list[DecodeJob]) -> DoneCall:
        if self.watch is not None and int(jobs[0].codes[0, 0]) != 1:  # a call after job 1's
            self.watched_done_at_launch.append(self.watch.done())
        time.sleep(0.2)
        return super().start_jobs(jobs)


@pytest.mark.parametrize("pipeline", [True, False])
def test_a_synchronous_runner_hands_out_a_call_before_the_next_one(pipeline: bool) -> None:
    """Launching first would hold a CPU call's audio back for the whole next call."""
    runner = SyncRunner()
    worker = DecodeWorker(runner, pipeline=pipeline)  # type: ignore[arg-type]
    assert worker.depth == 1
    worker.start()
    try:
        first = worker.submit(job(1))
        runner.watch = first
        time.sleep(0.05)  # inside call 1
        second = worker.submit(job(2))
        assert second.result(5)[0] == 2 and first.result(0)[0] == 1
    finally:
        worker.shutdown()
    assert runner.watched_done_at_launch == [True]


class BadSyncCall(StepCall):
    """A call whose GPU sync raises (a CUDA error seen by the event query or wait)."""

    def ready(self) -> bool:
        if 9 in self.tags:
            raise RuntimeError("CUDA error reported by cudaEventQuery")
        return super().ready()

    def wait_gpu(self) -> None:
        if 9 in self.tags:
            raise RuntimeError("CUDA error reported by cudaEventSynchronize")
        super().wait_gpu()


class BadSyncRunner(StepRunner):
    def start_jobs(self, jobs: list[DecodeJob]) -> StepCall:  # type: ignore[override]
        call = super().start_jobs(jobs)
        bad = BadSyncCall(self, call.tags, call.audio)
        bad.done.set()
        return bad


@pytest.mark.parametrize("pipeline", [True, False])
def test_an_error_at_the_gpu_sync_fails_its_call_not_the_thread(pipeline: bool) -> None:
    runner = BadSyncRunner(max_batch=2, auto_done=True)
    worker = DecodeWorker(runner, pipeline=pipeline)  # type: ignore[arg-type]
    worker.start()
    try:
        with pytest.raises(RuntimeError, match="CUDA error"):
            worker.submit(job(9)).result(5)
        assert worker.alive
        assert worker.submit(job(1)).result(5)[0] == 1
    finally:
        worker.shutdown()


# Python's own thread hook ignores SystemExit; pytest's reports it as a warning.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_pipelined_worker_goes_on_if_its_waiter_thread_dies() -> None:
    """Readiness comes from the waiter thread; if that thread ends (only a BaseException could
    end it), the worker waits for its calls itself instead of waiting for a wake-up forever."""

    class DyingWaiterCall(StepCall):
        def wait_gpu(self) -> None:
            if threading.current_thread().name == "fishserve-decoder-wait":
                raise SystemExit  # ends the waiter thread (quietly, outside pytest)
            super().wait_gpu()

    class Runner(StepRunner):
        def start_jobs(self, jobs):  # type: ignore[override]
            call = super().start_jobs(jobs)
            call.__class__ = DyingWaiterCall
            return call

    runner = Runner(max_batch=2)
    worker = DecodeWorker(runner)  # type: ignore[arg-type]
    worker.start()
    try:
        first = worker.submit(job(1))
        call_a = runner.next_call()
        call_a.done.set()
        assert first.result(5)[0] == 1
        second = worker.submit(job(2))
        runner.next_call().done.set()
        assert second.result(5)[0] == 2
        worker._waiter.join(timeout=5)
        assert not worker._waiter.is_alive()
    finally:
        worker.shutdown()


def test_has_work_while_a_chunk_is_queued_or_decoding() -> None:
    runner = GatedRunner(max_batch=2)
    worker = DecodeWorker(runner)  # type: ignore[arg-type]
    assert not worker.has_work
    worker.start()
    done = worker.submit(job(0))
    assert runner.entered.wait(5)
    assert worker.has_work  # inside its call
    runner.gate.set()
    done.result(5)
    for _ in range(500):  # the worker files the finished call right after the result
        if not worker.has_work:
            break
        time.sleep(0.01)
    assert not worker.has_work
    worker.shutdown()


@pytest.mark.parametrize("overhead", [-1.0, float("nan"), 1e6])
def test_a_call_overhead_out_of_range_is_refused(overhead: float) -> None:
    with pytest.raises(ValueError, match="call_overhead"):
        DecodeWorker(GatedRunner(max_batch=2), call_overhead=overhead)  # type: ignore[arg-type]


@pytest.mark.parametrize(("overhead", "calls"), [(0.0, [[1], [2, 3]]), (256.0, [[1, 2, 3]])])
def test_the_call_overhead_decides_whether_a_short_chunk_rides_with_long_ones(
    overhead: float, calls: list[list[int]]
) -> None:
    """A 3-frame chunk (bucket 8, 2 new frames) queued before two 30-frame ones (bucket 32, 5
    new frames each, the rest context): with no fixed cost per call it goes alone (padding it
    to 32 frames costs more than it brings); with a large one the three share a call."""
    runner = GatedRunner(max_batch=4)
    worker = DecodeWorker(runner, call_overhead=overhead)  # type: ignore[arg-type]
    worker.start()
    first = worker.submit(job(0))
    assert runner.entered.wait(5)  # busy: the next jobs queue up
    now = time.monotonic()
    futures: list[Future[np.ndarray]] = [worker.submit(job(1), deadline=now + 1)]
    for tag in (2, 3):
        long = DecodeJob(np.full((2, 30), tag, dtype=np.int64), context_frames=25)
        futures.append(worker.submit(long, deadline=now + 1 + tag))
    runner.gate.set()
    assert first.result(5)[0] == 0 and [f.result(5)[0] for f in futures] == [1, 2, 3]
    worker.shutdown()
    assert runner.calls[1:] == calls
