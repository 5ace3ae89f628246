"""`fishserve synth`, `encode` and `decode`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fishserve.cli import (
    AUDIO_OUTPUT_HELP,
    DecoderCfgOpt,
    DecoderCkptOpt,
    DecoderDtypeOpt,
    DeviceOpt,
    DtypeOpt,
    RequiredDecoderCkptOpt,
    ThreadsOpt,
    TopPOpt,
    app,
    err_console,
    set_threads,
    user_errors,
)


@app.command()
@user_errors
def synth(
    text: Annotated[str, typer.Option(help="Text to speak.")],
    output: Annotated[Path, typer.Option(help=AUDIO_OUTPUT_HELP)],
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
    chunk_length: Annotated[
        int,
        typer.Option(min=0, help="Segment size in UTF-8 bytes; 0 = the whole text as one segment."),
    ] = 100,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(
            help="Frames per segment: >= 2 (the first frame is never audio), or 0 = until the "
            "context is full. Default 1024, or 64 with random weights."
        ),
    ] = None,
    max_length: Annotated[
        int,
        typer.Option(
            min=1,
            help="History window of long texts (positions): earlier segments are kept while "
            "they fit max_length - 1024 - the prompt prefix (the reference's rule).",
        ),
    ] = 2048,
    top_p: TopPOpt = 0.7,
    temperature: Annotated[
        float, typer.Option(min=0.0, help="Sampling temperature; 0 = greedy (as in the API).")
    ] = 0.7,
    repetition_penalty: Annotated[
        float, typer.Option(help="Penalty on codes of the last 16 frames; 1.0 = none.")
    ] = 1.2,
    seed: Annotated[
        int, typer.Option(min=0, max=2**32 - 1, help="Sampling seed, in [0, 2^32) as in the API.")
    ] = 42,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    threads: ThreadsOpt = None,
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
    """Synthesize speech from text into an audio file (wav, flac, mp3, ogg/opus, .npy)."""
    from fishserve.synthesis import SynthesisOptions, run_synth

    set_threads(threads)
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
            reference_loop=reference_loop,
            kv_cache_dtype=kv_cache_dtype,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
        ),
        console=err_console,
    )


@app.command()
@user_errors
def encode(
    audio: Annotated[Path, typer.Option(help="Audio file (any container) or float .npy.")],
    output: Annotated[Path, typer.Option(help="Output codes .npy (num_codebooks, T) int.")],
    decoder_checkpoint: RequiredDecoderCkptOpt,
    decoder_config: DecoderCfgOpt = None,
    device: DeviceOpt = "auto",
    dtype: DecoderDtypeOpt = "auto",
    threads: ThreadsOpt = None,
) -> None:
    """Encode audio into Firefly codes (for reference voices)."""
    from fishserve.synthesis import run_encode

    set_threads(threads)
    run_encode(audio, output, decoder_checkpoint, decoder_config, device, err_console, dtype)


@app.command()
@user_errors
def decode(
    codes: Annotated[Path, typer.Option(help="Codes .npy (num_codebooks, T) int.")],
    output: Annotated[Path, typer.Option(help=AUDIO_OUTPUT_HELP)],
    decoder_checkpoint: RequiredDecoderCkptOpt,
    decoder_config: DecoderCfgOpt = None,
    device: DeviceOpt = "auto",
    dtype: DecoderDtypeOpt = "auto",
    threads: ThreadsOpt = None,
) -> None:
    """Decode Firefly codes into 44.1 kHz audio (wav, flac, mp3, ogg/opus or .npy)."""
    from fishserve.synthesis import run_decode

    set_threads(threads)
    run_decode(codes, output, decoder_checkpoint, decoder_config, device, err_console, dtype)
