"""`fishserve bench` end to end: warm up, run every level with a progress bar, write reports.

Request i of every level speaks the same text with the same seed, so levels differ only in
load. Warm-up requests (not measured) run first, one at a time; if none of them reaches the
server the run stops with an error instead of measuring connection failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import httpx
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

import fishserve
from fishserve.bench.client import RequestRecord, Target, open_clients
from fishserve.bench.cpu_times import cpu_shares, read_cpu_times
from fishserve.bench.load import DoneFn
from fishserve.bench.memory import MemoryMonitor, MemorySource, read_health
from fishserve.bench.plots import PLOT_NAMES, remove_stale, write_plots
from fishserve.bench.report import BenchReport, capacity_lines, markdown_table, write_report
from fishserve.bench.server_counters import rates, read_counters
from fishserve.bench.shares import (
    quiet_collector,
    run_load,
    run_share,
    send_indexed,
    share_plan,
    share_pool,
)
from fishserve.bench.stats import LevelSummary, summarize
from fishserve.bench.workload import RequestShape, WorkItem
from fishserve.host_probe import host_probe_ms
from fishserve.progress import progress_bar

# 44100 Hz / 2048 samples per code frame (Firefly decoder of Fish Speech 1.5).
RELEASE_FRAME_RATE = 44100 / 2048
Mode = Literal["concurrency", "poisson"]


@dataclass
class BenchOptions:
    """Everything one run needs (see `fishserve bench --help` for the meaning of each).

    Attributes:
        url: server base URL.
        levels: concurrencies (mode "concurrency") or arrival rates per second ("poisson").
        num_requests: requests per level; None = max(16, 4 x concurrency), or 64 (Poisson).
        duration_s: per level, no request starts after this many seconds.
        frame_rate: audio frames per audio second (for frames/s).
        timeout_s: seconds a request may take in all (`Target.timeout_s`), and the HTTP
            clients' read timeout.
        gpu_index: GPU polled through NVML/nvidia-smi when health has no memory data.
        ramp_s: closed loop: spread the workers' first requests over this many seconds.
        processes: load-generator processes; each level's load is split among them
            (`fishserve.bench.shares`); 1 sends everything from this process.
    """

    url: str
    workload: list[WorkItem]
    shape: RequestShape = field(default_factory=RequestShape)
    mode: Mode = "concurrency"
    levels: list[float] = field(default_factory=lambda: [1, 4, 16, 64, 256])
    num_requests: int | None = None
    duration_s: float = 180.0
    ramp_s: float = 0.0
    warmup: int = 2
    timeout_s: float = 600.0
    sample_rate: int = 44100
    frame_rate: float = RELEASE_FRAME_RATE
    memory_source: MemorySource = "auto"
    gpu_index: int | None = None
    poll_interval_s: float = 0.5
    max_inflight: int = 1024
    api_key: str | None = None
    workload_name: str = "builtin"
    label: str = ""
    output_dir: Path = Path("bench_out")
    processes: int = 1

    @property
    def level_name(self) -> str:
        """Column/axis name of the levels."""
        return "concurrency" if self.mode == "concurrency" else "arrival rate (req/s)"

    def requests_for(self, level: float) -> int:
        """Requests to start at `level`."""
        if self.num_requests is not None:
            return self.num_requests
        return max(16, 4 * int(level)) if self.mode == "concurrency" else 64

    def target(self) -> Target:
        """Where requests go."""
        return Target(
            self.url,
            self.shape.path,
            self.shape.audio_format,
            self.sample_rate,
            self.api_key,
            self.timeout_s,
        )


class BenchRun:
    """One benchmark run against one server (state shared by the levels).

    Requests go through `shards` clients in turn (request i through shard i mod n), the first
    of which also reads the server's health and counters (see `bench`); with a `pool`, each
    level's requests are sent by its processes instead (`fishserve.bench.shares`).
    """

    def __init__(
        self,
        opts: BenchOptions,
        shards: list[httpx.AsyncClient],
        progress: Progress,
        pool: ProcessPoolExecutor | None = None,
    ) -> None:
        self.opts, self.shards, self.progress, self.pool = opts, shards, progress, pool
        self.client = client = shards[0]
        self.target = opts.target()
        self.clock_zero = time.perf_counter()
        self.monitor = MemoryMonitor(
            client, opts.url, opts.memory_source, opts.gpu_index, opts.poll_interval_s
        )

    async def send(self, level: float, index: int, t0: float | None) -> RequestRecord:
        """Request `index` of a level."""
        return await send_indexed(
            self.opts, self.shards, self.target, level, index, self.clock_zero, t0
        )

    async def send_from_pool(self, level: float, done: DoneFn) -> list[RequestRecord]:
        """One level's requests, sent by the pool's processes; its records in index order."""
        assert self.pool is not None
        loop, shares = asyncio.get_running_loop(), self.opts.processes
        parts = await asyncio.gather(
            *(
                loop.run_in_executor(
                    self.pool, run_share, self.opts, level, k, shares, self.clock_zero
                )
                for k in range(shares)
            )
        )
        records = sorted((r for part in parts for r in part), key=lambda r: r.index)
        for record in records:
            done(record)
        return records

    async def warm_up(self) -> None:
        """Send the warm-up requests one by one.

        Raises:
            ConnectionError: none of them reached the server.
        """
        records = [await self.send(-1, i, None) for i in range(self.opts.warmup)]
        if records and all(r.status in ("connect", "timeout") for r in records):
            raise ConnectionError(f"cannot reach {self.opts.url}: {records[-1].error}")

    async def run_level(self, level: float) -> tuple[LevelSummary, list[RequestRecord]]:
        """Run one level with its progress bar."""
        opts = self.opts
        plan = share_plan(opts, level, 0, 1)
        task = self.progress.add_task(
            f"{opts.level_name} {level:g}", total=plan.num_requests, errors=0
        )
        errors = 0

        def done(record: RequestRecord) -> None:
            nonlocal errors
            errors += not record.ok
            self.progress.update(task, advance=1, errors=errors)

        self.monitor.level = level
        probe = host_probe_ms()  # between levels: the load would slow it
        cpu = read_cpu_times()
        counters, started = await read_counters(self.client, opts.url), time.perf_counter()
        if self.pool is not None:
            records = await self.send_from_pool(level, done)
        else:
            with quiet_collector():
                send = functools.partial(self.send, level)
                records = await run_load(opts, level, plan, send, done)
        await self.monitor.poll(self.clock_zero)  # at least one sample per level
        self.monitor.level = None
        self.progress.update(task, total=len(records))
        summary = summarize(level, records, opts.frame_rate, self.monitor.peak_bytes(level))
        elapsed = time.perf_counter() - started
        server = rates(counters, await read_counters(self.client, opts.url), elapsed)
        for rate in fields(server):  # LevelSummary has a field of each name
            setattr(summary, rate.name, getattr(server, rate.name))
        shares = cpu_shares(cpu, read_cpu_times())
        summary.cpu_busy, summary.cpu_steal = shares if shares is not None else (None, None)
        summary.host_probe_ms, summary.host_probe_after_ms = probe, host_probe_ms()
        return summary, records


def server_summary(health: dict[str, Any] | None) -> str | None:
    """One line about the server from its health report (fishserve), or None."""
    if not health or not isinstance(health.get("model"), dict):
        return None
    model, kv, gpu = health["model"], health.get("kv_cache") or {}, health.get("gpu_memory")
    parts = [
        f"device={model.get('device')}",
        f"dtype={model.get('dtype')}",
        f"kv={kv.get('dtype', model.get('kv_cache_dtype'))}",
        f"kv_blocks={kv.get('blocks_total')}",
    ]
    if gpu and gpu.get("budget_bytes"):
        parts.append(f"budget={gpu['budget_bytes'] / 2**30:.2f} GiB")
    if isinstance(health.get("host_probe_ms"), int | float):  # the server machine's host speed
        parts.append(f"host_probe={health['host_probe_ms']:.1f} ms")
    return " ".join(parts)


def run_meta(opts: BenchOptions, health: dict[str, Any] | None) -> dict[str, Any]:
    """The report's description of the run."""
    shape = opts.shape
    reference = shape.reference_id or ("inline" if shape.reference_audio else "none")
    request = (
        f"format={shape.audio_format} streaming={shape.streaming} "
        f"max_new_tokens={shape.max_new_tokens} ignore_eos={shape.ignore_eos} "
        f"chunk_length={shape.chunk_length} seed={shape.seed} reference={reference}"
    )
    return {
        "tool": f"fishserve {fishserve.__version__} bench",
        "label": opts.label,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "url": opts.url,
        "path": shape.path,
        "api": shape.api,
        "mode": opts.mode,
        "level_name": opts.level_name,
        "levels": opts.levels,
        "workload": opts.workload_name,
        "workload_size": len(opts.workload),
        "request": request,
        "extra_body": shape.extra_body,
        "warmup": opts.warmup,
        "duration_s": opts.duration_s,
        "frame_rate": opts.frame_rate,
        "server": health,
        "server_summary": server_summary(health),
    }


