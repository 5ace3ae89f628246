"""`fishserve eval` end to end: the reference pass, then every configuration, then reports.

The reference configuration (fp32/fp32 by default) generates a short and a long request with
a fixed seed; its codes are the fixed sequences every configuration is teacher-forced on and
decodes ("same codes"). Each configuration then also generates the same two requests with the
same seed ("own codes"), timed and with its peak memory measured. Configurations are loaded
one at a time, and everything of the previous one is freed first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fishserve.engine.sampling import SamplingParams
from fishserve.eval.configs import EvalConfig, parse_config
from fishserve.eval.fidelity import Fidelity, TeacherForced, compare, teacher_forced
from fishserve.eval.generate import Generation, Prompt, generate
from fishserve.eval.mcd import mcd_frames
from fishserve.eval.measure import DeviceMemory, loaded_bytes
from fishserve.eval.report import write_eval_report
from fishserve.eval.variants import Loaded, ModelSource, load_config
from fishserve.models.loading import resolve_device
from fishserve.progress import progress_bar
from fishserve.synthesis import decode_codes

WARMUP_FRAMES = 4
DEFAULT_SHORT_TEXT = "Good morning, and welcome aboard."
DEFAULT_LONG_TEXT = (
    "When the storm finally passed, the village came out to count the damage. A few roof "
    "tiles lay scattered across the square, and the little bridge was covered in branches."
)


@dataclass
class EvalOptions:
    """Everything one run needs (see `fishserve eval --help`).

    Attributes:
        short_seconds, long_seconds: audio length of the two requests (frames are rounded).
        params: sampling settings (the seed is `seed`).
    """

    source: ModelSource
    configs: list[EvalConfig]
    reference: EvalConfig = field(default_factory=lambda: parse_config("fp32/fp32"))
    device: str = "auto"
    short_text: str = DEFAULT_SHORT_TEXT
    long_text: str = DEFAULT_LONG_TEXT
    short_seconds: float = 2.0
    long_seconds: float = 30.0
    seed: int = 42
    params: SamplingParams = field(default_factory=SamplingParams)
    output_dir: Path = Path("eval_out")


@dataclass
class Outputs:
    """A configuration's generations and decoded audio, by request name."""

    generations: dict[str, Generation]
    audio: dict[str, np.ndarray]


@dataclass
class ConfigResult:
    """One row of the report.

    Attributes:
        load_bytes: allocated after loading model, KV pool and decoder.
        load_breakdown: tensor bytes of each part.
        peak_bytes: per request, peak allocated during generation and decoding.
        ms_per_frame: long request's generation time / engine frames (batch 1).
        mcd_same_db: MCD of this decoder on the reference codes vs the reference audio.
        mcd_own_db: MCD of this configuration's own generation vs the reference audio.
        first_divergence: per request, first frame whose own codes differ from the
            reference's (None: identical).
        error: why the configuration could not be evaluated (other fields then empty).
    """

    config: str
    load_bytes: int | None = None
    load_breakdown: dict[str, int] = field(default_factory=dict)
    peak_bytes: dict[str, int | None] = field(default_factory=dict)
    ms_per_frame: float | None = None
    frames: dict[str, int] = field(default_factory=dict)
    fidelity: Fidelity | None = None
    mcd_same_db: float | None = None
    mcd_own_db: float | None = None
    first_divergence: dict[str, int | None] = field(default_factory=dict)
    error: str | None = None


@dataclass
class Reference:
    """The reference pass: its outputs and its teacher-forced logits."""

    config: EvalConfig
    outputs: Outputs
    logits: list[TeacherForced]
    sample_rate: int


def decode(loaded: Loaded, codes: torch.Tensor) -> np.ndarray:
    """Waveform of codes (nc, n) through the configuration's decoder."""
    return decode_codes(loaded.decoder, codes)


def make_prompts(opts: EvalOptions, loaded: Loaded) -> list[Prompt]:
    """The short and long request, with frame counts at the decoder's frame rate."""
    cfg = loaded.decoder.config
    rate = cfg.frame_rate
    return [
        Prompt("short", opts.short_text, max(1, round(opts.short_seconds * rate))),
        Prompt("long", opts.long_text, max(1, round(opts.long_seconds * rate))),
    ]


def run_requests(
    opts: EvalOptions, loaded: Loaded, memory: DeviceMemory, result: ConfigResult | None
) -> Outputs:
    """Generate and decode both requests (timed and peak-measured into `result`)."""
    # First kernels and allocations, not timed (on every device: on a CPU the first
    # configuration's timing otherwise carried one-time costs, 4-10x its later runs).
    warmup = Prompt("warmup", opts.short_text, WARMUP_FRAMES)
    generate(loaded.engine, warmup, opts.seed, opts.params)
    outputs = Outputs({}, {})
    for prompt in make_prompts(opts, loaded):
        memory.reset_peak()
        gen = generate(loaded.engine, prompt, opts.seed, opts.params)
        outputs.generations[prompt.name] = gen
        outputs.audio[prompt.name] = decode(loaded, gen.codes)
        if result is not None:
            result.peak_bytes[prompt.name] = memory.peak()
            result.frames[prompt.name] = gen.codes.shape[1]
    if result is not None:
        long = outputs.generations["long"]
        result.ms_per_frame = 1000.0 * long.seconds / long.engine_frames
    return outputs


