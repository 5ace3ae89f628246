"""Randomised load on the decoder thread over a stand-in runner with the real runner's rules
(two calls in flight at most, launch and readback failures, a fake GPU finishing calls after
random delays): every submitted chunk ends (decoded, failed or cancelled), none waits forever,
the runner is never asked for a third call in flight, and its buffers all come back."""

from __future__ import annotations

import queue
import random
import threading
import time
from concurrent.futures import CancelledError, Future
from types import SimpleNamespace

import numpy as np
import pytest

from fishserve.audio.batching import DecodeJob
from fishserve.server.decode_worker import DecoderStoppedError, DecodeWorker

SLOTS = 2  # the real runner's MAX_IN_FLIGHT


class FakeCall:
    """A launched call; `done` is set by the fake GPU (or at launch on the 'CPU')."""

    def __init__(self, runner: FakeRunner, audio: list[np.ndarray]) -> None:
        self.runner, self.audio = runner, audio
        self.done = threading.Event()
        self.taken = False

    def ready(self) -> bool:
        return self.done.is_set()

    def wait_gpu(self) -> None:
        self.done.wait()

    def result(self) -> list[np.ndarray]:
        assert not self.taken
        self.taken = True
        try:
            self.done.wait()
            if self.runner.rng.random() < self.runner.p_fail:
                raise RuntimeError("readback failed")
            return self.audio
        finally:
            with self.runner.lock:
                self.runner.free += 1


class FakeRunner:
    def __init__(self, seed: int, cpu: bool, p_fail: float, max_batch: int = 4) -> None:
        self.device = SimpleNamespace(type="cpu")
        self.launches_async = not cpu
        self.max_batch, self.cpu, self.p_fail = max_batch, cpu, p_fail
        self.rng = random.Random(seed)
        self.free, self.lock = SLOTS, threading.Lock()
        self.too_many = 0  # launches refused for want of a free slot
        self.frames_decoded = 0
        self.gpu: queue.SimpleQueue[FakeCall] = queue.SimpleQueue()
        if not cpu:
            threading.Thread(target=self._run_gpu, daemon=True).start()

    def _run_gpu(self) -> None:
        while True:
            call = self.gpu.get()
            time.sleep(self.rng.uniform(0.0, 0.005))
            call.done.set()

    def frame_bucket(self, frames: int) -> int:
        return -(-frames // 8) * 8

    def job_frames(self, job: DecodeJob) -> int:
        return job.total_frames

    def batch_bucket(self, jobs: int) -> int:
        return jobs

    def start_jobs(self, jobs: list[DecodeJob]) -> FakeCall:
        assert 1 <= len(jobs) <= self.max_batch
        with self.lock:
            if self.free == 0:
                self.too_many += 1
                raise RuntimeError(f"{SLOTS} decoder calls are in flight")
            self.free -= 1
        if self.rng.random() < self.p_fail:
            with self.lock:
                self.free += 1
            raise RuntimeError("launch failed")
        call = FakeCall(self, [np.full(j.new_frames, j.codes[0, 0], np.float32) for j in jobs])
        if self.cpu:
            time.sleep(self.rng.uniform(0.0, 0.003))
            call.done.set()
        else:
            self.gpu.put(call)
        return call

    def decode_jobs(self, jobs: list[DecodeJob]) -> list[np.ndarray]:
        return self.start_jobs(jobs).result()


def job(tag: int, frames: int) -> DecodeJob:
    return DecodeJob(np.full((2, frames), tag, dtype=np.int64), context_frames=1)


def submit_from_threads(
    worker: DecodeWorker, seed: int, stop: threading.Event, per_thread: int
) -> list[tuple[int, Future[np.ndarray]]]:
    """Six threads submit chunks (random lengths and deadlines, 10% cancelled) until `stop`
    or `per_thread` each."""
    futures: list[tuple[int, Future[np.ndarray]]] = []
    lock, tags = threading.Lock(), iter(range(10**9))

    def submitter(k: int) -> None:
        rng = random.Random(seed * 31 + k)
        for _ in range(per_thread):
            if stop.is_set():
                return
            tag = next(tags)
            due = None if rng.random() < 0.3 else time.monotonic() + rng.uniform(0, 0.05)
            future = worker.submit(job(tag, rng.randint(2, 30)), due)
            if rng.random() < 0.1:
                future.cancel()
            with lock:
                futures.append((tag, future))
            time.sleep(rng.uniform(0, 0.002))

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(6)]
    for thread in threads:
        thread.start()
    if per_thread > 1000:  # run until stopped: shut down mid-flight
        time.sleep(0.05 + 0.02 * (seed % 4))
        worker.shutdown()
        stop.set()
    for thread in threads:
        thread.join()
    return futures


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("cpu", [False, True])
@pytest.mark.parametrize("pipeline", [True, False])
def test_every_chunk_under_random_load_ends_with_its_own_audio(seed, cpu, pipeline):
    runner = FakeRunner(seed, cpu, p_fail=0.05)
    worker = DecodeWorker(runner, pipeline=pipeline, batch_wait=0.01 * seed)  # type: ignore[arg-type]
    worker.start()
    futures = submit_from_threads(worker, seed, threading.Event(), per_thread=40)
    stuck = []
    for tag, future in futures:
        try:
            assert future.result(10)[0] == tag
        except (CancelledError, RuntimeError):
            pass  # cancelled, or its call failed (the culprit of a retried call)
        except TimeoutError:
            stuck.append(tag)
    worker.shutdown()
    assert not stuck and not worker.alive
    assert runner.too_many == 0 and runner.free == SLOTS


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("cpu", [False, True])
@pytest.mark.parametrize("pipeline", [True, False])
def test_shutdown_under_load_with_failures_leaves_nothing_waiting(seed, cpu, pipeline):
    runner = FakeRunner(seed, cpu, p_fail=0.2, max_batch=3)
    worker = DecodeWorker(runner, pipeline=pipeline)  # type: ignore[arg-type]
    worker.start()
    futures = submit_from_threads(worker, seed, threading.Event(), per_thread=10**6)
    waiting = 0
    for _, future in futures:
        try:
            future.result(5)
        except (DecoderStoppedError, RuntimeError, CancelledError):
            pass
        except TimeoutError:
            waiting += 1
    assert waiting == 0 and not worker.alive
    assert runner.too_many == 0 and runner.free == SLOTS
