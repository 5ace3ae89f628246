"""The benchmark's outputs: `bench.json` (everything) and `bench.md` (the summary table)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from fishserve.bench.client import RequestRecord
from fishserve.bench.memory import MemorySample
from fishserve.bench.stats import (
    FAST_RTF,
    TTFA_P99_LIMIT_S,
    LevelSummary,
    capacity,
    still_rising,
)

GiB = 2**30
DEFINITIONS = (
    "TTFA: seconds from send (Poisson: scheduled arrival) to the first audio byte, queueing "
    "included. Send p99: the load generator's own time to get a connection and write a "
    "request (high: the client, not the server, delayed TTFA). Latency: to the last byte. "
    "RTF = latency / audio seconds (<= 1 is faster than "
    "real time). Real-time: every successful stream had RTF <= 1. Stalled: streams that fell "
    "behind a player started at their first byte. Throughput counts successful requests over "
    "the level's wall time; frames/s = audio s/s x frames per audio second. Peak GPU: "
    "whole-device used memory polled during the level. Decoder frames/s and GPU busy "
    "(LLM / decoder: fraction of wall time each kept the GPU busy, CUDA events; they overlap on "
    "separate streams) come from the server's /metrics (fishserve only), as does GIL wait: the "
    "mean time a thread of the server's engine process waited to get Python's GIL back "
    "(its GIL probe; each PyTorch call of the engine and decoder threads pays it). First "
    "frame / first chunk's decoder: the server's mean seconds from a request's arrival to its "
    "first generated frame, and from its first chunk's hand-over to the decoder to that "
    "chunk's audio, with the first chunk's mean frames (fishserve's /metrics); the rest of "
    "the server's TTFA went to generating the first chunk's other frames."
)


@dataclasses.dataclass
class BenchReport:
    """A finished run.

    Attributes:
        meta: options, server health at the start, tool version, start time.
        levels: one summary per level, in run order.
        requests: every measured request (warm-up excluded).
        memory: polls of GPU memory and queue sizes.
    """

    meta: dict[str, Any]
    levels: list[LevelSummary]
    requests: list[RequestRecord]
    memory: list[MemorySample]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (records carry their derived RTF and frames/s)."""
        rate = float(self.meta.get("frame_rate", 0.0))
        requests = [
            {**dataclasses.asdict(r), "rtf": r.rtf, "frames_per_s": r.frames_per_s(rate)}
            for r in self.requests
        ]
        return {
            "meta": self.meta,
            "levels": [dataclasses.asdict(s) for s in self.levels],
            "requests": requests,
            "memory": [dataclasses.asdict(m) for m in self.memory],
        }


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _triple(values: dict[str, float | None]) -> str:
    return " / ".join(_num(values[k]) for k in ("p50", "p90", "p99"))


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in errors.items()) or "0"


def _realtime(summary: LevelSummary) -> str:
    if summary.all_realtime is None:
        return "-"
    return "yes" if summary.all_realtime else f"no (max {_num(summary.rtf_max)})"


def _split(summary: LevelSummary) -> str:
    """The server's mean arrival-to-first-frame and first-chunk decoder seconds, and the
    first chunk's mean frames ("-" where the server does not export them)."""
    if summary.queue_s is None or summary.first_chunk_decode_s is None:
        return "-"
    frames = _num(summary.first_chunk_frames, 1)
    return f"{_num(summary.queue_s, 3)} / {_num(summary.first_chunk_decode_s, 3)} ({frames})"


def level_row(summary: LevelSummary) -> str:
    """One markdown table row."""
    peak = None if summary.peak_gpu_bytes is None else summary.peak_gpu_bytes / GiB
    cells = [
        f"{summary.level:g}",
        str(summary.requests),
        str(summary.ok),
        _errors(summary.errors),
        _triple(summary.latency_s),
        _triple(summary.ttfa_s),
        _num((summary.sent_s or {}).get("p99"), 3),
        _num(summary.requests_per_min, 1),
        _num(summary.audio_s_per_s),
        _num(summary.frames_per_s, 1),
        _num(summary.rtf["p90"]),
        _realtime(summary),
        str(summary.stalled_streams),
        _num(peak),
        _num(summary.decoder_frames_per_s, 0),
        f"{_num(summary.llm_busy)} / {_num(summary.decoder_busy)}",
        f"{_num(summary.steps_per_s, 1)} / {_num(summary.frames_per_step, 1)}",
        _num(summary.gil_wait_ms, 3),
        _split(summary),
    ]
    return "| " + " | ".join(cells) + " |"


