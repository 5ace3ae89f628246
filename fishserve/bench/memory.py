"""GPU memory and queue sampling while a benchmark runs.

Each sample reads the server's `GET /v1/health` (fishserve: running/waiting requests and
`gpu_memory.used_bytes`, the device's used bytes from `cudaMemGetInfo`). When the server does
not report GPU memory (a peer server, or fishserve on CPU) and a GPU index is given, the used
bytes of that GPU come from NVML (`pynvml`, package `nvidia-ml-py`) or, without it, from
`nvidia-smi`. Both count the whole device, like the health endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import httpx

MiB = 2**20
MemorySource = Literal["auto", "health", "nvml", "nvidia-smi", "none"]


@dataclass
class MemorySample:
    """One poll.

    Attributes:
        t_s: seconds since the benchmark started.
        level: the level running at that time (None between levels).
        used_bytes: GPU bytes in use (whole device), or None if unknown.
        budget_bytes: the server's memory budget (fishserve), or None.
        running, waiting: the server's request counts (fishserve), or None.
    """

    t_s: float
    level: float | None
    used_bytes: int | None = None
    budget_bytes: int | None = None
    running: int | None = None
    waiting: int | None = None


GpuReader = Callable[[], Awaitable[int | None]]


def nvml_reader(gpu_index: int) -> GpuReader | None:
    """A reader of the GPU's used bytes through NVML, or None if NVML is unavailable."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(gpu_index)
    except Exception:  # ImportError, or NVMLError without a driver
        return None

    async def read() -> int | None:
        info = await asyncio.to_thread(pynvml.nvmlDeviceGetMemoryInfo, handle)
        return int(info.used)

    return read


def nvidia_smi_reader(gpu_index: int) -> GpuReader | None:
    """A reader of the GPU's used bytes through `nvidia-smi`, or None if it is not installed."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    args = [exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits", f"-i={gpu_index}"]

    async def read() -> int | None:
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
        out, _ = await proc.communicate()
        try:
            return int(float(out.decode().strip().splitlines()[0]) * MiB)
        except (ValueError, IndexError):
            return None

    return read


def gpu_reader(source: MemorySource, gpu_index: int | None) -> GpuReader | None:
    """The device-side reader for `source` ("auto": NVML, else nvidia-smi), or None."""
    if gpu_index is None or source in ("health", "none"):
        return None
    if source in ("auto", "nvml"):
        reader = nvml_reader(gpu_index)
        if reader is not None or source == "nvml":
            return reader
    return nvidia_smi_reader(gpu_index)


async def read_health(client: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    """The server's `/v1/health` JSON, or None when it has none (a peer) or is unreachable."""
    try:
        response = await client.get(url.rstrip("/") + "/v1/health", timeout=5.0)
        data = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def sample_from_health(health: dict[str, Any] | None, sample: MemorySample) -> MemorySample:
    """Fill the sample's queue and memory fields from a fishserve health report."""
    if not health:
        return sample
    requests = health.get("requests") or {}
    sample.running, sample.waiting = requests.get("running"), requests.get("waiting")
    gpu = health.get("gpu_memory") or {}
    sample.used_bytes, sample.budget_bytes = gpu.get("used_bytes"), gpu.get("budget_bytes")
    return sample


class MemoryMonitor:
    """Polls health and GPU memory every `interval` seconds until stopped.

    Attributes:
        samples: the polls so far, in time order.
        level: set by the load generator to label samples with the running level.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        url: str,
        source: MemorySource = "auto",
        gpu_index: int | None = None,
        interval: float = 0.5,
    ) -> None:
        self.client, self.url, self.source, self.interval = client, url, source, interval
        self.gpu = gpu_reader(source, gpu_index)
        self.samples: list[MemorySample] = []
        self.level: float | None = None
        self._task: asyncio.Task[None] | None = None

    async def poll(self, clock_zero: float) -> MemorySample:
        """Take one sample now."""
        sample = MemorySample(time.perf_counter() - clock_zero, self.level)
        if self.source in ("auto", "health"):
            sample_from_health(await read_health(self.client, self.url), sample)
        if sample.used_bytes is None and self.gpu is not None:
            sample.used_bytes = await self.gpu()
        self.samples.append(sample)
        return sample

    async def _loop(self, clock_zero: float) -> None:
        while True:
            await self.poll(clock_zero)
            await asyncio.sleep(self.interval)

    def start(self, clock_zero: float) -> None:
        """Start polling in the background (no-op for source "none")."""
        if self.source != "none":
            self._task = asyncio.create_task(self._loop(clock_zero))

    async def stop(self) -> None:
        """Stop polling."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def peak_bytes(self, level: float | None = None) -> int | None:
        """Largest used bytes seen (during `level` if given), or None without data."""
        used = [
            s.used_bytes
            for s in self.samples
            if s.used_bytes is not None and (level is None or s.level == level)
        ]
        return max(used) if used else None
