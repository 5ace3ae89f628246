"""PNG plots of a benchmark (matplotlib, headless `Agg` backend).

- `latency.png`: latency and TTFA percentiles vs level.
- `throughput.png`: requests/minute and audio seconds per second vs level.
- `memory.png`: GPU memory (and queue sizes, when the server reports them) over time.
- `capacity.png`: TTFA p99 and worst RTF vs level against the capacity criteria, and the GPU
  busy fractions of the LLM and the decoder (fishserve's /metrics).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from fishserve.bench.memory import MemorySample
from fishserve.bench.stats import FAST_RTF, TTFA_P99_LIMIT_S, LevelSummary

if TYPE_CHECKING:
    from matplotlib.axes import Axes

GiB = 2**30


def pyplot() -> ModuleType:
    """matplotlib.pyplot on the non-interactive Agg backend (ImportError says how to install)."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("plots need matplotlib: pip install -e '.[bench]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _level_axis(ax: Axes, levels: list[float], name: str) -> None:
    if len(levels) > 1 and min(levels) > 0 and max(levels) / min(levels) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [f"{x:g}" for x in levels])
    ax.set_xlabel(name)
    ax.grid(True, alpha=0.3)


def plot_latency(levels: list[LevelSummary], name: str, path: Path) -> None:
    """Latency and TTFA p50/p90/p99 (seconds) vs level."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    xs = [s.level for s in levels]
    for ax, field, title in (
        (axes[0], "latency_s", "end-to-end latency"),
        (axes[1], "ttfa_s", "TTFA"),
    ):
        for q, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
            ys = [getattr(s, field)[q] for s in levels]
            ax.plot(xs, [float("nan") if y is None else y for y in ys], style, label=q)
        _level_axis(ax, xs, name)
        ax.set_ylabel("seconds")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_throughput(levels: list[LevelSummary], name: str, path: Path) -> None:
    """Requests/minute (left axis) and audio seconds per second (right axis) vs level."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [s.level for s in levels]
    ax.plot(xs, [s.requests_per_min for s in levels], "o-", color="tab:blue", label="req/min")
    ax.set_ylabel("requests / minute", color="tab:blue")
    right = ax.twinx()
    right.plot(xs, [s.audio_s_per_s for s in levels], "s--", color="tab:orange")
    right.set_ylabel("audio seconds / second", color="tab:orange")
    _level_axis(ax, xs, name)
    ax.set_title("throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _nan(values: list[float | None]) -> list[float]:
    return [float("nan") if v is None else v for v in values]


def plot_capacity(levels: list[LevelSummary], name: str, path: Path) -> None:
    """TTFA p99 vs its limit, worst/median RTF vs 1 and 0.5, GPU busy split, per level."""
    plt = pyplot()
    fig, (ttfa, rtf, busy) = plt.subplots(1, 3, figsize=(15, 4))
    xs = [s.level for s in levels]
    ttfa.plot(xs, _nan([s.ttfa_s["p99"] for s in levels]), "o-", label="TTFA p99")
    ttfa.axhline(TTFA_P99_LIMIT_S, color="tab:red", linestyle=":", label="limit")
    ttfa.set_ylabel("seconds")
    ttfa.set_title("time to first audio")
    rtf.plot(xs, _nan([s.rtf_max for s in levels]), "o-", label="worst stream")
    rtf.plot(xs, _nan([s.rtf["p50"] for s in levels]), "s--", label="median")
    rtf.axhline(1.0, color="tab:red", linestyle=":", label="real time")
    rtf.axhline(FAST_RTF, color="tab:orange", linestyle=":", label=f"RTF {FAST_RTF}")
    rtf.set_ylabel("RTF (wall / audio seconds)")
    rtf.set_title("real-time factor")
    busy.plot(xs, _nan([s.llm_busy for s in levels]), "o-", label="LLM")
    busy.plot(xs, _nan([s.decoder_busy for s in levels]), "s-", label="decoder")
    busy.set_ylabel("fraction of wall time")
    busy.set_title("GPU busy (server /metrics)")
    for ax in (ttfa, rtf, busy):
        _level_axis(ax, xs, name)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _shade_levels(ax: Axes, samples: list[MemorySample]) -> None:
    """Shade the time span of each level and label it."""
    spans: dict[float, list[float]] = {}
    for s in samples:
        if s.level is not None:
            spans.setdefault(s.level, []).append(s.t_s)
    for i, (level, times) in enumerate(spans.items()):
        ax.axvspan(min(times), max(times), color="gray", alpha=0.08 + 0.08 * (i % 2))
        ax.text(min(times), 1.0, f"{level:g}", transform=ax.get_xaxis_transform(), va="bottom")


def plot_memory(samples: list[MemorySample], path: Path) -> None:
    """GPU used GiB (with the budget, if known) and running/waiting requests over time."""
    plt = pyplot()
    fig, (mem, queue) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    used = [(s.t_s, s.used_bytes / GiB) for s in samples if s.used_bytes is not None]
    if used:
        mem.plot(*zip(*used, strict=True), "-", color="tab:red", label="GPU used")
        for budget in sorted({s.budget_bytes for s in samples if s.budget_bytes}):
            mem.axhline(budget / GiB, color="gray", linestyle=":", label="budget")
        mem.legend(loc="lower right")
    else:
        mem.text(
            0.5,
            0.5,
            "no GPU memory data (CPU server, or no NVML / nvidia-smi)",
            ha="center",
            transform=mem.transAxes,
        )
    mem.set_ylabel("GPU memory GiB")
    mem.set_title("GPU memory and queue over time (shaded: levels)", pad=14)
    counts = [(s.t_s, s.running, s.waiting) for s in samples if s.running is not None]
    if counts:
        t, running, waiting = zip(*counts, strict=True)
        queue.step(t, running, where="post", color="tab:blue", label="running")
        queue.step(t, waiting, where="post", color="tab:green", label="waiting")
        queue.legend(loc="upper right")
    else:
        queue.text(
            0.5,
            0.5,
            "no queue data (server has no /v1/health)",
            ha="center",
            transform=queue.transAxes,
        )
    queue.set_ylabel("requests")
    queue.set_xlabel("seconds since start")
    for ax in (mem, queue):
        _shade_levels(ax, samples)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


PLOT_NAMES = ("latency.png", "throughput.png", "memory.png", "capacity.png")


def remove_stale(output_dir: Path, names: tuple[str, ...]) -> list[Path]:
    """Delete the files `names` in `output_dir` (plots of an earlier run that this run could
    not redraw, so that they are not taken for its own); return the deleted paths."""
    stale = [output_dir / n for n in names if (output_dir / n).is_file()]
    for path in stale:
        path.unlink()
    return stale


def write_plots(
    levels: list[LevelSummary], samples: list[MemorySample], name: str, output_dir: Path
) -> list[Path]:
    """Write the four PNGs (`PLOT_NAMES`) into `output_dir`; return their paths.

    Raises:
        ImportError: matplotlib is not installed (the `bench` extra).
    """
    paths = [output_dir / n for n in PLOT_NAMES]
    plot_latency(levels, name, paths[0])
    plot_throughput(levels, name, paths[1])
    plot_memory(samples, paths[2])
    plot_capacity(levels, name, paths[3])
    return paths
