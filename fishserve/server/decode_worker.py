"""The decoder thread: audio chunks of all streams, decoded in batched calls.

Requests hand their ready chunks (`DecodeJob`s) to one worker with a deadline: the moment the
stream's client would run out of audio (for a first chunk: now). The worker takes the queued
job with the earliest deadline and, up to `max_batch`, the next earliest that fit one frame
bucket, the bucket that decodes the most new frames per unit of cost (a call pads every job to
its longest and has a fixed cost: `fishserve.server.decode_plan`), and decodes them in one call
of the
`DecoderRunner` (fixed shapes, CUDA graphs, its own CUDA stream), so concurrent streams share
decoder calls, first chunks (time to first audio) and streams about to stall go first, and
decoder calls overlap the engine's steps on the GPU. Decoder memory is bounded by `max_batch`
chunks of bounded length (`ChunkPolicy.max_decode_frames`).

Batch window (`batch_wait`): a call costs a fixed part plus a part per job, and under load jobs
arrive a few milliseconds apart, so a worker that decodes whatever is queued makes calls of one
or two jobs (docs/benchmarks.md §6.7: busy 80% of the time at a third of the partition's
batched rate). With a window, queued jobs wait up to `batch_wait` seconds for others to share
their call, unless the earliest one's client would run out of audio within `URGENT_S` (first
chunks are due at once and never wait), a full call is queued, or fewer than `BUSY_JOBS` jobs
arrived within the last window (a lone stream, or a few, would only wait, for nobody). This is
the dynamic batcher's `max_queue_delay` of inference servers, bounded by each stream's playback
deadline.

Pipelining (`pipeline`, on by default; not with `gpu_turns`): the host's part of a call
(planning it, building and uploading its inputs, cutting its audio into chunks and handing them
to their requests) used to leave the decoder's GPU idle between calls; under load the decoder
thread spent ~30% of its time there (py-spy, docs/benchmarks.md §6.8) while streams waited.
Now the worker launches the next call as soon as the GPU has finished the last one, and cuts
up the finished call's audio while the next one runs. With a full call's worth of jobs
queued it launches the next call even before the running one ends (at most `MAX_IN_FLIGHT`
calls in flight), so a backlogged decoder never waits for the host; with fewer jobs queued it
waits for the running call to end, so late arrivals still join the next call. A runner that
decodes inside `start_jobs` (the CPU's) is not pipelined: there, launching the next call first
would hold the finished call's audio back for the whole next call. An error seen while waiting
for a call's GPU work fails that call's jobs (when its result is read), not the thread.

Shutdown: jobs queued before `shutdown` are still decoded; a job submitted after it fails at
once, and any job left over when the thread ends (or that never ran because the thread never
started) fails with `DecoderStoppedError`, so no request waits forever for its audio.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext

import numpy as np

from fishserve.audio.batching import DecodeJob
from fishserve.audio.decoder_runner import MAX_IN_FLIGHT, DecoderRunner, PendingDecode
from fishserve.engine.gpu_turns import GpuTurns
from fishserve.server.decode_plan import CALL_OVERHEAD_FRAMES, MAX_CALL_OVERHEAD, plan_call

log = logging.getLogger(__name__)
# (deadline, submission order, submitted at, job, its future); times in monotonic seconds.
_Item = tuple[float, int, float, DecodeJob, "Future[np.ndarray]"]

# A job whose client runs out of audio within this many seconds is never held for a fuller
# call: it covers one decoder call under load and the queue before it (§6.7: calls of 16 jobs
# take ~35 ms on 96 SMs beside the engine).
URGENT_S = 0.15
# A decoder call longer than this is logged as a warning (calls take ~2-40 ms on a GPU; on
# the CPU, where a call can take seconds anyway, at debug level only).
SLOW_CALL_S = 1.0
# The batch window holds jobs only when at least this many were submitted within one window
# (two streams' chunks 50 ms apart every 0.5 s would otherwise each wait the window).
BUSY_JOBS = 4
# The longest batch window accepted (seconds; the server setting allows up to 1).
MAX_BATCH_WAIT_S = 60.0
# A call is planned over the earliest this many times `max_batch` queued jobs.
PLAN_WINDOW = 4
# A launched call and the requests its audio goes to.
_Call = tuple[PendingDecode, list[tuple[DecodeJob, "Future[np.ndarray]"]], float]


class _Wake:
    """Inbox item of the GPU waiter thread: a launched call's GPU work has finished."""


_WAKE = _Wake()


