"""The `fishserve` command line: synth, encode, decode (and later serve, bench, eval).

Every command turns expected failures (missing files, bad shapes, bad values) into one red
line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console

from fishserve.errors import USER_ERRORS

app = typer.Typer(
    name="fishserve",
    help="Serve and run the Fish Speech 1.5 text-to-speech model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., None])

DeviceOpt = Annotated[str, typer.Option(help="Torch device: auto, cpu, cuda, cuda:N.")]
DtypeOpt = Annotated[
    str, typer.Option(help="Weight dtype: auto (bf16 on GPU, fp32 on CPU), fp32, bf16, fp16.")
]
DecoderCkptOpt = Annotated[
    Path | None,
    typer.Option(
        "--decoder-checkpoint",
        help="Firefly generator weights (firefly-gan-vq-fsq-8x1024-21hz-generator.pth). "
        "Default: the file of that name inside --checkpoint.",
    ),
]
DecoderCfgOpt = Annotated[
    Path | None,
    typer.Option(
        "--decoder-config", help="Decoder config (official yaml/json); default: released."
    ),
]


def user_errors(func: F) -> F:
    """Run a command, turning expected errors into one clear line and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: object, **kwargs: object) -> None:
        try:
            func(*args, **kwargs)
        except USER_ERRORS as exc:
            err_console.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True)
            raise typer.Exit(code=2) from None

    return wrapper  # type: ignore[return-value]


@app.callback()
def _setup(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@app.command()
@user_errors
def synth(
    text: Annotated[str, typer.Option(help="Text to speak.")],
    output: Annotated[Path, typer.Option(help="Output .wav file (44.1 kHz, 16-bit mono).")],
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            help="Official checkpoint folder (config.json, model.pth, "
            "tokenizer.tiktoken). Omit to use random weights (noise, for testing)."
        ),
    ] = None,
    decoder_checkpoint: DecoderCkptOpt = None,
    decoder_config: DecoderCfgOpt = None,
    load_format: Annotated[
        str, typer.Option(help="auto (files) or dummy (full-size random weights).")
    ] = "auto",
    reference_audio: Annotated[
        Path | None, typer.Option(help="Reference voice audio (wav, flac, mp3, ogg, m4a).")
    ] = None,
    reference_codes: Annotated[
        Path | None, typer.Option(help="Reference voice codes .npy (num_codebooks, T).")
    ] = None,
    reference_text: Annotated[str, typer.Option(help="Transcript of the reference.")] = "",
    chunk_length: Annotated[int, typer.Option(help="Segment size in UTF-8 bytes.")] = 100,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(
            help="Frame budget per segment (0 = until the context ends). "
            "Default 1024, or 64 with random weights."
        ),
    ] = None,
    max_length: Annotated[int, typer.Option(help="History window budget (positions).")] = 2048,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.7,
    temperature: Annotated[float, typer.Option()] = 0.7,
    repetition_penalty: Annotated[float, typer.Option()] = 1.2,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 42,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    codes_output: Annotated[
        Path | None, typer.Option(help="Also write the codes (num_codebooks, frames) as .npy.")
    ] = None,
    kv_cache_dtype: Annotated[
        str, typer.Option(help="KV cache: auto (= weights), fp32, bf16, fp16, int8, fp8.")
    ] = "auto",
    block_size: Annotated[int, typer.Option(min=1, help="Positions per KV block.")] = 16,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="Engine batch cap.")] = 8,
    reference_loop: Annotated[
        bool, typer.Option(help="Use the simple batch-1 loop instead of the engine.")
    ] = False,
) -> None:
    """Synthesize speech from text into a WAV file."""
    from fishserve.synthesis import SynthesisOptions, run_synth

    run_synth(
        SynthesisOptions(
            text=text,
            output=output,
            checkpoint=checkpoint,
            decoder_checkpoint=decoder_checkpoint,
            decoder_config=decoder_config,
            load_format=load_format,
            reference_audio=reference_audio,
            reference_codes=reference_codes,
            reference_text=reference_text,
            chunk_length=chunk_length,
            max_new_tokens=max_new_tokens,
            max_length=max_length,
            top_p=top_p,
            temperature=temperature,
            repetition_penalty=repetition_penalty,
            seed=seed,
            device=device,
            dtype=dtype,
            codes_output=codes_output,
        ),
        console=err_console,
    )


