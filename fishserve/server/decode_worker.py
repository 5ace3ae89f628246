"""The decoder thread: audio chunks of all streams, decoded in batched calls.

Requests hand their ready chunks (`DecodeJob`s) to one worker; the worker takes every job that
is queued (up to `max_batch`) and decodes them in one `decode_batch` call, so concurrent
streams share decoder calls instead of queueing behind each other. Decoder memory is bounded
by `max_batch` chunks of bounded length (`ChunkPolicy.max_decode_frames`).
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future

import numpy as np

from fishserve.audio.batching import DecodeJob, decode_batch
from fishserve.models.firefly import FireflyGenerator

log = logging.getLogger(__name__)


class DecodeWorker:
    """A daemon thread that decodes submitted jobs in batches.

    Args:
        decoder: the Firefly generator (used only on the worker thread).
        max_batch: most jobs per decoder call.
    """

    def __init__(self, decoder: FireflyGenerator, max_batch: int = 32) -> None:
        self.decoder = decoder
        self.max_batch = max_batch
        self._jobs: queue.SimpleQueue[tuple[DecodeJob, Future[np.ndarray]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._loop, name="fishserve-decoder", daemon=True)
        self.calls = 0
        self.frames_decoded = 0

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def shutdown(self) -> None:
        """Stop after the queued jobs."""
        self._jobs.put(None)
        self._thread.join(10)

    def submit(self, job: DecodeJob) -> Future[np.ndarray]:
        """Queue a job; the future gives its float32 samples (new_frames * frame_samples,)."""
        future: Future[np.ndarray] = Future()
        self._jobs.put((job, future))
        return future

    def _loop(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < self.max_batch:
                try:
                    nxt = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._jobs.put(None)
                    break
                batch.append(nxt)
            self._run(batch)

    def _run(self, batch: list[tuple[DecodeJob, Future[np.ndarray]]]) -> None:
        live = [(job, fut) for job, fut in batch if fut.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            audio = decode_batch(self.decoder, [job for job, _ in live])
        except Exception as exc:  # a failed call fails its jobs, not the worker
            log.exception("decoder call failed for %d jobs", len(live))
            for _, fut in live:
                fut.set_exception(exc)
            return
        self.calls += 1
        self.frames_decoded += sum(job.new_frames for job, _ in live)
        for (_, fut), samples in zip(live, audio, strict=True):
            fut.set_result(samples)
