"""What the `synth`, `encode` and `decode` commands do, as plain functions.

Kept apart from `cli.py` so the command-line parsing stays thin and these steps can be tested
and reused directly.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from fishserve.audio.io import (
    AUDIO_OUTPUT_SUFFIXES,
    NPY_MAGIC,
    check_output_path,
    load_audio,
    write_audio,
)
from fishserve.engine.engine import EngineConfig, GenerationRequest, LLMEngine
from fishserve.engine.kv_cache import KV_CACHE_DTYPES
from fishserve.engine.long_text import generate_long, plan_long_text
from fishserve.engine.reference import generate
from fishserve.engine.sampling import MIN_TEMPERATURE, SamplingParams
from fishserve.errors import GenerationError
from fishserve.models.config import DECODER_FILENAME, check_weight_files
from fishserve.models.dual_ar import DualARTransformer
from fishserve.models.firefly import FireflyGenerator, load_firefly
from fishserve.models.firefly.config import SpecConfig
from fishserve.models.loading import load_text2semantic, resolve_device, resolve_dtype
from fishserve.models.prompt import Reference
from fishserve.models.tokenizer import FishTokenizer
from fishserve.progress import progress_bar
from fishserve.server.config import DEFAULT_MAX_NEW_TOKENS, RANDOM_WEIGHTS_MAX_NEW_TOKENS

log = logging.getLogger(__name__)

DUMMY_MAX_NEW_TOKENS = RANDOM_WEIGHTS_MAX_NEW_TOKENS  # 64: random weights rarely stop
# Two short lines (printed without wrapping), shared by `synth` and `serve`.
RANDOM_WEIGHTS_WARNING = (
    "[bold yellow]WARNING: RANDOM weights: the audio is noise, not speech.[/]\n"
    "For speech: --checkpoint checkpoints/fish-speech-1.5 (README: Real weights)."
)
CODES_SUFFIXES = (".npy",)
REFERENCE_RATE: int = SpecConfig.sample_rate  # Hz: the Firefly decoder's default (1.5's)
# Codes a file may hold: the semantic codebook of Fish Speech 1.5 (`DualARConfig.codebook_size`,
# 1024); the decoder reads ids of 1000 and up modulo its 1000 FSQ codes, as the reference does.
MAX_CODE = 1024


@dataclass
class SynthesisOptions:
    """All inputs of `fishserve synth` (see `fishserve synth --help` for meanings)."""

    text: str
    output: Path
    checkpoint: Path | None = None
    decoder_checkpoint: Path | None = None
    decoder_config: Path | None = None
    load_format: str = "auto"
    reference_audio: Path | None = None
    reference_codes: Path | None = None
    reference_text: str = ""
    chunk_length: int = 100
    max_new_tokens: int | None = None
    max_length: int = 2048
    top_p: float = 0.7
    temperature: float = 0.7
    repetition_penalty: float = 1.2
    seed: int = 42
    device: str = "auto"
    dtype: str = "auto"
    codes_output: Path | None = None
    reference_loop: bool = False
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    max_num_seqs: int = 8


def load_decoder(
    decoder_checkpoint: Path | None,
    decoder_config: Path | None,
    checkpoint: Path | None,
    device: torch.device,
    dummy: bool,
    dtype: torch.dtype = torch.float32,
) -> FireflyGenerator:
    """The Firefly decoder: from `decoder_checkpoint`, else the checkpoint folder's generator
    file, else random weights when `dummy`.

    Raises:
        FileNotFoundError: no decoder weights were found and `dummy` is False.
    """
    if decoder_checkpoint is None and checkpoint is not None:
        candidate = checkpoint / DECODER_FILENAME
        decoder_checkpoint = candidate if candidate.is_file() else None
    if decoder_checkpoint is None:
        if not dummy:
            raise FileNotFoundError(
                f"no decoder weights: pass --decoder-checkpoint or put {DECODER_FILENAME} "
                "in the checkpoint folder"
            )
        return load_firefly(None, decoder_config, device=device, dtype=dtype, load_format="dummy")
    return load_firefly(decoder_checkpoint, decoder_config, device=device, dtype=dtype)


def read_codes(path: Path, num_codebooks: int | None = None) -> torch.Tensor:
    """Read an int codes array (nc, T) from .npy, each code in ``[0, MAX_CODE)``.

    Raises:
        FileNotFoundError, ValueError: missing file, wrong dtype/shape, codes out of range.
    """
    if not path.is_file():
        raise FileNotFoundError(f"codes file not found: {path}")
    with path.open("rb") as f:
        if f.read(len(NPY_MAGIC)) != NPY_MAGIC:
            raise ValueError(f"{path} is not a .npy file (it does not start with NumPy's header)")
    try:
        codes = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise ValueError(f"{path} is not a .npy array: {exc}") from exc
    if codes.ndim != 2 or not np.issubdtype(codes.dtype, np.integer) or codes.shape[1] == 0:
        raise ValueError(
            f"{path}: codes must be a non-empty integer array (num_codebooks, T), "
            f"got {codes.dtype} {codes.shape}"
        )
    if num_codebooks is not None and codes.shape[0] < num_codebooks:
        raise ValueError(f"{path}: {codes.shape[0]} codebooks, the model needs {num_codebooks}")
    low, high = int(codes.min()), int(codes.max())  # Python ints: uint64 does not wrap
    if low < 0 or high >= MAX_CODE:
        raise ValueError(f"{path}: codes must lie in [0, {MAX_CODE}), got {low}..{high}")
    return torch.from_numpy(codes.astype(np.int64))


def encode_reference(decoder: FireflyGenerator, audio_path: Path | np.ndarray) -> torch.Tensor:
    """Encode a reference audio file, or its ``(N,)`` float32 samples already at the decoder's
    rate, into codes (nc, T) int64 (spec §4.6)."""
    audio = audio_path
    if not isinstance(audio, np.ndarray):
        audio = load_audio(audio_path, target_sr=decoder.config.sample_rate)
    wave = torch.from_numpy(audio).to(decoder.device)[None, None]  # mel runs in fp32
    with torch.inference_mode():
        codes, _ = decoder.encode(wave, torch.tensor([wave.shape[-1]], device=decoder.device))
    return codes[0].cpu()


def decode_codes(decoder: FireflyGenerator, codes: torch.Tensor) -> np.ndarray:
    """Decode codes (nc, T) into a float32 waveform (T * frame_samples,) in [-1, 1]."""
    codes = codes.to(decoder.device)[None]
    with torch.inference_mode():
        wave, _ = decoder.decode(codes, torch.tensor([codes.shape[-1]], device=decoder.device))
    return wave[0, 0].float().cpu().numpy()


def check_synth_options(opts: SynthesisOptions) -> None:
    """Everything about `opts` that can be checked before loading the models.

    Raises:
        ValueError: empty text, bad or non-finite numbers, an unknown KV cache dtype, an
            unsupported output extension, both references given, a reference transcript
            without a reference.
        FileNotFoundError, PermissionError: a missing input, or an output that cannot be
            written.
    """
    if not opts.text.strip():
        raise ValueError("--text is empty: nothing to synthesize")
    if opts.max_new_tokens is not None and (opts.max_new_tokens < 0 or opts.max_new_tokens == 1):
        raise ValueError(
            f"--max-new-tokens must be >= 2 (the first frame is never audio) or 0 (until the "
            f"context is full), got {opts.max_new_tokens}"
        )
    for option, value in (
        ("--temperature", opts.temperature),
        ("--top-p", opts.top_p),
        ("--repetition-penalty", opts.repetition_penalty),
    ):
        if not math.isfinite(value):
            raise ValueError(f"{option} must be a finite number, got {value}")
    if opts.temperature < 0:
        raise ValueError(f"--temperature must be >= 0 (0 = greedy), got {opts.temperature}")
    if opts.kv_cache_dtype not in KV_CACHE_DTYPES:
        choices = ", ".join(KV_CACHE_DTYPES)
        raise ValueError(f"--kv-cache-dtype {opts.kv_cache_dtype!r}: use one of {choices}")
    if opts.reference_text and opts.reference_audio is None and opts.reference_codes is None:
        raise ValueError(
            "--reference-text transcribes a voice reference: give --reference-audio or "
            "--reference-codes with it"
        )
    check_output_path(opts.output, "--output", AUDIO_OUTPUT_SUFFIXES)
    if opts.codes_output is not None:
        check_output_path(opts.codes_output, "--codes-output", CODES_SUFFIXES)
        if Path(opts.codes_output).resolve() == Path(opts.output).resolve():
            raise ValueError(f"--codes-output {opts.codes_output} is --output too: give two files")
    if opts.reference_audio is not None and opts.reference_codes is not None:
        raise ValueError("give --reference-audio or --reference-codes, not both")
    for option, path in (
        ("--reference-audio", opts.reference_audio),
        ("--reference-codes", opts.reference_codes),
    ):
        if path is not None and not path.is_file():
            raise FileNotFoundError(f"{option} file not found: {path}")
    check_model_files(opts)


def check_model_files(opts: SynthesisOptions) -> None:
    """The checkpoint folder and decoder weights exist (before anything loads).

    Raises:
        FileNotFoundError: a missing folder or file, or no decoder weights with real weights.
    """
    real_weights = opts.load_format != "dummy"
    check_weight_files(opts.checkpoint, opts.decoder_checkpoint, real_weights)


def sampling_params(opts: SynthesisOptions) -> SamplingParams:
    """The sampling settings of `opts`; temperature 0 means greedy, as in the HTTP API."""
    temperature = max(opts.temperature, MIN_TEMPERATURE)
    return SamplingParams(temperature, opts.top_p, opts.repetition_penalty, opts.seed)


NO_TRANSCRIPT_WARNING = (
    "[yellow]warning:[/] no --reference-text: the reference is used with an empty transcript, "
    "which usually clones the voice worse"
)


def run_synth(opts: SynthesisOptions, console: Console) -> None:
    """Text -> codes (engine, or the reference loop) -> waveform -> audio file (by extension).

    Inputs and outputs are checked before the models load (`check_synth_options`).
    """
    check_synth_options(opts)
    reference_wave = None  # decoded before the models load, so a bad file fails at once
    if opts.reference_audio is not None:
        reference_wave = load_audio(opts.reference_audio, target_sr=REFERENCE_RATE)
    if (opts.reference_audio or opts.reference_codes) and not opts.reference_text:
        console.print(NO_TRANSCRIPT_WARNING, soft_wrap=True)
    params = sampling_params(opts)
    device = resolve_device(opts.device)
    dummy = opts.checkpoint is None or opts.load_format == "dummy"
    if dummy:
        console.print(RANDOM_WEIGHTS_WARNING, soft_wrap=True)
    model, tokenizer = load_text2semantic(
        opts.checkpoint,
        device=device,
        dtype=resolve_dtype(opts.dtype, device),
        load_format="dummy" if dummy else opts.load_format,
    )
    decoder = load_decoder(
        opts.decoder_checkpoint, opts.decoder_config, opts.checkpoint, device, dummy
    )
    max_new_tokens = opts.max_new_tokens
    if max_new_tokens is None:
        max_new_tokens = DUMMY_MAX_NEW_TOKENS if dummy else DEFAULT_MAX_NEW_TOKENS
    request = GenerationRequest(
        opts.text,
        load_references(opts, decoder, model.config.num_codebooks, reference_wave),
        params,
        opts.chunk_length,
        max_new_tokens,
        opts.max_length,
    )
    start = time.perf_counter()
    if opts.reference_loop:
        codes = generate_with_reference_loop(model, tokenizer, request, console)
    else:
        engine = LLMEngine(
            model,
            tokenizer,
            EngineConfig(
                kv_cache_dtype=opts.kv_cache_dtype,
                block_size=opts.block_size,
                max_num_seqs=opts.max_num_seqs,
            ),
        )
        codes = generate_with_engine(engine, request, console)
    if codes.shape[1] == 0:
        raise ValueError("the model produced no audio frames (try a larger --max-new-tokens)")
    if opts.codes_output is not None:
        np.save(opts.codes_output, codes.numpy())
    wave = decode_codes(decoder, codes)
    write_audio(opts.output, wave, decoder.config.sample_rate)
    seconds = len(wave) / decoder.config.sample_rate
    elapsed = time.perf_counter() - start
    console.print(
        f"wrote {opts.output}: {seconds:.2f} s of audio ({codes.shape[1]} frames) in "
        f"{elapsed:.1f} s (RTF {format_rtf(elapsed, seconds)})"
    )


def format_rtf(elapsed: float, audio_seconds: float) -> str:
    """Real-time factor `elapsed / audio_seconds` with 2 decimals, or "n/a" without audio."""
    return f"{elapsed / audio_seconds:.2f}" if audio_seconds > 0 else "n/a"


def load_references(
    opts: SynthesisOptions,
    decoder: FireflyGenerator,
    num_codebooks: int,
    reference_wave: np.ndarray | None = None,
) -> list[Reference]:
    """The reference voice of `--reference-audio` or `--reference-codes`, if any (not both:
    `check_synth_options`).

    Args:
        reference_wave: `--reference-audio` already decoded, ``(N,)`` float32 at
            `REFERENCE_RATE` Hz; used where that is the decoder's rate (else the file is read
            again at the decoder's rate).

    Raises:
        ValueError: the file is invalid.
    """
    if opts.reference_audio is not None:
        source: Path | np.ndarray = opts.reference_audio
        if reference_wave is not None and decoder.config.sample_rate == REFERENCE_RATE:
            source = reference_wave
        return [Reference(encode_reference(decoder, source), opts.reference_text)]
    if opts.reference_codes is not None:
        codes = read_codes(opts.reference_codes, num_codebooks)
        return [Reference(codes, opts.reference_text)]
    return []


def generate_with_reference_loop(
    model: DualARTransformer, tokenizer: FishTokenizer, request: GenerationRequest, console: Console
) -> torch.Tensor:
    """All segments through the batch-1 reference loop; codes (nc, frames) on CPU.

    The progress line counts frames after each segment (the loop runs a segment at once).
    """
    plan = plan_long_text(
        tokenizer,
        model.config.num_codebooks,
        request.text,
        request.references,
        request.chunk_length,
        request.max_length,
    )
    seed = request.params.resolved_seed()

    def one_segment(prompt: torch.Tensor, index: int) -> torch.Tensor:
        return generate(
            model,
            prompt,
            request.params,
            tokenizer.im_end_id,
            request.max_new_tokens,
            seed=seed,
            segment=index,
        )

    segments = []
    with _progress(console) as progress:
        task = _add_task(progress, "generating (reference loop)", len(plan.segments))
        for codes in generate_long(plan, one_segment):
            segments.append(codes.cpu())
            frames = sum(c.shape[1] for c in segments)
            progress.update(task, advance=1, frames=frames)
    return torch.cat(segments, dim=1)


def generate_with_engine(
    engine: LLMEngine, request: GenerationRequest, console: Console
) -> torch.Tensor:
    """One request through the paged-KV engine; codes (nc, frames) on CPU.

    The progress line shows the segment and a live count of the audio frames generated.

    Raises:
        GenerationError: the engine reported an error for the request.
    """
    seq = engine.prepare(request)
    engine.enqueue(seq)
    frames = []
    with _progress(console) as progress:
        task = _add_task(progress, "generating", len(seq.plan.segments))
        while engine.has_work():
            for event in engine.step():
                if event.codes is not None:
                    frames.append(event.codes)
                if event.finish_reason == "error":
                    raise GenerationError(event.error or "generation failed")
            done = seq.segment + int(not engine.has_work())
            progress.update(task, completed=done, frames=len(frames))
    if not frames:
        return torch.zeros(engine.model.config.num_codebooks, 0, dtype=torch.int64)
    return torch.from_numpy(np.stack(frames, axis=1))


def _progress(console: Console) -> Progress:
    """A progress line: description, bar, segment, frames generated so far, elapsed time."""
    return progress_bar(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("segment {task.completed}/{task.total}"),
        TextColumn("{task.fields[frames]} frames"),
        TimeElapsedColumn(),
        console=console,
    )


def _add_task(progress: Progress, description: str, segments: int) -> TaskID:
    """A task of `segments` steps with a `frames` field (0 to start with)."""
    return progress.add_task(description, total=segments, frames=0)


def run_encode(
    audio: Path,
    output: Path,
    decoder_checkpoint: Path,
    decoder_config: Path | None,
    device: str,
    console: Console,
    dtype: str = "auto",
) -> None:
    """Audio file -> codes .npy (num_codebooks, T) int32; files are checked before loading."""
    if not audio.is_file():
        raise FileNotFoundError(f"audio file not found: {audio}")
    check_output_path(output, "--output", CODES_SUFFIXES)
    decoder = _load_cli_decoder(decoder_checkpoint, decoder_config, device, dtype)
    codes = encode_reference(decoder, audio)
    np.save(output, codes.numpy().astype(np.int32))
    console.print(f"wrote {output}: codes {tuple(codes.shape)}")


def run_decode(
    codes_path: Path,
    output: Path,
    decoder_checkpoint: Path,
    decoder_config: Path | None,
    device: str,
    console: Console,
    dtype: str = "auto",
) -> None:
    """Codes .npy -> audio by extension (wav, flac, mp3, ogg/opus) or .npy float32 waveform.

    The codes file and the output path are checked before the decoder loads.
    """
    codes = read_codes(codes_path)
    check_output_path(output, "--output", AUDIO_OUTPUT_SUFFIXES)
    decoder = _load_cli_decoder(decoder_checkpoint, decoder_config, device, dtype)
    groups = decoder.config.quantizer.n_groups
    if codes.shape[0] != groups:
        raise ValueError(f"{codes_path}: {codes.shape[0]} codebooks, the decoder needs {groups}")
    wave = decode_codes(decoder, codes)
    write_audio(output, wave, decoder.config.sample_rate)
    console.print(f"wrote {output}: {len(wave) / decoder.config.sample_rate:.2f} s")


def _load_cli_decoder(
    checkpoint: Path, config: Path | None, device: str, dtype: str
) -> FireflyGenerator:
    """The decoder of `encode`/`decode`: weights in `dtype` (auto: bf16 on GPU, fp32 on CPU)."""
    dev = resolve_device(device)
    return load_decoder(checkpoint, config, None, dev, dummy=False, dtype=resolve_dtype(dtype, dev))
