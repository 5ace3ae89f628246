"""Speech routes: Fish Speech's `POST /v1/tts` and OpenAI's `POST /v1/audio/speech`."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import unicodedata
from collections.abc import Callable
from typing import Any, TypeVar

import ormsgpack
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from fishserve.audio.encoders import (
    AudioFormat,
    encode_audio,
    resample_chunks,
    response_headers,
)
from fishserve.engine.engine import GenerationRequest
from fishserve.engine.sampling import MIN_TEMPERATURE, SamplingParams
from fishserve.models.prompt import HISTORY_RESERVE, Reference
from fishserve.models.text import split_text
from fishserve.server.errors import ApiError, voice_param
from fishserve.server.normalize import normalize_text
from fishserve.server.runtime import ServingRuntime, decoder_behind
from fishserve.server.schemas import SpeechRequest, TTSRequest, refuse_bad_field_names
from fishserve.server.service import (
    InlineReference,
    encode_references,
    load_voice,
    stream_audio,
)
from fishserve.server.state import ServerState
from fishserve.server.streaming import collect, sse_response, streaming_response
from fishserve.server.value_floods import JSON_TYPES, MSGPACK_TYPES, refuse_value_floods
from fishserve.server.voices import VoiceNotFoundError

router = APIRouter()
# Spec §5: the reference HTTP API keeps a 4,096-position history window.
HTTP_MAX_LENGTH = 4096
Body = TypeVar("Body", bound=BaseModel)
OFF_LOOP_BYTES = 64 * 1024  # bodies at least this large are parsed in a worker thread
DEFAULT_VOICE = "default"  # OpenAI `voice` meaning "no reference: the model's own voice"
ARRIVAL_KEY = "fishserve_arrival"  # request scope state: monotonic seconds at arrival
# OpenAI's built-in voices: not stored here, so a 404 with a hint.
_OPENAI_NAMES = "alloy ash ballad cedar coral echo fable marin nova onyx sage shimmer verse"
OPENAI_VOICES = frozenset(_OPENAI_NAMES.split(" "))
# OpenAI's speech API defines `pcm` as 24 kHz, 16-bit little-endian mono (its API reference).
OPENAI_PCM_RATE = 24000


def arrival_of(request: Request) -> float:
    """When the request arrived (`time.monotonic()` seconds, stamped by the server's
    middleware before the body is read; now if it was not stamped)."""
    return request.scope.get("state", {}).get(ARRIVAL_KEY, time.monotonic())


async def read_body(request: Request) -> bytes:
    """The whole body (within the request timeout: `GuardMiddleware` answers 408 otherwise).

    Raises:
        ClientDisconnect: the client went away first (counted as a cancelled request).
    """
    try:
        return await request.body()
    except ClientDisconnect:
        state: ServerState = request.app.state.server
        state.metrics.failure.labels(reason="cancelled").inc()
        raise


async def parse_body(request: Request) -> Any:
    """JSON or msgpack body (spec §7.2); anything else is a 415.

    The body size limit and the request timeout are enforced while receiving
    (`GuardMiddleware`: 413, 408).

    Raises:
        ApiError 400: malformed or too deeply nested; 415: other content types.
    """
    kind = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    raw = await read_body(request)
    refuse_value_floods(raw, kind, request.app.state.server.config.max_text_length)
    try:
        if kind in MSGPACK_TYPES:
            return await _off_loop(ormsgpack.unpackb, raw)
        if kind in JSON_TYPES:
            return await _off_loop(json.loads, raw or b"null")
    except RecursionError:
        raise ApiError(400, "request body is nested too deeply") from None
    except (ValueError, ormsgpack.MsgpackDecodeError) as exc:
        raise ApiError(400, body_error(kind, exc)) from exc
    raise ApiError(
        415, f"unsupported content type {kind!r}: use application/json or application/msgpack"
    )


async def _off_loop(parse: Callable[[bytes], Any], raw: bytes) -> Any:
    """`parse(raw)`, in a worker thread when `raw` is large (references as base64, or a
    flood of fields), so the event loop keeps serving the other streams meanwhile."""
    if len(raw) < OFF_LOOP_BYTES:
        return parse(raw)
    return await asyncio.to_thread(parse, raw)


def validated(model: type[Body], data: Any) -> Body:
    """`model.model_validate(data)` (in a worker thread: large bodies take a while), with a
    flood of unknown fields or a name that is not Unicode refused first
    (`refuse_bad_field_names`).

    Raises:
        ApiError 422 / pydantic.ValidationError: invalid fields.
    """
    refuse_bad_field_names(model, data)
    return model.model_validate(data)


def body_error(kind: str, exc: Exception) -> str:
    """The 400 message for a body that does not parse: the parser's words where they speak
    to a client, not a Python programmer."""
    if "msgpack" in kind:  # ormsgpack names its internal types ("invalid type Reserved")
        return (
            f"request body is not valid {kind}: expected a map of strings, numbers, booleans, "
            "bytes, arrays, maps or nil"
        )
    if "digits" in str(exc):  # Python's int limit: "Exceeds the limit (4300 digits) ..."
        return f"request body is not valid {kind}: a number has too many digits"
    return f"request body is not valid {kind}: {exc}"


def prepare_text(state: ServerState, text: str, normalize: bool, param: str = "text") -> str:
    """Normalised, length-checked text (`param` names the field in errors).

    Raises:
        ApiError 400: empty after normalisation, nothing but control, format or space
            characters (e.g. zero-width spaces, a NUL), nothing but punctuation (the engine
            drops it: `split_text`), or longer than `max_text_length`.
    """
    if len(text) > state.config.max_text_length:
        raise ApiError(
            400,
            f"{param} has {len(text)} characters; the limit is {state.config.max_text_length}",
            param,
        )
    text = normalize_text(text) if normalize else text.strip()
    if not text:
        raise ApiError(400, f"{param} is empty{' after normalization' if normalize else ''}", param)
    if not any(unicodedata.category(ch)[0] in "LNPS" for ch in text):
        raise ApiError(
            400, f"{param} has nothing to speak: only control, invisible or space characters", param
        )
    if not split_text(text, 0):  # what the engine would refuse, with the field named here
        raise ApiError(400, f"{param} has nothing to speak: only punctuation", param)
    return text


def refuse_if_overloaded(state: ServerState) -> None:
    """503 with Retry-After while an engine process has stopped responding (alive but
    silent: a new request would only wait for it), while device memory is critical, or while
    the audio decoder is more than `max_decoder_lag` seconds behind real time."""
    runtime = state.runtime
    if runtime is None:
        return
    if runtime.restartable and not runtime.needs_restart() and not runtime.status().alive:
        raise ApiError(
            503,
            "the engine process has stopped responding; retry shortly",
            headers={"Retry-After": "5"},
        )
    if runtime.memory_critical():
        raise ApiError(503, "GPU memory is critical; retry shortly", headers={"Retry-After": "5"})
    if decoder_behind(lag := runtime.decoder_lag(), state.config.max_decoder_lag):
        raise ApiError(
            503,
            f"the audio decoder is {lag:.1f} s behind real time; retry shortly",
            headers={"Retry-After": "2"},
        )


async def references_of(
    state: ServerState,
    runtime: ServingRuntime,
    voice_id: str | None,
    inline: list[InlineReference],
) -> list[Reference]:
    """The stored voice `voice_id` (if any) and the `inline` references, encoded. The stored
    voice is read first (an unknown id is a 404 without ever counting as waiting); the
    encoding is refused first when the queue is full, so it is not paid for a 429, and
    counted as waiting while it runs (`ServerState.encoding_refs`).

    Raises:
        VoiceNotFoundError / InvalidVoiceIdError: unknown or unsafe voice id.
        EngineBusyError: the queue is full.
        ReferenceAudioError: undecodable, empty, silent or too long audio.
    """
    sources = await load_voice(state.voices, voice_id) + list(inline)
    if not sources:
        return []
    with state.encoding_refs(runtime):
        return await encode_references(runtime, sources)


def history_window(max_seq_len: int) -> int:
    """The history window (`max_length`) of HTTP requests for a model of `max_seq_len`
    positions: the reference's 4096, capped by the context so that long texts keep fitting
    (the window keeps `max_length - HISTORY_RESERVE` positions of history and leaves the rest
    for generation). A context of at most `HISTORY_RESERVE` positions has no room for a
    window: such models keep the whole history until the context is full (then 400).
    """
    if max_seq_len <= HISTORY_RESERVE:
        return HTTP_MAX_LENGTH
    return min(HTTP_MAX_LENGTH, max_seq_len)


@router.post("/v1/tts")
async def tts(request: Request) -> Response:
    """Fish Speech 1.5 synthesis (JSON or msgpack body, `TTSRequest`)."""
    state: ServerState = request.app.state.server
    body = await asyncio.to_thread(validated, TTSRequest, await parse_body(request))
    text = await asyncio.to_thread(prepare_text, state, body.text, body.normalize)
    refuse_if_overloaded(state)
    fmt = AudioFormat(body.format)
    async with state.request() as runtime:
        inline = [
            InlineReference(r.audio, r.text, f"references.{i}.audio")
            for i, r in enumerate(body.references)
        ]
        with voice_param("reference_id"):
            refs = await references_of(state, runtime, body.reference_id, inline)
        state.refuse_if_queue_full(runtime)
        params = SamplingParams(
            max(body.temperature, MIN_TEMPERATURE), body.top_p, body.repetition_penalty, body.seed
        )
        given = "max_new_tokens" in body.model_fields_set
        gen = GenerationRequest(
            text,
            refs,
            params,
            body.chunk_length,
            body.max_new_tokens if given else state.config.max_new_tokens,
            history_window(runtime.max_seq_len),
            body.ignore_eos,
        )
        timeout, arrival = state.config.request_timeout, arrival_of(request)
        chunks = stream_audio(runtime, gen, state.metrics, timeout, arrival)
        headers = response_headers(fmt, runtime.sample_rate)
        if body.streaming:
            rate = runtime.sample_rate
            return await streaming_response(state, request, chunks, fmt, rate, headers)
        audio = await collect(request, chunks)
    headers["Content-Disposition"] = f"attachment; filename=audio.{fmt.value}"
    data = await asyncio.to_thread(encode_audio, audio, runtime.sample_rate, fmt)
    return Response(data, headers=headers, media_type=fmt.content_type)


@router.post("/v1/audio/speech")
async def speech(request: Request) -> Response:
    """OpenAI-compatible synthesis; `voice` names a stored voice (or "default").

    Streamed in every format but FLAC, which comes as one file once generated (a streamed
    FLAC's header has no sample count, which libsndfile-based readers refuse)."""
    state: ServerState = request.app.state.server
    body = await asyncio.to_thread(validated, SpeechRequest, await parse_body(request))
    if body.response_format == "aac":
        raise ApiError(
            400,
            "response_format 'aac' is not supported; use mp3, opus, flac, wav or pcm",
            "response_format",
        )
    if body.speed != 1.0:
        raise ApiError(400, "speed other than 1.0 is not supported by this model", "speed")
    text = await asyncio.to_thread(prepare_text, state, body.input, True, "input")
    refuse_if_overloaded(state)
    fmt = AudioFormat(body.response_format)
    voice = None if body.voice == DEFAULT_VOICE else body.voice
    async with state.request() as runtime:
        with voice_param("voice"):
            refs = await speech_references(runtime, state, voice)
        state.refuse_if_queue_full(runtime)
        window = history_window(runtime.max_seq_len)
        max_new_tokens = state.config.max_new_tokens
        gen = GenerationRequest(text, refs, SamplingParams(), 200, max_new_tokens, window)
        timeout, arrival = state.config.request_timeout, arrival_of(request)
        chunks = stream_audio(runtime, gen, state.metrics, timeout, arrival)
        rate = runtime.sample_rate
        if fmt is AudioFormat.PCM:  # OpenAI's pcm is 24 kHz s16le: clients play it so
            chunks, rate = resample_chunks(chunks, rate, OPENAI_PCM_RATE), OPENAI_PCM_RATE
        headers = response_headers(fmt, rate)
        if note := ignored_fields_note(body):
            headers["X-Fishserve-Note"] = note
        if body.stream_format == "sse":
            return await sse_response(state, request, chunks, fmt, rate, headers)
        if fmt is not AudioFormat.FLAC:
            return await streaming_response(state, request, chunks, fmt, rate, headers)
        # FLAC as one file: a streamed one cannot state its sample count, and libsndfile
        # (soundfile.read) refuses that; this route has no `streaming: false` to ask for it
        audio = await collect(request, chunks)
    data = await asyncio.to_thread(encode_audio, audio, rate, fmt)
    return Response(data, headers=headers, media_type=fmt.content_type)


def ignored_fields_note(body: SpeechRequest) -> str | None:
    """What the response's X-Fishserve-Note says was ignored (None: nothing)."""
    notes = []
    if body.instructions:
        notes.append("instructions are ignored by Fish Speech 1.5")
    if extra := body.model_extra:  # escaped: a header is ASCII, one line
        first = sorted(itertools.islice(extra, 20))
        names = ", ".join(json.dumps(name)[1:-1] for name in first)[:200]
        more = f" ({len(extra)} in all)" if len(extra) > len(first) else ""
        notes.append(f"fields not in OpenAI's speech API are ignored: {names}{more}")
    return "; ".join(notes) or None


async def speech_references(
    runtime: ServingRuntime, state: ServerState, voice: str | None
) -> list[Reference]:
    """The stored voice `voice` (None: no reference).

    Raises:
        VoiceNotFoundError: unknown voice; for OpenAI's built-in names the message says what
            to use instead.
    """
    try:
        return await references_of(state, runtime, voice, [])
    except VoiceNotFoundError as exc:
        if voice not in OPENAI_VOICES:
            raise
        raise VoiceNotFoundError(
            f"{exc}: OpenAI's built-in voices are not available here; use voice "
            f"'{DEFAULT_VOICE}' or add a voice via /v1/references/add"
        ) from None