def markdown_table(levels: list[LevelSummary], level_name: str) -> str:
    """The summary table, one row per level."""
    header = (
        f"| {level_name} | requests | ok | errors | latency s p50/p90/p99 | "
        "TTFA s p50/p90/p99 | send s p99 | req/min | audio s/s | frames/s | RTF p90 | "
        "real-time | stalled | "
        "peak GPU GiB | decoder frames/s | GPU busy LLM / decoder | steps/s / frames per step | "
        "GIL wait ms | first frame / first chunk's decoder s (its frames) |"
    )
    rule = "|" + "---|" * 19
    return "\n".join([header, rule, *(level_row(s) for s in levels)])


def _host_line(meta: dict[str, Any]) -> list[str]:
    """The load generator's machine's host probe (`fishserve.host_probe`), if recorded."""
    probe = meta.get("host_probe_ms")
    if probe is None:
        return []
    return [f"- host probe: {probe:.1f} ms (this machine's CPU; higher is slower)"]


def markdown_report(report: BenchReport) -> str:
    """`bench.md`: what ran, the table, and the definitions."""
    meta = report.meta
    lines = [
        f"# fishserve bench: {meta.get('label') or meta['url']}",
        "",
        f"- target: `{meta['url']}{meta['path']}` ({meta['api']} API), started {meta['started']}",
        f"- mode: {meta['mode']}; workload: {meta['workload']} ({meta['workload_size']} texts)",
        f"- request: {meta['request']}",
        f"- server: {meta.get('server_summary') or 'no /v1/health'}",
        *_host_line(meta),
        "",
        markdown_table(report.levels, meta["level_name"]),
        "",
        *capacity_lines(report),
        "",
        DEFINITIONS,
        "",
    ]
    return "\n".join(lines)


# A load generator that takes longer than this to send a request (send p99, seconds) is itself
# part of what it measures (docs/benchmarks.md §6.14: 1-7 s with one connection pool for 384
# streams, ~0.01-0.03 s with a client per 32).
CLIENT_SEND_LIMIT_S = 0.1


def client_lines(levels: list[LevelSummary]) -> list[str]:
    """A warning naming the levels where the load generator was slow to send requests."""
    slow = [
        f"{s.level:g} ({p99:.2f} s)"
        for s in levels
        if (p99 := (s.sent_s or {}).get("p99")) is not None and p99 > CLIENT_SEND_LIMIT_S
    ]
    if not slow:
        return []
    return [
        f"- **load generator**: its send time p99 exceeded {CLIENT_SEND_LIMIT_S:g} s at "
        f"{', '.join(slow)}: TTFA and stalls there include its own delays, not only the "
        "server's (give it more CPU, another machine, or split the streams over processes)"
    ]


def steady_lines(levels: list[LevelSummary]) -> list[str]:
    """A warning naming the levels whose TTFA was still rising at their end (`still_rising`)."""
    rising = [
        f"{s.level:g} (p50 {early['p50']:.2f} -> {late['p50']:.2f} s, second half's p99 "
        f"{late['p99']:.2f} s)"
        for s in levels
        if still_rising(s) and (early := s.ttfa_early_s) and (late := s.ttfa_late_s)
    ]
    if not rising:
        return []
    return [
        "- **steady state**: TTFA was still rising from the first half of the level to the "
        f"second at {', '.join(rising)}: the whole level's TTFA mixes its lighter start (a "
        "ramp, a batch still filling) with the load that followed, so it understates a longer "
        "run (give longer levels: --duration, or more --num-requests)"
    ]


