"""Memory and queue polling from /v1/health (mocked), and peaks per level."""

from __future__ import annotations

import asyncio

import httpx

from fishserve.bench.memory import MemoryMonitor, gpu_reader

HEALTH = {
    "status": "ok",
    "requests": {"running": 3, "waiting": 1},
    "gpu_memory": {"used_bytes": 5 * 2**30, "total_bytes": 80 * 2**30, "budget_bytes": 6 * 2**30},
}


def poll_twice(handler) -> MemoryMonitor:
    async def main() -> MemoryMonitor:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            monitor = MemoryMonitor(client, "http://127.0.0.1:1", "auto", gpu_index=None)
            monitor.level = 4
            await monitor.poll(0.0)
            monitor.level = 16
            await monitor.poll(0.0)
            return monitor

    return asyncio.run(main())


def test_health_gives_memory_budget_and_queue():
    used = iter([5 * 2**30, 7 * 2**30])

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/health"
        body = {**HEALTH, "gpu_memory": {**HEALTH["gpu_memory"], "used_bytes": next(used)}}
        return httpx.Response(200, json=body)

    monitor = poll_twice(handler)
    first = monitor.samples[0]
    assert (first.running, first.waiting, first.budget_bytes) == (3, 1, 6 * 2**30)
    assert monitor.peak_bytes(4) == 5 * 2**30 and monitor.peak_bytes(16) == 7 * 2**30
    assert monitor.peak_bytes() == 7 * 2**30 and monitor.peak_bytes(64) is None


def test_peer_without_health_gives_empty_samples():
    monitor = poll_twice(lambda request: httpx.Response(404, text="not found"))
    assert len(monitor.samples) == 2 and monitor.peak_bytes() is None
    assert monitor.samples[0].running is None


def test_no_gpu_reader_without_a_gpu_index():
    assert gpu_reader("auto", None) is None and gpu_reader("health", 0) is None
