"""Speech routes: Fish Speech's `POST /v1/tts` and OpenAI's `POST /v1/audio/speech`."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import ormsgpack
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from fishserve.audio.encoders import (
    AudioFormat,
    encode_audio,
    response_headers,
    stream_encoder,
)
from fishserve.engine.engine import GenerationRequest
from fishserve.engine.sampling import MIN_TEMPERATURE, SamplingParams
from fishserve.server.errors import ApiError
from fishserve.server.normalize import normalize_text
from fishserve.server.schemas import SpeechRequest, TTSRequest
from fishserve.server.service import InlineReference, resolve_references, stream_audio
from fishserve.server.state import ServerState

router = APIRouter()
# Spec §5: the reference HTTP API keeps a 4,096-position history window.
HTTP_MAX_LENGTH = 4096
DEFAULT_VOICE = "default"  # OpenAI `voice` meaning "no reference: the model's own voice"


async def parse_body(request: Request) -> Any:
    """JSON or msgpack body (spec §7.2); anything else is a 415."""
    kind = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    limit = request.app.state.server.config.max_body_bytes
    raw = bytearray()
    async for part in request.stream():
        raw += part
        if len(raw) > limit:
            raise ApiError(413, f"request body exceeds the limit of {limit} bytes")
    try:
        if kind in ("application/msgpack", "application/x-msgpack"):
            return ormsgpack.unpackb(raw)
        if kind in ("application/json", ""):
            return json.loads(raw or b"null")
    except (ValueError, ormsgpack.MsgpackDecodeError) as exc:
        raise ApiError(400, f"request body is not valid {kind}: {exc}") from exc
    raise ApiError(
        415, f"unsupported content type {kind!r}: use application/json or application/msgpack"
    )


def prepare_text(state: ServerState, text: str, normalize: bool) -> str:
    """Normalised, length-checked text.

    Raises:
        ApiError 400: empty after normalisation, or longer than `max_text_length`.
    """
    if len(text) > state.config.max_text_length:
        raise ApiError(
            400,
            f"text has {len(text)} characters; the limit is {state.config.max_text_length}",
            "text",
        )
    text = normalize_text(text) if normalize else text.strip()
    if not text:
        raise ApiError(400, "text is empty after normalization", "text")
    return text


def refuse_if_overloaded(state: ServerState) -> None:
    """503 with Retry-After while device memory is critical."""
    runtime = state.runtime
    if runtime is not None and runtime.memory_critical():
        raise ApiError(503, "GPU memory is critical; retry shortly", headers={"Retry-After": "5"})


@router.post("/v1/tts")
async def tts(request: Request) -> Response:
    """Fish Speech 1.5 synthesis (JSON or msgpack body, `TTSRequest`)."""
    state: ServerState = request.app.state.server
    body = TTSRequest.model_validate(await parse_body(request))
    text = prepare_text(state, body.text, body.normalize)
    refuse_if_overloaded(state)
    fmt = AudioFormat(body.format)
    async with state.request() as runtime:
        refs = await resolve_references(
            runtime,
            state.voices,
            body.reference_id,
            [InlineReference(r.audio, r.text) for r in body.references],
        )
        params = SamplingParams(
            max(body.temperature, MIN_TEMPERATURE), body.top_p, body.repetition_penalty, body.seed
        )
        gen = GenerationRequest(
            text,
            refs,
            params,
            body.chunk_length,
            body.max_new_tokens,
            HTTP_MAX_LENGTH,
            body.ignore_eos,
        )
        chunks = stream_audio(runtime, gen, state.metrics, state.config.request_timeout)
        headers = response_headers(fmt, runtime.sample_rate)
        if body.streaming:
            return await streaming_response(state, chunks, fmt, runtime.sample_rate, headers)
        audio = await collect(request, chunks)
    if audio.size == 0:
        raise ApiError(500, "No audio generated, please check the input text.")
    headers["Content-Disposition"] = f"attachment; filename=audio.{fmt.value}"
    data = await asyncio.to_thread(encode_audio, audio, runtime.sample_rate, fmt)
    return Response(data, headers=headers, media_type=fmt.content_type)


@router.post("/v1/audio/speech")
async def speech(request: Request) -> Response:
    """OpenAI-compatible synthesis; `voice` names a stored voice (or "default")."""
    state: ServerState = request.app.state.server
    body = SpeechRequest.model_validate(await parse_body(request))
    if body.response_format == "aac":
        raise ApiError(
            400,
            "response_format 'aac' is not supported; use mp3, opus, flac, wav or pcm",
            "response_format",
        )
    if body.speed != 1.0:
        raise ApiError(400, "speed other than 1.0 is not supported by this model", "speed")
    text = prepare_text(state, body.input, normalize=True)
    refuse_if_overloaded(state)
    fmt = AudioFormat(body.response_format)
    voice = None if body.voice == DEFAULT_VOICE else body.voice
    async with state.request() as runtime:
        refs = await resolve_references(runtime, state.voices, voice, [])
        gen = GenerationRequest(text, refs, SamplingParams(), 200, 1024, HTTP_MAX_LENGTH)
        chunks = stream_audio(runtime, gen, state.metrics, state.config.request_timeout)
        headers = response_headers(fmt, runtime.sample_rate)
        if body.instructions:
            headers["X-Fishserve-Note"] = "instructions are ignored by Fish Speech 1.5"
        if body.stream_format == "sse":
            return await sse_response(state, chunks, fmt, runtime.sample_rate, headers)
        return await streaming_response(state, chunks, fmt, runtime.sample_rate, headers)


async def streaming_response(
    state: ServerState,
    chunks: AsyncIterator[np.ndarray],
    fmt: AudioFormat,
    sample_rate: int,
    headers: dict[str, str],
) -> StreamingResponse:
    """Encode chunks as they come; the first chunk is awaited here so that refusals
    (busy, bad reference) still get a proper status code."""
    first = await anext(chunks, None)
    encoder = stream_encoder(fmt, sample_rate)

    async def body() -> AsyncIterator[bytes]:
        try:
            state.active_requests += 1
            if first is not None:
                yield encoder.push(first)
            async for chunk in chunks:
                yield encoder.push(chunk)
            yield encoder.finish()
        finally:
            state.active_requests -= 1
            await chunks.aclose()

    return StreamingResponse(body(), headers=headers, media_type=fmt.content_type)


async def sse_response(
    state: ServerState,
    chunks: AsyncIterator[np.ndarray],
    fmt: AudioFormat,
    sample_rate: int,
    headers: dict[str, str],
) -> StreamingResponse:
    """OpenAI's `stream_format: sse`: `speech.audio.delta` events, then `speech.audio.done`."""
    first = await anext(chunks, None)
    encoder = stream_encoder(fmt, sample_rate)
    headers = {k: v for k, v in headers.items() if k != "Content-Type"}

    def event(payload: dict[str, Any]) -> bytes:
        return f"data: {json.dumps(payload)}\n\n".encode()

    def delta(data: bytes) -> bytes:
        return event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})

    async def body() -> AsyncIterator[bytes]:
        try:
            state.active_requests += 1
            if first is not None:
                yield delta(encoder.push(first))
            async for chunk in chunks:
                yield delta(encoder.push(chunk))
            yield delta(encoder.finish())
            yield event(
                {
                    "type": "speech.audio.done",
                    "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
                }
            )
        finally:
            state.active_requests -= 1
            await chunks.aclose()

    return StreamingResponse(body(), headers=headers, media_type="text/event-stream")


async def collect(request: Request, chunks: AsyncIterator[np.ndarray]) -> np.ndarray:
    """All chunks of a non-streaming request; a client disconnect cancels the generation."""

    async def gather() -> list[np.ndarray]:
        return [chunk async for chunk in chunks]

    task = asyncio.create_task(gather())
    while not task.done():
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if not done and await request.is_disconnected():
            task.cancel()
            await chunks.aclose()
            raise ApiError(499, "client disconnected")
    parts = task.result()
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
