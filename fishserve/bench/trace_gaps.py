"""Where a GPU stream sits idle in a `torch.profiler` Chrome trace, and why.

A step profile (`fishserve.engine.step_profiler`, `bench-engine --profile-steps`) says which
kernels take the device's time; it does not say how much of the time the device had nothing
to run. This reads the trace's device activities (kernels, copies, memsets) per CUDA stream
and over all streams together (`ALL_STREAMS`: a step's kernels can run on several streams,
as in round 26's engine trace, so one stream's gap can be another's work), merges them into busy
intervals and lists the gaps of the device as a whole. Each gap is attributed through the
trace's correlation ids to the host call that launched the activity after it
(``cudaGraphLaunch``, ``cudaLaunchKernel``, ``cudaMemcpyAsync``, ...):

* **host-bound**: that call began after the stream had gone idle, so the device waited for
  the host to get there (a host synchronisation, Python work, the GIL);
* **queued**: the work had been launched before the stream went idle, so something else
  held it (an event wait on another stream, the device's own scheduling).

Times in the trace are microseconds; this reports milliseconds.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# Gap length bins in microseconds: [lower, upper) each.
ALL_STREAMS = -1  # the stream id of the all-streams view
BINS_US = ((0.0, 5.0), (5.0, 20.0), (20.0, 100.0), (100.0, 500.0), (500.0, float("inf")))


@dataclass(frozen=True)
class Activity:
    """One device activity: start and end in microseconds, name, launching correlation id."""

    start: float
    end: float
    name: str
    correlation: int | None


@dataclass(frozen=True)
class Gap:
    """An idle stretch of a stream between two activities.

    Attributes:
        start_ms: its start, milliseconds from the first activity of the stream.
        length_ms: its length in milliseconds.
        before, after: names of the activities around it.
        launch: the host call that launched `after` (None when the trace does not say).
        host_bound: whether that call began after the gap had started (see module docstring).
    """

    start_ms: float
    length_ms: float
    before: str
    after: str
    launch: str | None
    host_bound: bool


@dataclass
class StreamUse:
    """How one stream spent the traced window (milliseconds)."""

    stream: int
    activities: int
    busy_ms: float
    span_ms: float
    gaps: list[Gap] = field(default_factory=list)

    @property
    def idle_ms(self) -> float:
        """Span minus busy time."""
        return self.span_ms - self.busy_ms


def load_trace(path: Path) -> list[dict]:
    """The events of a Chrome trace (a JSON object with ``traceEvents``, or a bare list; gzip
    compressed when the name ends in ``.gz``).

    Raises:
        ValueError: not JSON, or neither form.
    """
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        data = json.loads(raw.decode("utf-8"))
    except (OSError, EOFError, UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise ValueError(f"cannot read {path} as a JSON trace: {exc}") from exc
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path}: no traceEvents list (not a Chrome trace)")
    return [e for e in events if isinstance(e, dict)]


def device_activities(events: list[dict]) -> dict[int, list[Activity]]:
    """Device activities per stream id, sorted by start (complete events only)."""
    streams: dict[int, list[Activity]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in DEVICE_CATEGORIES:
            continue
        args = _args(e)
        stream, ts, dur = args.get("stream"), _number(e.get("ts")), _number(e.get("dur"))
        if not _integer(stream) or ts is None:
            continue
        end = ts + dur if dur is not None and dur >= 0 else ts
        corr = args.get("correlation")
        streams[stream].append(
            Activity(ts, end, str(e.get("name", "?")), corr if _integer(corr) else None)
        )
    for acts in streams.values():
        acts.sort(key=lambda a: a.start)
    return dict(streams)


def launches(events: list[dict]) -> dict[int, tuple[str, float]]:
    """Host runtime calls by correlation id: (name, start in microseconds)."""
    out: dict[int, tuple[str, float]] = {}
    for e in events:
        if e.get("cat") not in ("cuda_runtime", "cuda_driver"):
            continue
        corr, ts = _args(e).get("correlation"), _number(e.get("ts"))
        if _integer(corr) and ts is not None:
            out[corr] = (str(e.get("name", "?")), ts)
    return out


def _args(event: dict) -> dict:
    """An event's ``args`` when it is an object, else empty."""
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> float | None:
    """A finite JSON number as float, else None (booleans, NaN, strings)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def stream_use(stream: int, acts: list[Activity], calls: dict[int, tuple[str, float]]) -> StreamUse:
    """Busy time, span and every gap of one stream's sorted activities."""
    if not acts:
        return StreamUse(stream, 0, 0.0, 0.0)
    origin, busy, gaps = acts[0].start, 0.0, []
    cur_start, cur_end, last = acts[0].start, acts[0].end, acts[0]
    for act in acts[1:]:
        if act.start > cur_end:
            busy += cur_end - cur_start
            gaps.append(_gap(last, act, cur_end, origin, calls))
            cur_start = act.start
        if act.end >= cur_end:
            cur_end, last = act.end, act
    busy += cur_end - cur_start
    span = max(a.end for a in acts) - origin
    return StreamUse(stream, len(acts), busy / 1e3, span / 1e3, gaps)