# A host probe this much slower than the run's fastest marks the host as changed: on the H200
# the probe went from 5 to 11-12 ms within one lease (§6.25-§6.27); on a 2-core machine that
# also runs the server and the load generator, back-to-back probes differ by up to ~1.5x.
HOST_CHANGE = 1.6
# A level during which the hypervisor took more than this share of the CPUs is flagged.
STEAL_WARN = 0.05


def host_lines(levels: list[LevelSummary]) -> list[str]:
    """A warning when the host probes taken around the levels (`LevelSummary.host_probe_ms`,
    `host_probe_after_ms`) differ by more than `HOST_CHANGE` x: the machine's CPU speed
    changed during the run, and with it what the server's host work allows; then
    `steal_lines`."""
    probes = [
        (s.level, p)
        for s in levels
        for p in (s.host_probe_ms, s.host_probe_after_ms)
        if p is not None and p > 0
    ]
    lines = steal_lines(levels)
    if not probes:
        return lines
    fast, slow = min(p for _, p in probes), max(p for _, p in probes)
    if slow <= HOST_CHANGE * fast:
        return lines
    slowed = sorted({level for level, p in probes if p > HOST_CHANGE * fast})
    return [
        f"- **host speed changed during the run**: the host probe ranged {fast:.1f} to "
        f"{slow:.1f} ms (higher is slower); probes over {HOST_CHANGE:g}x the fastest were taken "
        f"right before or after level {', '.join(f'{x:g}' for x in slowed)}. The server's host "
        "work on this machine ran slower around them: compare those levels only with runs at "
        "a like probe (each level's probes are in bench.json)",
        *lines,
    ]


def steal_lines(levels: list[LevelSummary]) -> list[str]:
    """A warning naming the levels during which the hypervisor took more than `STEAL_WARN`
    of this (virtual) machine's CPU time (`LevelSummary.cpu_steal`)."""
    stolen = [
        f"{s.level:g} ({100 * s.cpu_steal:.0f}%)"
        for s in levels
        if s.cpu_steal is not None and s.cpu_steal > STEAL_WARN
    ]
    if not stolen:
        return []
    return [
        f"- **CPU time taken by the hypervisor** during {', '.join(stolen)}: this virtual "
        "machine's CPUs ran other guests' work then, so the server's (and the load "
        "generator's) host work ran slower than the machine can"
    ]


def capacity_lines(report: BenchReport) -> list[str]:
    """The capacity verdict: largest level that stays real time (closed-loop runs only),
    and a warning for levels where the load generator itself was slow (`client_lines`)."""
    if report.meta.get("mode") != "concurrency":  # open loop: a rising TTFA is a queue
        return client_lines(report.levels) + host_lines(report.levels)
    cap = capacity(report.levels)
    by_level = {s.level: s for s in report.levels}

    def name(level: float | None) -> str:
        if level is None:
            return "none of the levels"
        in_flight = by_level[level].mean_in_flight
        return f"{level:g} concurrent streams ({in_flight:.0f} in flight on average)"

    rule = (
        f"all requests ok, every stream RTF <= 1 and never stalled, "
        f"TTFA p99 <= {TTFA_P99_LIMIT_S * 1e3:.0f} ms"
    )
    return [
        f"- **capacity (real time)**: {name(cap['realtime'])} ({rule})",
        f"- **capacity (RTF <= {FAST_RTF})**: {name(cap['rtf_0.5'])} (the same, and every "
        f"stream at RTF <= {FAST_RTF})",
        *client_lines(report.levels),
        *steady_lines(report.levels),
        *host_lines(report.levels),
    ]


def write_report(report: BenchReport, output_dir: Path) -> list[Path]:
    """Write `bench.json` and `bench.md` into `output_dir`; return their paths."""
    output_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = output_dir / "bench.json", output_dir / "bench.md"
    json_path.write_text(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    md_path.write_text(markdown_report(report), encoding="utf-8")
    return [json_path, md_path]
