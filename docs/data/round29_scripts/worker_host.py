"""The decoder worker's host cost per call against a fake GPU (CPU only, no model).

    python docs/data/round29_scripts/worker_host.py [GPU_MS] [JOBS_PER_S] [NEW_FRAMES] [HOGS]

A `DecodeWorker` (pipelined, 16 jobs per call at most) decodes jobs of NEW_FRAMES new frames
(default 13, a collapsed server's, §6.29) submitted from an asyncio loop at JOBS_PER_S
(default 1,300); each call "runs on the GPU" for GPU_MS x (0.6 + 0.4 x jobs / 16) ms (default
6), back to back; HOGS threads (default 0) hold the GIL 70% of the time, as the engine thread
does (switch interval 0.5 ms, the server's). Prints calls/s, jobs/s, the worker thread's CPU
per call, the jobs' wait and how often per call the worker woke up. OLD=path/to/
decode_worker.py runs another version of the worker (e.g. `git show REV:fishserve/server/
decode_worker.py > /tmp/old_dw.py`) for an A/B. Results of round 29: docs/benchmarks.md §6.29
(the wake-up counter also reads a `_wake` event, which a version tried there had).
"""
import asyncio
import math
import os
import sys
import threading
import time

import numpy as np

from fishserve.audio.batching import DecodeJob
from fishserve.audio.decoder_runner import decoder_batch_buckets

if os.environ.get("OLD"):
    import importlib.util

    spec = importlib.util.spec_from_file_location("old_dw", os.environ["OLD"])
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    DecodeWorker = old.DecodeWorker
else:
    from fishserve.server.decode_worker import DecodeWorker

GPU_MS = float(sys.argv[1]) if len(sys.argv) > 1 else 6.0
JOBS_PER_S = float(sys.argv[2]) if len(sys.argv) > 2 else 1300
NEW = int(sys.argv[3]) if len(sys.argv) > 3 else 13
HOGS = int(sys.argv[4]) if len(sys.argv) > 4 else 0
SECONDS = 6.0
sys.setswitchinterval(0.0005)


def hog() -> None:
    while True:
        end = time.perf_counter() + 0.0035
        while time.perf_counter() < end:
            pass
        time.sleep(0.0015)


class Pending:
    """A launched fake call: done at `until` (perf_counter seconds)."""

    def __init__(self, jobs, until):
        self.jobs, self.done = jobs, threading.Event()
        timer = threading.Timer(max(0.0, until - time.perf_counter()), self.done.set)
        timer.daemon = True
        timer.start()

    def ready(self):
        return self.done.is_set()

    def wait_gpu(self):
        self.done.wait()

    def result(self):
        self.done.wait()
        flat = np.zeros(sum(j.new_frames for j in self.jobs) * 2048, np.float32)
        out, at = [], 0
        for job in self.jobs:
            n = job.new_frames * 2048
            out.append(flat[at : at + n].copy())
            at += n
        return out


class Runner:
    launches_async, max_batch = True, 16
    device = type("Device", (), {"type": "cuda"})()

    def __init__(self):
        self.calls = self.frames_decoded = 0
        self.busy_until = 0.0
        self.batch_buckets = decoder_batch_buckets(16)

    def job_frames(self, job):
        return job.new_frames

    def frame_bucket(self, n):
        return 8 * math.ceil(n / 8)

    def batch_bucket(self, n):
        return next(b for b in self.batch_buckets if b >= n)

    def start_jobs(self, jobs):
        self.calls += 1
        self.frames_decoded += sum(j.new_frames for j in jobs)
        start = max(time.perf_counter(), self.busy_until)
        self.busy_until = start + GPU_MS / 1000 * (0.6 + 0.4 * len(jobs) / 16)
        return Pending(list(jobs), self.busy_until)


def thread_cpu_s(tid):
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Counted:
    """Counts the worker's blocking waits on its inbox (and, if it has one, its wake event)."""

    def __init__(self, target, method):
        self.target, self.method, self.count = target, method, 0

    def __getattr__(self, name):
        return getattr(self.target, name)

    def wait_or_get(self, *args, **kwargs):
        self.count += 1
        return getattr(self.target, self.method)(*args, **kwargs)


async def main():
    for _ in range(HOGS):
        threading.Thread(target=hog, daemon=True).start()
    runner = Runner()
    worker = DecodeWorker(runner)
    waits = [Counted(worker._inbox, "get")]
    worker._inbox = waits[0]
    worker._inbox.get = waits[0].wait_or_get
    if hasattr(worker, "_wake"):
        waits.append(Counted(worker._wake, "wait"))
        worker._wake = waits[1]
        worker._wake.wait = waits[1].wait_or_get
    worker.start()
    job = DecodeJob(np.zeros((8, 15 + NEW), np.int64), 15)
    done, latencies, tasks = 0, [], set()

    async def one():
        nonlocal done
        t = time.monotonic()
        await asyncio.wrap_future(worker.submit(job, None))
        latencies.append(time.monotonic() - t)
        done += 1

    await asyncio.sleep(0.2)
    tid = worker._thread.native_id
    cpu0, calls0, wakes0 = thread_cpu_s(tid), runner.calls, sum(w.count for w in waits)
    t0, sent = time.perf_counter(), 0
    while time.perf_counter() - t0 < SECONDS:
        while sent < int((time.perf_counter() - t0) * JOBS_PER_S):
            task = asyncio.ensure_future(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        await asyncio.sleep(0.001)
    elapsed = time.perf_counter() - t0
    cpu, calls = thread_cpu_s(tid) - cpu0, max(runner.calls - calls0, 1)
    wakes = sum(w.count for w in waits) - wakes0
    p50, p99 = (1e3 * np.percentile(latencies, q) for q in (50, 99))
    print(
        f"hogs {HOGS}, fake GPU {GPU_MS} ms, {JOBS_PER_S:.0f} jobs/s of {NEW} frames: "
        f"{calls / elapsed:.0f} calls/s, {done / elapsed:.0f} jobs/s, {done / calls:.1f} jobs/call, "
        f"worker CPU {1e3 * cpu / calls:.2f} ms/call, wait p50 {p50:.1f} p99 {p99:.1f} ms, "
        f"backlog {sent - done}, wake-ups/call {wakes / calls:.1f}"
    )
    worker.shutdown()


asyncio.run(main())
