"""The evaluation's outputs: `eval.json`, `eval.md` (the table) and `eval.png`."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import fishserve
from fishserve.bench.plots import remove_stale
from fishserve.eval.mcd import HOP, N_FFT, N_MELS, ORDER

if TYPE_CHECKING:
    from fishserve.eval.run import ConfigResult, EvalOptions, Reference

GiB = 2**30
RANDOM_NOTE = (
    "**Random weights**: these numbers measure numerical fidelity to the fp32 computation, "
    "not speech quality (the audio is noise)."
)
DEFINITIONS = f"""\
- load GiB: allocated after loading the model, a KV pool and the decoder (CUDA: PyTorch
  allocator; CPU: tensor bytes). Peak GiB: most allocated while generating and decoding the
  short / long request (CUDA only).
- ms/frame: the long request's generation time over its frames, batch 1 (prefill included).
- top-1 agreement: teacher-forced on the reference's codes, the fraction of frames whose
  argmax matches the reference: slow head (semantic token) / worst codebook of the fast head.
- KL: mean KL(P_ref || P_config) of the slow head's softmax, nats.
- MCD: mel-cepstral distortion vs the reference audio, dB (Kubichek 1993:
  (10 / ln 10) * sqrt(2 * sum_d (c_d - c'_d)^2), d = 1..{ORDER}, averaged over frames; mel-cepstra
  from a {N_MELS}-band librosa mel filter bank, {N_FFT}-point FFT, hop {HOP}). "same": this
  configuration's decoder on the reference's codes; "own": its own seeded generation decoded
  (sampling diverges once a single code differs: see first_divergence in eval.json)."""


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / GiB:.3f}"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table_row(r: ConfigResult) -> str:
    """One markdown row."""
    if r.error is not None:
        return f"| {r.config} | failed: {r.error} |" + " |" * 5
    fid = r.fidelity
    assert fid is not None
    cells = [
        r.config,
        _gib(r.load_bytes),
        f"{_gib(r.peak_bytes.get('short'))} / {_gib(r.peak_bytes.get('long'))}",
        _num(r.ms_per_frame, ".2f"),
        f"{fid.slow_top1:.4f} / {fid.codebook_top1_min:.4f}",
        _num(fid.slow_kl, ".3g"),
        f"{_num(r.mcd_same_db, '.3f')} / {_num(r.mcd_own_db, '.3f')}",
    ]
    return "| " + " | ".join(cells) + " |"


def markdown_table(results: list[ConfigResult]) -> str:
    """The comparison table, one row per configuration."""
    header = (
        "| config | load GiB | peak GiB (short/long) | ms/frame | "
        "top-1 agreement (slow / codebook min) | KL (nats) | MCD dB (same / own codes) |"
    )
    return "\n".join([header, "|" + "---|" * 7, *(table_row(r) for r in results)])


def run_meta(opts: EvalOptions, ref: Reference, device: torch.device) -> dict[str, Any]:
    """Description of the run for the report."""
    gens = ref.outputs.generations
    return {
        "tool": f"fishserve {fishserve.__version__} eval",
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "checkpoint": str(opts.source.checkpoint) if opts.source.checkpoint else None,
        "random_weights": opts.source.dummy,
        "reference": ref.config.name,
        "seed": opts.seed,
        "sampling": dataclasses.asdict(opts.params),
        "frames": {name: g.codes.shape[1] for name, g in gens.items()},
        "prompt_positions": {name: g.prompt.shape[1] for name, g in gens.items()},
        "kv_pool_positions": opts.source.kv_positions,
        "block_size": opts.source.block_size,
        "texts": {"short": opts.short_text, "long": opts.long_text},
    }


def markdown_report(meta: dict[str, Any], results: list[ConfigResult]) -> str:
    """`eval.md`."""
    name, device = meta["device_name"], meta["device"]
    lines = [
        f"# fishserve eval on {name if name == device else f'{name} ({device})'}",
        "",
        f"Reference {meta['reference']}; seed {meta['seed']}; frames {meta['frames']} after "
        f"prompts of {meta['prompt_positions']} positions (a small model's context caps the "
        f"frames); weights: {meta['checkpoint'] or 'random (dummy)'}.",
        "",
    ]
    if meta["random_weights"]:
        lines += [RANDOM_NOTE, ""]
    lines += [markdown_table(results), "", DEFINITIONS, ""]
    return "\n".join(lines)


def plot_results(results: list[ConfigResult], path: Path) -> None:
    """Bars per configuration: memory, ms/frame, top-1 agreement, KL (slow, codebooks), MCD."""
    from fishserve.bench.plots import pyplot

    plt = pyplot()
    done = [r for r in results if r.error is None and r.fidelity is not None]
    names = [r.config for r in done]
    x = list(range(len(done)))
    fig, axes = plt.subplots(2, 3, figsize=(18, 10))
    fid = [r.fidelity for r in done if r.fidelity is not None]
    panels = [
        (
            "memory GiB",
            {
                "load": [r.load_bytes for r in done],
                "peak long": [r.peak_bytes.get("long") for r in done],
            },
            1 / GiB,
        ),
        ("ms / frame (long request, batch 1)", {"ms": [r.ms_per_frame for r in done]}, 1.0),
        (
            "top-1 agreement",
            {
                "slow": [f.slow_top1 for f in fid],
                "codebook min": [f.codebook_top1_min for f in fid],
            },
            1.0,
        ),
        ("KL slow head (nats)", {"KL": [f.slow_kl for f in fid]}, 1.0),
        (
            "KL codebooks, mean (nats)",
            {"KL": [sum(f.codebook_kl) / len(f.codebook_kl) for f in fid]},
            1.0,
        ),
        (
            "MCD dB",
            {
                "same codes": [r.mcd_same_db for r in done],
                "own codes": [r.mcd_own_db for r in done],
            },
            1.0,
        ),
    ]
    for ax, (title, series, scale) in zip(axes.flat, panels, strict=True):
        width = 0.8 / len(series)
        for i, (label, values) in enumerate(series.items()):
            ys = [float("nan") if v is None else v * scale for v in values]
            ax.bar([xi + i * width for xi in x], ys, width, label=label)
        ax.set_xticks([xi + 0.4 - width / 2 for xi in x], names, rotation=60, ha="right")
        ax.set_title(title)
        ax.grid(True, axis="y", alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PLOT_NAME = "eval.png"


def write_eval_report(
    opts: EvalOptions,
    ref: Reference,
    results: list[ConfigResult],
    device: torch.device,
    output_dir: Path,
) -> tuple[list[Path], str | None]:
    """Write eval.json and eval.md, and eval.png where matplotlib is installed; return the
    paths written and a note for the user when the plot was skipped (else None)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    meta = run_meta(opts, ref, device)
    paths = [output_dir / n for n in ("eval.json", "eval.md", PLOT_NAME)]
    rows = [dataclasses.asdict(r) for r in results]
    paths[0].write_text(json.dumps({"meta": meta, "results": rows}, indent=2, ensure_ascii=False))
    paths[1].write_text(markdown_report(meta, results), encoding="utf-8")
    try:
        plot_results(results, paths[2])
    except ImportError as exc:  # matplotlib is an extra: the reports are written without it
        stale = remove_stale(output_dir, (PLOT_NAME,))
        note = f"; removed the {PLOT_NAME} of an earlier run there" if stale else ""
        return paths[:2], f"plot skipped ({exc}){note}"
    return paths, None