class DecoderStoppedError(RuntimeError):
    """The decoder thread is stopped: the job was not (and will not be) decoded."""


class DecodeWorker:
    """A daemon thread that decodes submitted jobs in batches, earliest deadline first.

    Args:
        runner: the decoder runner (used only on the worker thread).
        gpu_turns: take turns on the GPU with the engine's steps (`GpuTurns`, party
            "decoder"): each call waits for the running step and runs before the next one.
            None: calls run whenever jobs are queued, beside the steps.
        batch_wait: seconds a queued job may wait for others to share its call (the batch
            window, see the module docstring); 0: decode whatever is queued at once.
        pipeline: launch the next call before the last one's audio is cut up, and with a full
            call queued before the last one ends (module docstring); ignored with
            `gpu_turns`, whose calls run one at a time between steps, and with a runner that
            decodes inside `start_jobs` (the CPU's: `launches_async` False).
        call_overhead: a call's fixed cost in padded job-frames, by which `plan_call` weighs
            one larger padded call against several smaller ones (`CALL_OVERHEAD_FRAMES`).

    Raises:
        ValueError: `batch_wait` outside [0, `MAX_BATCH_WAIT_S`] or `call_overhead` outside
            [0, `MAX_CALL_OVERHEAD`] (or either NaN).
    """

    def __init__(
        self,
        runner: DecoderRunner,
        gpu_turns: GpuTurns | None = None,
        batch_wait: float = 0.0,
        pipeline: bool = True,
        call_overhead: float = CALL_OVERHEAD_FRAMES,
    ) -> None:
        if not 0 <= batch_wait <= MAX_BATCH_WAIT_S:
            raise ValueError(
                f"batch_wait must be between 0 and {MAX_BATCH_WAIT_S:g} seconds, got {batch_wait}"
            )
        if not 0 <= call_overhead <= MAX_CALL_OVERHEAD:
            raise ValueError(
                f"call_overhead must be between 0 and {MAX_CALL_OVERHEAD:g} job-frames, "
                f"got {call_overhead}"
            )
        self.call_overhead = call_overhead
        self.runner = runner
        self.gpu_turns = gpu_turns
        self.batch_wait = batch_wait
        self._lag = 0.0
        self._recent: deque[float] = deque(maxlen=BUSY_JOBS)  # the last submission times
        self.max_batch = runner.max_batch
        # A synchronous runner (the CPU's) decodes inside start_jobs: launching the next call
        # first would hold the finished call's audio back for a whole call.
        overlaps = runner.launches_async
        self.depth = MAX_IN_FLIGHT if pipeline and gpu_turns is None and overlaps else 1
        self._inflight: deque[_Call] = deque()  # launched calls, oldest first
        self._launching = False  # a call's jobs are out of the heap and not yet in flight
        self._inbox: queue.SimpleQueue[_Item | _Wake | None] = queue.SimpleQueue()
        # Pipelined: a second thread waits for each launched call's GPU work and wakes the
        # worker through its inbox, so the worker waits for "a job arrived or a call ended".
        self._gpu_waits: queue.SimpleQueue[PendingDecode | None] = queue.SimpleQueue()
        # The calls whose GPU work the waiter has seen end: the worker reads readiness from
        # here instead of querying CUDA events (each PyTorch call costs a round trip of the
        # engine process's contended GIL, docs/benchmarks.md §6.15).
        self._gpu_done: set[PendingDecode] = set()
        self._waiter_gone = False
        self._waiter = threading.Thread(
            target=self._wait_gpu_loop, name="fishserve-decoder-wait", daemon=True
        )
        self._heap: list[_Item] = []
        self._order = itertools.count()
        self._thread = threading.Thread(target=self._loop, name="fishserve-decoder", daemon=True)
        self._stopped = False
        # Held across `submit`'s check-and-queue and `shutdown`'s stop-and-sentinel, so that
        # every accepted job is queued ahead of the stop sentinel.
        self._submit_lock = threading.Lock()

    @property
    def calls(self) -> int:
        """Decoder calls made."""
        return self.runner.calls

    @property
    def has_work(self) -> bool:
        """Whether a chunk is queued or being decoded (read from any thread: a snapshot)."""
        queued = self._heap or not self._inbox.empty()
        return bool(queued or self._launching or self._inflight)

    @property
    def lag_seconds(self) -> float:
        """How far behind real time the decoder is, in seconds: by how much the earliest
        queued job (also one waiting for the GPU turn), or the earliest job of the call in
        progress, was overdue when the worker last looked; 0 once the queue is empty or the
        thread has stopped. A first chunk is due at its submission, so its queueing counts."""
        return self._lag

    @property
    def frames_decoded(self) -> int:
        """New code frames decoded."""
        return self.runner.frames_decoded

    @property
    def alive(self) -> bool:
        """Whether the worker thread is running (False before `start` and once it ended)."""
        return self._thread.is_alive()

    def start(self) -> None:
        """Start the worker thread (nothing to start after `shutdown`)."""
        with self._submit_lock:  # `shutdown` then sees a started thread, or none at all
            if not self._stopped:
                self._thread.start()
                if self.depth > 1:
                    self._waiter.start()

    def shutdown(self) -> None:
        """Stop after the queued jobs (waits up to 10 s for them); later submissions fail at
        once. Never started: the queued jobs fail with `DecoderStoppedError`."""
        with self._submit_lock:
            self._stopped = True
            self._inbox.put(None)
        if self._thread.is_alive():
            self._thread.join(10)
        elif self._thread.ident is None:  # never started: nobody else will take the queue
            self._fail_leftovers()

    def submit(
        self, job: DecodeJob, deadline: float | None = None, request_id: str = ""
    ) -> Future[np.ndarray]:
        """Queue a job; the future gives its float32 samples (new_frames * frame_samples,).

        Args:
            deadline: ``time.monotonic()`` seconds by which the audio is needed (the stream's
                playback would run dry); ``None`` means now. Earlier deadlines decode first.
            request_id: the stream's request (not needed here: the job holds the stream's
                state; `relay.RelayedDecoder`, which takes the same arguments, needs it).

        Raises:
            ValueError: a deadline that is not a finite time (NaN would break the queue's
                order, -inf would make the decoder look infinitely late).
        """
        if deadline is not None and not math.isfinite(deadline):
            raise ValueError(f"a decoder job's deadline must be a finite time, got {deadline}")
        future: Future[np.ndarray] = Future()
        now = time.monotonic()
        when = now if deadline is None else deadline
        with self._submit_lock:
            if not self._stopped:
                self._recent.append(now)
                self._inbox.put((when, next(self._order), now, job, future))
                return future
        future.set_exception(DecoderStoppedError("the decoder thread is stopped"))
        return future

    def _loop(self) -> None:
        try:
            self._serve()
        finally:
            self._gpu_waits.put(None)
            self._fail_leftovers()

    def _wait_gpu_loop(self) -> None:
        """The waiter thread: for each launched call, wait for its GPU work, then wake the
        worker (errors are the worker's to see, when it reads the call's result)."""
        try:
            while (call := self._gpu_waits.get()) is not None:
                with contextlib.suppress(Exception):
                    call.wait_gpu()
                self._gpu_done.add(call)  # before the wake-up, which makes the worker look
                self._inbox.put(_WAKE)
        finally:  # ended by anything else: the worker asks the calls itself from now on
            self._waiter_gone = True  # before the wake-up, which makes the worker look
            self._inbox.put(_WAKE)

    def _fail_leftovers(self) -> None:
        """Fail every job still in the heap or the inbox (the thread has ended, or never
        started); later submissions fail in `submit`."""
        with self._submit_lock:
            self._stopped = True  # also when the loop ended by an error, not by `shutdown`
        leftovers, self._heap = self._heap, []
        while self._inflight:  # launched, but their audio will never be read
            _fail_unfinished(self._inflight.popleft()[1])
        self._gpu_done.clear()
        self._lag = 0.0  # a stopped decoder is not "late": `alive` says what it is
        while not self._inbox.empty():
            item = self._inbox.get_nowait()
            if item is not None and item is not _WAKE:
                leftovers.append(item)  # type: ignore[arg-type]
        for *_, future in leftovers:
            if future.set_running_or_notify_cancel():
                future.set_exception(
                    DecoderStoppedError("the decoder thread stopped before decoding this chunk")
                )
        if leftovers:
            log.warning("decoder thread stopped with %d chunks undecoded", len(leftovers))

    def _serve(self) -> None:
        """Decode queued jobs in batches until the stop sentinel, an empty heap and no call
        in flight."""
        stopping = False
        while True:
            stopping = self._drain() or stopping  # all that is queued counts for the hold
            hold = None
            if self._heap:
                self._lag = max(0.0, time.monotonic() - self._heap[0][0])  # also while waiting
                if self._may_launch():
                    hold = None if stopping or self._gpu_busy() else self._hold_until()
                    if hold is None:
                        stopping = self._launch_next() or stopping
                        continue
            if self._inflight:
                stopping = self._advance() or stopping
            elif not self._heap:
                if stopping:
                    return
                if self._inbox.empty():
                    self._lag = 0.0  # nothing queued: nothing is late
                stopping = self._take(self._inbox.get()) or stopping
            elif hold is not None:  # wait for more jobs to share the call, or for `hold`
                stopping = self._wait_until(hold) or stopping

    def _may_launch(self) -> bool:
        """Whether a call may be launched now: fewer than `depth` in flight, and the GPU done
        with them unless a full call is queued (it then runs right behind the running one)."""
        if len(self._inflight) >= self.depth:
            return False
        return not self._gpu_busy() or len(self._heap) >= self.max_batch

    def _gpu_busy(self) -> bool:
        """Whether a launched call's GPU work is still running (never blocks)."""
        return any(not self._gpu_finished(call) for call, _, _ in self._inflight)

    def _gpu_finished(self, call: PendingDecode) -> bool:
        """Whether `call`'s GPU work is done (never blocks): pipelined, as the waiter thread
        saw it (it wakes the worker right after); else, or if the waiter has died, by asking
        the call (`_ready`)."""
        if self._waited():
            return call in self._gpu_done
        return _ready(call)

    def _waited(self) -> bool:
        """Whether the waiter thread tells this worker when calls end (pipelined, and the
        waiter has not ended)."""
        return self.depth > 1 and not self._waiter_gone

    def _launch_next(self) -> bool:
        """Launch the next call from the queue (in the GPU turn); True on the stop sentinel."""
        with self._turn():
            stopping = self._drain()  # what arrived during the wait competes too
            self._launching = True  # between the heap and `_inflight` (`has_work`)
            try:
                self._launch(self._take_batch())
            finally:
                self._launching = False
            if self.gpu_turns is not None and self._inflight:  # the turn covers the GPU work
                with contextlib.suppress(Exception):  # `_finish` sees it again in `result`
                    self._inflight[-1][0].wait_gpu()
        return stopping

    def _advance(self) -> bool:
        """Hand the oldest call's audio out if its GPU work is done; else wait for that, or
        (pipelined) for a new job, whichever comes first. True on the stop sentinel."""
        call = self._inflight[0][0]
        if self._gpu_finished(call):
            self._finish(self._inflight.popleft())
            return False
        if not self._waited():  # nobody will wake this thread when the call ends
            with contextlib.suppress(Exception):  # `_finish` sees it again in `result`
                call.wait_gpu()
            return False
        # then the loop launches the next call before this one's audio is cut up
        return self._take(self._inbox.get())

    def _turn(self) -> AbstractContextManager[object]:
        return nullcontext() if self.gpu_turns is None else self.gpu_turns.turn("decoder")

    def _hold_until(self) -> float | None:
        """Monotonic seconds until which the queued jobs wait for a fuller call, or None to
        decode now: no window, fewer than `BUSY_JOBS` jobs in the last window, a full call
        queued, or the earliest job urgent or held long enough (`batch_wait` after the oldest
        queued job's submission). Cancelled jobs do not count."""
        recent = self._recent
        busy = len(recent) == BUSY_JOBS and recent[-1] - recent[0] < self.batch_wait
        if self.batch_wait <= 0 or not busy:
            return None
        if len(self._heap) >= 2 * self.max_batch:
            return None
        live = [item for item in self._heap if not item[4].cancelled()]
        if not live or len(live) >= self.max_batch:
            return None
        due = min(item[0] for item in live)
        until = min(due - URGENT_S, min(item[2] for item in live) + self.batch_wait)
        return until if until > time.monotonic() else None

    def _wait_until(self, until: float) -> bool:
        """Queue the next submission (or stop sentinel) arriving before `until`; True on stop."""
        try:
            item = self._inbox.get(timeout=max(0.0, until - time.monotonic()))
        except queue.Empty:
            return False
        return self._take(item)

    def _drain(self) -> bool:
        """Move everything queued into the heap (earliest deadline first); True on stop."""
        stopping = False
        while not self._inbox.empty():
            stopping = self._take(self._inbox.get_nowait()) or stopping
        return stopping

    def _take_batch(self) -> list[_Item]:
        """Pop the next call's jobs (`plan_call` over the earliest queued ones: the earliest
        job and the next earliest that fit the chosen frame bucket, up to `max_batch`); the
        others stay queued, cancelled ones are dropped (maybe none is left)."""
        queued: list[_Item] = []
        while self._heap and len(queued) < PLAN_WINDOW * self.max_batch:
            item = heapq.heappop(self._heap)
            if item[4].cancelled():
                item[4].set_running_or_notify_cancel()  # tells `wait`/`as_completed` it ended
                continue
            queued.append(item)
        if not queued:
            return []
        try:
            take = set(self._plan([item[3] for item in queued]))
        except BaseException:  # the jobs stay queued (and fail with the thread)
            for item in queued:
                heapq.heappush(self._heap, item)
            raise
        batch = [item for i, item in enumerate(queued) if i in take]
        for i, item in enumerate(queued):
            if i not in take:
                heapq.heappush(self._heap, item)
        if batch:
            self._lag = max(0.0, time.monotonic() - batch[0][0])
        return batch

    def _plan(self, jobs: list[DecodeJob]) -> list[int]:
        runner = self.runner
        return plan_call(
            [runner.job_frames(job) for job in jobs],
            [job.new_frames for job in jobs],
            self.max_batch,
            runner.frame_bucket,
            runner.batch_bucket,
            self.call_overhead,
        )

    def _take(self, item: _Item | _Wake | None) -> bool:
        """Add an inbox item to the heap (a wake-up adds nothing); True for the stop
        sentinel."""
        if item is None:
            return True
        if not isinstance(item, _Wake):
            heapq.heappush(self._heap, item)
        return False

    def _launch(self, batch: list[_Item]) -> None:
        """Launch one call for the batch's live jobs (a failed launch fails only its jobs)."""
        live = [(job, fut) for *_, job, fut in batch if fut.set_running_or_notify_cancel()]
        if not live:
            return
        started = time.perf_counter()
        try:
            call = self.runner.start_jobs([job for job, _ in live])
        except Exception as exc:  # a failed call fails its jobs, not the worker
            self._recover(live, exc)
            return
        except BaseException:  # the thread is ending: its jobs must not wait forever
            _fail_unfinished(live)
            raise
        self._inflight.append((call, live, started))
        if self.depth > 1:
            self._gpu_waits.put(call)

    def _finish(self, launched: _Call) -> None:
        """Hand a launched call's audio to its requests (waits for the call if needed)."""
        call, live, started = launched
        self._gpu_done.discard(call)
        try:
            audio = call.result()
            if len(audio) != len(live):
                raise RuntimeError(f"decoder returned {len(audio)} chunks for {len(live)} jobs")
        except Exception as exc:  # a failed call fails its jobs, not the worker
            self._recover(live, exc)
            return
        except BaseException:
            _fail_unfinished(live)
            raise
        if (seconds := time.perf_counter() - started) > SLOW_CALL_S:
            frames = sum(self.runner.job_frames(job) for job, _ in live)
            log.log(
                logging.WARNING if self.runner.device.type == "cuda" else logging.DEBUG,
                "slow decoder call: %.2f s from launch to audio for %d chunks, %d frames (new, "
                "or all with their context where the runner does not trim)",
                seconds,
                len(live),
                frames,
            )
        try:
            for (_, fut), samples in zip(live, audio, strict=True):
                fut.set_result(samples)
        except BaseException:  # a done-callback ended the thread: the others must not hang
            _fail_unfinished(live)
            raise

    def _recover(self, live: list[tuple[DecodeJob, Future[np.ndarray]]], exc: Exception) -> None:
        """A call failed: decode its jobs one by one (the culprit fails, the others decode)."""
        if len(live) > 1:
            log.warning("decoder call for %d jobs failed (%s); retrying one by one", len(live), exc)
            try:
                for pair in live:
                    self._decode_alone(*pair)
            except BaseException:
                _fail_unfinished(live)
                raise
            return
        log.error("decoder call failed", exc_info=exc)
        live[0][1].set_exception(exc)

    def _decode_alone(self, job: DecodeJob, fut: Future[np.ndarray]) -> None:
        try:
            (samples,) = self.runner.decode_jobs([job])
        except Exception as exc:
            log.exception("decoder call failed for one job")
            fut.set_exception(exc)
            return
        fut.set_result(samples)


def _ready(call: PendingDecode) -> bool:
    """`call.ready()`, True where it raises: the call's error then comes from `result()`,
    where `_finish` fails only that call's jobs, instead of ending the thread."""
    try:
        return call.ready()
    except Exception:
        return True


def _fail_unfinished(live: list[tuple[DecodeJob, Future[np.ndarray]]]) -> None:
    """Fail the futures of `live` not resolved yet: the decoder thread is ending."""
    for _, fut in live:
        if not fut.done():
            fut.set_exception(DecoderStoppedError("the decoder thread stopped in this call"))