def make_progress(console: Console) -> Progress:
    """The progress display: one bar per level with its error count."""
    return progress_bar(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("errors {task.fields[errors]}"),
        TimeElapsedColumn(),
        console=console,
    )


async def bench(opts: BenchOptions, progress: Progress) -> BenchReport:
    """Run every level against the server and return the report (nothing written)."""
    # with several processes, theirs send the requests; this one reads health and counters
    peak = max(opts.levels) if opts.mode == "concurrency" else opts.max_inflight
    peak = 1 if opts.processes > 1 else peak
    async with contextlib.AsyncExitStack() as stack:
        shards = await open_clients(stack, int(peak), opts.timeout_s)
        pool = stack.enter_context(share_pool(opts.processes)) if opts.processes > 1 else None
        client = shards[0]
        health = await read_health(client, opts.url)
        run = BenchRun(opts, shards, progress, pool)
        await run.warm_up()
        run.monitor.start(run.clock_zero)
        levels, records = [], []
        try:
            for level in opts.levels:
                summary, level_records = await run.run_level(level)
                levels.append(summary)
                records.extend(level_records)
        finally:
            await run.monitor.stop()
    return BenchReport(run_meta(opts, health), levels, records, run.monitor.samples)


def run_bench(opts: BenchOptions, console: Console) -> BenchReport:
    """Run the benchmark, write bench.json, bench.md and the PNGs, print the table.

    Raises:
        ConnectionError: the server could not be reached.
        ValueError: bad options.
    """
    if not opts.levels or min(opts.levels) <= 0:
        raise ValueError(f"levels must be positive numbers, got {opts.levels}")
    if opts.mode == "concurrency" and any(level != int(level) for level in opts.levels):
        raise ValueError(f"concurrency levels must be whole numbers, got {opts.levels}")
    if opts.processes < 1:
        raise ValueError(f"processes must be at least 1, got {opts.processes}")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one INFO line per request
    probe = host_probe_ms()  # this machine's CPU speed (higher: slower), before the load
    with make_progress(console) as progress:
        report = asyncio.run(bench(opts, progress))
    report.meta["host_probe_ms"] = probe
    paths = write_report(report, opts.output_dir)
    try:
        paths += write_plots(report.levels, report.memory, opts.level_name, opts.output_dir)
    except ImportError as exc:  # matplotlib is an extra: the reports are written without it
        stale = remove_stale(opts.output_dir, PLOT_NAMES)
        plural = "s" if len(stale) != 1 else ""
        note = f"; removed {len(stale)} plot{plural} of an earlier run there" if stale else ""
        console.print(f"plots skipped ({exc}){note}", highlight=False, markup=False)
    console.print(
        "\n".join([markdown_table(report.levels, opts.level_name), *capacity_lines(report)]),
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    console.print(f"wrote {', '.join(str(p) for p in paths)}", highlight=False, markup=False)
    return report
