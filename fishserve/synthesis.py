"""What the `synth`, `encode` and `decode` commands do, as plain functions.

Kept apart from `cli.py` so the command-line parsing stays thin and these steps can be tested
and reused directly.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from fishserve.audio.io import load_audio, write_wav
from fishserve.engine.engine import EngineConfig, GenerationRequest, LLMEngine
from fishserve.engine.long_text import generate_long, plan_long_text
from fishserve.engine.reference import generate
from fishserve.engine.sampling import SamplingParams
from fishserve.models.dual_ar import DualARTransformer
from fishserve.models.firefly import FireflyGenerator, load_firefly
from fishserve.models.loading import load_text2semantic, resolve_device, resolve_dtype
from fishserve.models.prompt import Reference
from fishserve.models.tokenizer import FishTokenizer

log = logging.getLogger(__name__)

DEFAULT_MAX_NEW_TOKENS = 1024  # per segment, as the reference HTTP API (spec §5)
# Random weights rarely sample <|im_end|>: cap a segment at ~3 s of audio.
DUMMY_MAX_NEW_TOKENS = 64
DECODER_FILENAME = "firefly-gan-vq-fsq-8x1024-21hz-generator.pth"
RANDOM_WEIGHTS_WARNING = (
    "[bold yellow]WARNING: no checkpoint given: using RANDOM weights. The output is noise, "
    "not speech.[/] Download the real model with `huggingface-cli download "
    "fishaudio/fish-speech-1.5 --local-dir checkpoints/fish-speech-1.5` and pass "
    "--checkpoint checkpoints/fish-speech-1.5."
)


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
    """Read an int codes array (nc, T) from .npy.

    Raises:
        FileNotFoundError, ValueError: missing file, wrong dtype/shape, negative codes.
    """
    if not path.is_file():
        raise FileNotFoundError(f"codes file not found: {path}")
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
    if codes.min() < 0:
        raise ValueError(f"{path}: codes must be >= 0")
    return torch.from_numpy(codes.astype(np.int64))


def encode_reference(decoder: FireflyGenerator, audio_path: Path) -> torch.Tensor:
    """Encode a reference audio file into codes (nc, T) int64 (spec §4.6)."""
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


def run_synth(opts: SynthesisOptions, console: Console) -> None:
    """Text -> codes (engine, or the reference loop) -> waveform -> WAV file."""
    if not opts.text.strip():
        raise ValueError("--text is empty: nothing to synthesize")
    device = resolve_device(opts.device)
    dummy = opts.checkpoint is None or opts.load_format == "dummy"
    if dummy:
        console.print(RANDOM_WEIGHTS_WARNING)
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
        load_references(opts, decoder, model.config.num_codebooks),
        SamplingParams(opts.temperature, opts.top_p, opts.repetition_penalty, opts.seed),
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
    write_wav(opts.output, wave, decoder.config.sample_rate)
    seconds = len(wave) / decoder.config.sample_rate
    elapsed = time.perf_counter() - start
    console.print(
        f"wrote {opts.output}: {seconds:.2f} s of audio ({codes.shape[1]} frames) in "
        f"{elapsed:.1f} s (RTF {elapsed / seconds:.2f})"
    )


def load_references(
    opts: SynthesisOptions, decoder: FireflyGenerator, num_codebooks: int
) -> list[Reference]:
    """The reference voice of `--reference-audio` or `--reference-codes`, if any.

    Raises:
        ValueError: both were given, or the file is invalid.
    """
    if opts.reference_audio is not None and opts.reference_codes is not None:
        raise ValueError("give --reference-audio or --reference-codes, not both")
    if opts.reference_audio is not None:
        return [Reference(encode_reference(decoder, opts.reference_audio), opts.reference_text)]
    if opts.reference_codes is not None:
        codes = read_codes(opts.reference_codes, num_codebooks)
        return [Reference(codes, opts.reference_text)]
    return []


def generate_with_reference_loop(
    model: DualARTransformer, tokenizer: FishTokenizer, request: GenerationRequest, console: Console
) -> torch.Tensor:
    """All segments through the batch-1 reference loop; codes (nc, frames) on CPU."""
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
        task = progress.add_task("generating (reference loop)", total=len(plan.segments))
        for codes in generate_long(plan, one_segment):
            segments.append(codes.cpu())
            progress.advance(task)
    return torch.cat(segments, dim=1)


def generate_with_engine(
    engine: LLMEngine, request: GenerationRequest, console: Console
) -> torch.Tensor:
    """One request through the paged-KV engine; codes (nc, frames) on CPU.

    Raises:
        RuntimeError: the engine reported an error for the request.
    """
    seq = engine.prepare(request)
    engine.enqueue(seq)
    frames = []
    with _progress(console) as progress:
        task = progress.add_task("generating", total=len(seq.plan.segments))
        while engine.has_work():
            for event in engine.step():
                if event.codes is not None:
                    frames.append(event.codes)
                if event.finish_reason == "error":
                    raise RuntimeError(event.error)
            progress.update(task, completed=seq.segment + int(not engine.has_work()))
    if not frames:
        return torch.zeros(engine.model.config.num_codebooks, 0, dtype=torch.int64)
    return torch.stack(frames, dim=1)


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} segments"),
        TimeElapsedColumn(),
        console=console,
    )


def run_encode(
    audio: Path,
    output: Path,
    decoder_checkpoint: Path,
    decoder_config: Path | None,
    device: str,
    console: Console,
) -> None:
    """Audio file -> codes .npy (num_codebooks, T) int32."""
    decoder = load_decoder(
        decoder_checkpoint, decoder_config, None, resolve_device(device), dummy=False
    )
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
) -> None:
    """Codes .npy -> .wav (16-bit) or .npy (float32 waveform)."""
    decoder = load_decoder(
        decoder_checkpoint, decoder_config, None, resolve_device(device), dummy=False
    )
    codes = read_codes(codes_path)
    groups = decoder.config.quantizer.n_groups
    if codes.shape[0] != groups:
        raise ValueError(f"{codes_path}: {codes.shape[0]} codebooks, the decoder needs {groups}")
    wave = decode_codes(decoder, codes)
    if output.suffix == ".npy":
        np.save(output, wave.astype(np.float32))
    else:
        write_wav(output, wave, decoder.config.sample_rate)
    console.print(f"wrote {output}: {len(wave) / decoder.config.sample_rate:.2f} s")