def _gap(
    before: Activity,
    after: Activity,
    idle_from: float,
    origin: float,
    calls: dict[int, tuple[str, float]],
) -> Gap:
    call = calls.get(after.correlation) if after.correlation is not None else None
    return Gap(
        start_ms=(idle_from - origin) / 1e3,
        length_ms=(after.start - idle_from) / 1e3,
        before=before.name,
        after=after.name,
        launch=None if call is None else call[0],
        host_bound=call is not None and call[1] >= idle_from,
    )


def analyse(path: Path) -> list[StreamUse]:
    """The device's use over all streams (stream id `ALL_STREAMS`), then every stream's,
    busiest first.

    Raises:
        ValueError: an unreadable trace, or one without device activities (a CPU-only run).
    """
    events = load_trace(path)
    streams = device_activities(events)
    if not streams:
        raise ValueError(
            f"{path}: no device activities (kernels, copies) in the trace: was it recorded "
            "on a CPU? profile-gaps reads GPU traces; a CPU run's operator table is the .txt "
            "written beside it"
        )
    calls = launches(events)
    uses = [stream_use(s, acts, calls) for s, acts in streams.items()]
    uses.sort(key=lambda u: u.busy_ms, reverse=True)
    merged = sorted((a for acts in streams.values() for a in acts), key=lambda a: a.start)
    return [stream_use(ALL_STREAMS, merged, calls), *uses]


def gap_bins(gaps: list[Gap]) -> list[tuple[str, int, float, float]]:
    """(label, count, total ms, host-bound ms) per gap-length bin of `BINS_US`."""
    uppers = [hi for _, hi in BINS_US]
    rows = [[0, 0.0, 0.0] for _ in BINS_US]
    for g in gaps:
        row = rows[min(bisect.bisect_right(uppers, g.length_ms * 1e3), len(rows) - 1)]
        row[0] += 1
        row[1] += g.length_ms
        row[2] += g.length_ms if g.host_bound else 0.0
    pairs = zip(BINS_US, rows, strict=True)
    return [(_label(lo, hi), int(n), t, h) for (lo, hi), (n, t, h) in pairs]


def _label(lo: float, hi: float) -> str:
    return f">= {lo:g} us" if hi == float("inf") else f"{lo:g}-{hi:g} us"


def render(uses: list[StreamUse], top: int) -> str:
    """A plain-text report: busy share of the device and of each stream, then the device's
    gaps (`uses[0]`, the all-streams view of `analyse`)."""
    lines = ["stream  activities  busy ms  span ms  busy share"]
    for u in uses:
        if u.stream == ALL_STREAMS:
            share = u.busy_ms / u.span_ms if u.span_ms else 1.0
            lines.append(
                f"   all  {u.activities:>10}  {u.busy_ms:>7.2f}  {u.span_ms:>7.2f}  {share:>10.2f}"
            )
            continue
        share = u.busy_ms / u.span_ms if u.span_ms else 1.0
        row = f"{u.stream:>6}  {u.activities:>10}  {u.busy_ms:>7.2f}  {u.span_ms:>7.2f}"
        lines.append(f"{row}  {share:>10.2f}")
    main = uses[0]
    host = sum(g.length_ms for g in main.gaps if g.host_bound)
    lines += [
        "",
        f"all streams: {len(main.gaps)} gaps with no device work, {main.idle_ms:.2f} ms idle "
        f"of {main.span_ms:.2f} ms, {host:.2f} ms of it host-bound",
        "gap length      count  total ms  host-bound ms",
    ]
    for label, n, total, bound in gap_bins(main.gaps):
        lines.append(f"{label:<14} {n:>6}  {total:>8.2f}  {bound:>13.2f}")
    lines += ["", f"longest {top} gaps (ms from the first activity on any stream):"]
    for g in sorted(main.gaps, key=lambda g: g.length_ms, reverse=True)[:top]:
        kind = "host-bound" if g.host_bound else "queued"
        lines.append(
            f"  {g.length_ms:7.3f} ms at {g.start_ms:9.3f}  {kind:<10} {g.launch or '?':<22} "
            f"{g.before[:40]} -> {g.after[:40]}"
        )
    return "\n".join(lines)