def logits_on(
    loaded: Loaded, config: EvalConfig, ref: Outputs, block_size: int
) -> list[TeacherForced]:
    """Teacher-forced logits of both requests on the reference's codes."""
    return [
        teacher_forced(loaded.model, g.prompt, g.codes, config.kv, block_size)
        for g in ref.generations.values()
    ]


def first_divergence(ref: torch.Tensor, own: torch.Tensor) -> int | None:
    """First frame index where two code arrays (nc, n) differ, or None if identical."""
    n = min(ref.shape[1], own.shape[1])
    differs = (ref[:, :n] != own[:, :n]).any(0).nonzero()
    if differs.numel():
        return int(differs[0])
    return None if ref.shape[1] == own.shape[1] else n


def pooled_mcd(ref: dict[str, np.ndarray], test: dict[str, np.ndarray], rate: int) -> float:
    """Mean per-frame MCD (dB) over the frames of all requests."""
    frames = [mcd_frames(ref[name], test[name], rate) for name in ref]
    return float(np.mean(np.concatenate(frames)))


def run_reference(opts: EvalOptions, device: torch.device) -> Reference:
    """Generate, decode and teacher-force the reference configuration."""
    memory = DeviceMemory(device)
    memory.start()
    loaded = load_config(opts.source, opts.reference, device)
    outputs = run_requests(opts, loaded, memory, None)
    logits = logits_on(loaded, opts.reference, outputs, opts.source.block_size)
    rate = loaded.decoder.config.sample_rate
    return Reference(opts.reference, outputs, logits, rate)


def evaluate(
    opts: EvalOptions, config: EvalConfig, ref: Reference, device: torch.device
) -> ConfigResult:
    """Measure one configuration against the reference."""
    result = ConfigResult(config.name)
    memory = DeviceMemory(device)
    memory.start()
    loaded = load_config(opts.source, config, device)
    breakdown = loaded_bytes(loaded)
    result.load_breakdown = breakdown
    allocated = memory.allocated()
    result.load_bytes = sum(breakdown.values()) if allocated is None else allocated
    own = run_requests(opts, loaded, memory, result)
    result.fidelity = compare(
        ref.logits, logits_on(loaded, config, ref.outputs, opts.source.block_size)
    )
    same_audio = {n: decode(loaded, g.codes) for n, g in ref.outputs.generations.items()}
    result.mcd_same_db = pooled_mcd(ref.outputs.audio, same_audio, ref.sample_rate)
    result.mcd_own_db = pooled_mcd(ref.outputs.audio, own.audio, ref.sample_rate)
    result.first_divergence = {
        n: first_divergence(g.codes, own.generations[n].codes)
        for n, g in ref.outputs.generations.items()
    }
    return result


def evaluate_safely(
    opts: EvalOptions, config: EvalConfig, ref: Reference, device: torch.device, console: Console
) -> ConfigResult:
    """`evaluate`, turning a failure of this configuration into a row with its error."""
    try:
        return evaluate(opts, config, ref, device)
    except (RuntimeError, ValueError, NotImplementedError, TypeError) as exc:
        console.print(f"[yellow]{config.name} failed:[/] {exc}", highlight=False)
        return ConfigResult(config.name, error=f"{type(exc).__name__}: {exc}"[:300])
    finally:
        DeviceMemory(device).start()  # free the configuration's memory


def run_eval(opts: EvalOptions, console: Console) -> list[ConfigResult]:
    """Evaluate every configuration; write eval.json, eval.md and eval.png.

    Raises:
        ValueError, FileNotFoundError: bad options or model files.
    """
    device = resolve_device(opts.device)
    configs = list(dict.fromkeys([opts.reference, *opts.configs]))
    with _progress(console) as progress:
        task = progress.add_task("reference " + opts.reference.name, total=len(configs) + 1)
        ref = run_reference(opts, device)
        results = []
        for config in configs:
            progress.update(task, advance=1, description=config.name)
            results.append(evaluate_safely(opts, config, ref, device, console))
        progress.update(task, advance=1, description="done")
    paths, note = write_eval_report(opts, ref, results, device, opts.output_dir)
    if note is not None:
        console.print(note, highlight=False, markup=False)
    console.print(f"wrote {', '.join(str(p) for p in paths)}", highlight=False, markup=False)
    return results


def _progress(console: Console) -> Progress:
    return progress_bar(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