@app.command()
@user_errors
def encode(
    audio: Annotated[Path, typer.Option(help="Audio file (any container) or float .npy.")],
    output: Annotated[Path, typer.Option(help="Output codes .npy (num_codebooks, T) int.")],
    decoder_checkpoint: DecoderCkptOpt = None,
    decoder_config: DecoderCfgOpt = None,
    device: DeviceOpt = "auto",
) -> None:
    """Encode audio into Firefly codes (for reference voices)."""
    from fishserve.synthesis import run_encode

    run_encode(audio, output, decoder_checkpoint, decoder_config, device, err_console)


@app.command()
@user_errors
def decode(
    codes: Annotated[Path, typer.Option(help="Codes .npy (num_codebooks, T) int.")],
    output: Annotated[Path, typer.Option(help="Output .wav, or .npy (float32 waveform).")],
    decoder_checkpoint: DecoderCkptOpt = None,
    decoder_config: DecoderCfgOpt = None,
    device: DeviceOpt = "auto",
) -> None:
    """Decode Firefly codes into a 44.1 kHz waveform."""
    from fishserve.synthesis import run_decode

    run_decode(codes, output, decoder_checkpoint, decoder_config, device, err_console)


@app.command()
@user_errors
def serve(
    config: Annotated[Path | None, typer.Option(help="YAML file with server settings.")] = None,
    checkpoint: Annotated[Path | None, typer.Option(help="Official checkpoint folder.")] = None,
    decoder_checkpoint: DecoderCkptOpt = None,
    decoder_config: DecoderCfgOpt = None,
    load_format: Annotated[str | None, typer.Option(help="auto or dummy.")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda, cuda:N.")] = None,
    dtype: Annotated[str | None, typer.Option(help="auto, fp32, bf16, fp16.")] = None,
    kv_cache_dtype: Annotated[
        str | None, typer.Option(help="auto, fp32, bf16, fp16, int8, fp8.")
    ] = None,
    memory_budget: Annotated[
        str | None,
        typer.Option(
            "--gpu-memory-budget",
            "--memory-budget",
            help="e.g. 6GiB, or a fraction of the GPU like 0.9.",
        ),
    ] = None,
    max_num_seqs: Annotated[int | None, typer.Option(help="Running requests at most.")] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option()] = None,
    block_size: Annotated[int | None, typer.Option(help="Positions per KV block.")] = None,
    num_kv_blocks: Annotated[int | None, typer.Option(help="Fixed KV pool size.")] = None,
    enforce_eager: Annotated[
        bool | None, typer.Option(help="No CUDA graphs (accepted; graphs come later).")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Listen address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port (default 8080).")] = None,
    api_key: Annotated[
        str | None, typer.Option(help="Require 'Authorization: Bearer KEY'.")
    ] = None,
    references_dir: Annotated[Path | None, typer.Option(help="Stored voices folder.")] = None,
    max_waiting: Annotated[int | None, typer.Option(help="Queue bound before 429.")] = None,
    lazy_load: Annotated[bool | None, typer.Option(help="Load models on first request.")] = None,
    idle_unload_seconds: Annotated[
        float | None, typer.Option(help="Unload models after this idle time (0 = never).")
    ] = None,
) -> None:
    """Run the HTTP server (Fish /v1/tts, OpenAI /v1/audio/speech, voices, health, metrics).

    Settings come from --config YAML, then FISHSERVE_<KEY> environment variables, then flags.
    """
    import uvicorn

    from fishserve.server.app import create_app
    from fishserve.server.config import ServerConfig

    overrides = {
        k: v
        for k, v in locals().items()
        if k not in ("config", "uvicorn", "create_app", "ServerConfig")
    }
    settings = ServerConfig.load(config, overrides)
    if settings.checkpoint is None or settings.load_format == "dummy":
        err_console.print(RANDOM_WEIGHTS_NOTE)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")


RANDOM_WEIGHTS_NOTE = (
    "[bold yellow]WARNING: serving RANDOM weights (no --checkpoint): audio is noise.[/] "
    "Use --checkpoint checkpoints/fish-speech-1.5 for speech."
)


def main() -> None:
    """Console-script entry point."""
    app()
