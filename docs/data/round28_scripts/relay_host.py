"""Host cost of the HTTP side of the relay (round 28): N streams' pipelines against a fake core.

Usage: python relay_host.py STREAMS [SECONDS] [profile]

The HTTP side is the real one (`RemoteRuntime` with its reader thread and sender, the relay
client, `pipeline.synthesize` per stream, closed loop: a finished stream is replaced at once);
the core is a fake in another process: one `FrameBatch` per step with a frame for every
running stream (STEPS_PER_S steps per second, so streams run at STEPS_PER_S / 21.53 times real
time), streams of FRAMES frames, and every decode job answered at once with zeros of the
job's length. Prints the HTTP process's CPU per thread (cores), frames and chunks per second,
and time to first chunk; with `profile`, cProfile's top functions of the event loop's thread.
"""

from __future__ import annotations

import asyncio
import cProfile
import multiprocessing as mp
import os
import pstats
import sys
import threading
import time

import numpy as np
import psutil

from fishserve.audio.streaming import ChunkPolicy
from fishserve.engine.engine import EngineEvent, EngineStats, GenerationRequest
from fishserve.models.firefly import FireflyConfig
from fishserve.server.core_client import RemoteRuntime
from fishserve.server.channel import recv_message
from fishserve.server.engine_core import Sender
from fishserve.server.relay import FrameBatch, RelaySpec
from fishserve.server.runtime import RuntimeInfo, RuntimeStatus

STEPS_PER_S = 30.0
FRAMES = 216
NC = 8


def fake_core(inbox, outbox) -> None:
    """Frames for every submitted stream each step; decode jobs answered with zeros."""
    sender = Sender(outbox, "fake-core-tx")
    frame_samples = FireflyConfig().frame_samples
    running: dict[str, int] = {}
    lock = threading.Lock()

    def read() -> None:
        while True:
            try:
                message = recv_message(inbox)
            except EOFError:
                os._exit(0)
            kind = message[0]
            if kind == "submit":
                with lock:
                    running[message[1].request_id] = 0
            elif kind == "decode":
                _, job_id, _, codes, context, _, _ = message
                samples = (codes.shape[1] - context) * frame_samples
                sender.put(("audio", job_id, np.zeros(samples, np.float32)))
            elif kind == "release":
                with lock:
                    running.pop(message[1], None)

    threading.Thread(target=read, daemon=True).start()
    frame = np.arange(NC, dtype=np.int64)
    status = RuntimeStatus(EngineStats(0, 0, 100, 100, 0, 0), True, None, False, 0.0, 0, 0)
    next_status = 0.0
    while True:
        t0 = time.monotonic()
        events = []
        with lock:
            for rid in list(running):
                n = running[rid] = running[rid] + 1
                if n <= FRAMES:
                    events.append(EngineEvent(rid, frame.copy()))
                if n == FRAMES:
                    events.append(EngineEvent(rid, finished=True, finish_reason="length"))
        if events:
            sender.put(("frames", FrameBatch(events)))
        if t0 >= next_status:
            sender.put(("status", status))
            next_status = t0 + 0.25
        time.sleep(max(0.0, 1 / STEPS_PER_S - (time.monotonic() - t0)))


class FakeProcess:
    def __init__(self, process) -> None:
        self.process, self.pid, self.exitcode = process, process.pid, None

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def join(self, timeout=None) -> None:
        self.process.join(timeout)

    def kill(self) -> None:
        self.process.kill()


def thread_cores(proc: psutil.Process) -> dict[int, float]:
    return {t.id: t.user_time + t.system_time for t in proc.threads()}


async def main(streams: int, seconds: float, profile: bool) -> None:
    ctx = mp.get_context("spawn")
    inbox_r, inbox_w = ctx.Pipe(duplex=False)
    outbox_r, outbox_w = ctx.Pipe(duplex=False)
    core = ctx.Process(target=fake_core, args=(inbox_r, outbox_w), daemon=True)
    core.start()
    spec = RelaySpec(FireflyConfig(), ChunkPolicy(), False, 0.15, 0.12)
    info = RuntimeInfo(44100, 4096, "cpu", "bfloat16", "bf16", 16, relay=spec)
    runtime = RemoteRuntime(FakeProcess(core), inbox_w, outbox_r, info)  # type: ignore[arg-type]
    frames = chunks = 0
    first: list[float] = []

    async def client() -> None:
        nonlocal frames, chunks
        while True:
            arrival = time.monotonic()
            request = GenerationRequest("x", max_new_tokens=FRAMES, ignore_eos=True)
            got_first = False
            async for chunk in runtime.synthesize(request, 120.0, arrival):
                chunks += 1
                frames += len(chunk.samples) // 2048
                if not got_first and len(chunk.samples):
                    first.append(time.monotonic() - arrival)
                    got_first = True

    tasks = []
    for _ in range(streams):  # a ramp of 64 streams per 0.1 s
        tasks.append(asyncio.create_task(client()))
        if len(tasks) % 64 == 0:
            await asyncio.sleep(0.1)
    await asyncio.sleep(3.0)
    proc = psutil.Process()
    before, f0, c0, t0 = thread_cores(proc), frames, chunks, time.monotonic()
    first.clear()
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    await asyncio.sleep(seconds)
    if prof:
        prof.disable()
    after, dt = thread_cores(proc), time.monotonic() - t0
    names = {t.native_id: t.name for t in threading.enumerate()}
    print(f"{streams} streams, {STEPS_PER_S:g} steps/s, {dt:.1f} s measured:")
    print(f"  frames/s {(frames - f0) / dt:,.0f}, chunks/s {(chunks - c0) / dt:,.0f}")
    for tid, cpu in sorted(after.items(), key=lambda kv: -(kv[1] - before.get(kv[0], 0.0))):
        used = (cpu - before.get(tid, 0.0)) / dt
        if used > 0.005:
            print(f"  {used:5.2f} cores  {names.get(tid, tid)}")
    ttfa = np.percentile(first, [50, 99]) if first else [float("nan")] * 2
    print(f"  first chunk p50/p99 {ttfa[0]:.3f}/{ttfa[1]:.3f} s over {len(first)} streams")
    for task in tasks:
        task.cancel()
    runtime.shutdown()
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "profile" else 10.0
    asyncio.run(main(int(sys.argv[1]), seconds, "profile" in sys.argv))
