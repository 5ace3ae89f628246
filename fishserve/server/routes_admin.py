"""Stored voices (Fish Speech's reference routes), health and Prometheus metrics."""

from __future__ import annotations

import asyncio
import time
import unicodedata
from pathlib import PurePath
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, Response

from fishserve.audio.io import AudioDecodeError
from fishserve.server.errors import MAX_LISTED_ERRORS, ApiError, voice_param
from fishserve.server.routes_tts import DEFAULT_VOICE, parse_body, refuse_if_overloaded
from fishserve.server.runtime import ServingRuntime, decoder_behind
from fishserve.server.schemas import MAX_REFERENCE_TEXT
from fishserve.server.state import ServerState
from fishserve.server.voices import InvalidVoiceIdError, validate_voice_id

router = APIRouter()
ADD_USAGE = "use multipart/form-data with fields id, audio, text"
# The model id `GET /v1/models` lists; `POST /v1/audio/speech` accepts any `model` value (SDKs
# send e.g. "tts-1"), as there is one model per server.
MODEL_ID = "fish-speech-1.5"
# When this module was loaded (the server's start), in Unix seconds: OpenAI's `created`.
STARTED = int(time.time())
ADD_FIELDS = ("id", "audio", "text")  # the form fields of /v1/references/add


def _state(request: Request) -> ServerState:
    return request.app.state.server


@router.post("/v1/references/add")
async def add_reference(
    request: Request,
    id: Annotated[str | None, Form()] = None,
    audio: Annotated[UploadFile | str | None, File()] = None,
    text: Annotated[str, Form()] = "",
) -> JSONResponse:
    """Store a voice: multipart `id`, `audio` (any common container), `text` (transcript).

    The audio is encoded first, so undecodable, silent or too-long audio is refused (400)
    and never stored. The id "default" is reserved in any case (OpenAI's `voice` for no
    reference).
    Errors name the field at fault (`error.param`). A voice without a transcript is stored,
    and the response's message says that cloning works better with one.
    """
    state = _state(request)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "multipart/form-data":
        raise ApiError(415, f"{ADD_USAGE} (got {kind or 'no content type'})")
    if id is None and (await request.form()).get("id") == "":
        raise ApiError(422, f"id is empty: {ADD_USAGE}", "id")
    if id is None or audio is None:
        missing = " and ".join(n for n, v in (("id", id), ("audio", audio)) if v is None)
        raise ApiError(422, f"{missing} missing: {ADD_USAGE}", "id" if id is None else "audio")
    await _check_add_fields(request)
    if isinstance(audio, str):  # a text field, or a file part with an empty filename
        raise ApiError(
            422, "audio must be a file part (a form field with a filename), not text", "audio"
        )
    try:
        validate_voice_id(id)
    except InvalidVoiceIdError as exc:
        raise ApiError(400, str(exc), "id") from exc
    if len(text) > MAX_REFERENCE_TEXT:
        raise ApiError(
            422, f"text is {len(text)} characters; at most {MAX_REFERENCE_TEXT} are allowed", "text"
        )
    if id.lower() == DEFAULT_VOICE:  # "DEFAULT" too: one folder on a case-insensitive disk
        raise ApiError(400, f"voice id {id!r} is reserved (it means no reference)", "id")
    _check_transcript(text)
    await asyncio.to_thread(state.voices.check_free, id)  # 409 before any encoding
    data = await audio.read()
    if not data:
        raise ApiError(400, "audio file is empty", "audio")
    async with state.request() as runtime:
        refuse_if_overloaded(state)  # 503 at once: a silent engine would hold the upload
        try:
            with state.encoding_refs(runtime):  # 429 when full
                await runtime.encode_reference(data)
        except AudioDecodeError as exc:
            raise ApiError(400, str(exc), "audio") from exc
    suffix = PurePath(audio.filename or "reference.wav").suffix
    await asyncio.to_thread(state.voices.add, id, data, text, suffix)
    message = "reference added"
    if not text.strip():
        message += " without a transcript (text): voice cloning works better with one"
    return JSONResponse({"success": True, "message": message, "reference_id": id})


def _check_transcript(text: str) -> None:
    """422 for control characters other than tab and line breaks in a transcript: a form
    field that is not UTF-8 is read as Latin-1 (Starlette's rule), so UTF-16 or binary text
    would be stored as garbage."""
    controls = (i for i, c in enumerate(text) if unicodedata.category(c) == "Cc")
    bad = next((i for i in controls if text[i] not in "\t\n\r"), None)
    if bad is not None:
        raise ApiError(
            422,
            f"text has a control character (U+{ord(text[bad]):04X}) at position {bad}: send "
            "the transcript as UTF-8 text",
            "text",
        )


async def _check_add_fields(request: Request) -> None:
    """422 for a form field other than id, audio and text, or one given twice (it would be
    ignored silently, as /v1/tts refuses unknown fields)."""
    form = await request.form()  # parsed already for the route's parameters: cached
    for name in dict.fromkeys(form.keys()):
        if name not in ADD_FIELDS:
            raise ApiError(422, f"unknown form field {name!r}: {ADD_USAGE}", name)
        if len(form.getlist(name)) > 1:
            raise ApiError(422, f"form field {name!r} given more than once", name)


@router.api_route("/v1/references/list", methods=["GET", "HEAD"])
async def list_references(request: Request) -> JSONResponse:
    """Ids of the stored voices."""
    ids = await asyncio.to_thread(_state(request).voices.list)
    return JSONResponse({"success": True, "reference_ids": ids, "message": "ok"})


@router.delete("/v1/references/delete")
async def delete_reference(request: Request) -> JSONResponse:
    """Remove a stored voice: body `{"reference_id": ...}` (or `id`), or `?reference_id=`."""
    query = request.query_params
    voice_id = query.get("reference_id", query.get("id"))
    if voice_id is None:
        voice_id = reference_id_of(await parse_body(request))
    if not voice_id:
        raise ApiError(422, "reference_id is required", "reference_id")  # as a missing field
    with voice_param("reference_id"):  # an unknown or invalid id: 404/400 naming the field
        await asyncio.to_thread(_state(request).voices.delete, voice_id)
    return JSONResponse({"success": True, "message": "reference deleted", "reference_id": voice_id})


def reference_id_of(body: object) -> str | None:
    """`reference_id` (or `id`) of a delete body; None for no body.

    Raises:
        ApiError 422: not a JSON object, unknown fields, or the id is not a string.
    """
    if body is None:
        return None
    if not isinstance(body, dict):
        raise ApiError(422, 'expected a JSON object like {"reference_id": "..."}')
    unknown = [str(key)[:40] for key in body if key not in ("reference_id", "id")]
    if unknown:
        names = ", ".join(unknown[:MAX_LISTED_ERRORS])
        extra = len(unknown) - MAX_LISTED_ERRORS
        more = f" and {extra} more" if extra > 0 else ""
        raise ApiError(422, f"unknown field(s) {names}{more}: send reference_id", unknown[0])
    voice_id = body.get("reference_id", body.get("id"))
    if voice_id is not None and not isinstance(voice_id, str):
        raise ApiError(422, "reference_id must be a string", "reference_id")
    return voice_id


def health_report(state: ServerState) -> tuple[dict[str, Any], int]:
    """The health JSON and its HTTP status (200 ok/busy/unloaded, 503 unhealthy)."""
    runtime = state.runtime
    config = state.config
    model = {
        "checkpoint": str(config.checkpoint) if config.checkpoint else None,
        "load_format": "dummy" if config.random_weights else config.load_format,
        "dtype": config.dtype,
        "kv_cache_dtype": config.kv_cache_dtype,
        "device": config.device,
    }
    if runtime is None:
        waits = (config.lazy_load or config.idle_unload_seconds) and state.load_error is None
        error = state.load_error
        if state.restarting:
            waits, error = False, "the engine process died; a new one is loading"
        return {
            "status": "ok" if waits else "unhealthy",
            "loaded": False,
            "error": error,
            "model": model,
            "requests": None,
            "kv_cache": None,
            "gpu_memory": None,
            "host_probe_ms": state.host_probe_ms,
        }, 200 if waits else 503
    now = runtime.status()
    stats, info = now.engine, runtime.info
    status = "ok"
    lagging = decoder_behind(now.decoder_lag_seconds, config.max_decoder_lag)
    # As admission counts them (`Runtime.pending`: with an engine process, also the requests
    # sent since its last status that its free slots cannot take); plus those encoding their
    # references, not yet admitted. A stalled engine process sends no status: its count stays.
    waiting = runtime.pending() + state.encoding
    if waiting >= config.max_waiting or now.memory_critical or lagging:
        status = "busy"
    if not now.alive:
        status = "unhealthy"
    model.update(dtype=info.weight_dtype, device=info.device, kv_cache_dtype=info.kv_cache_dtype)
    model["engine_process"] = runtime.restartable
    # where each stream's pipeline runs with an engine process (null without one)
    relayed = info.relay is not None
    model["stream_pipeline"] = ("http" if relayed else "core") if runtime.restartable else None
    model["decoder_kernels"] = info.decoder_kernels
    model["gpu_sharing"] = info.gpu_sharing
    model["async_scheduling"] = config.async_scheduling
    model["compile_fast_transformer"] = config.compile_fast_transformer
    model["boost_frames"] = config.boost_frames
    model["boost_min_running"] = config.boost_min_running
    model["realtime_admission"] = config.realtime_admission
    model["decoder_sms"] = info.decoder_sms
    model["engine_sms"] = info.engine_sms
    model["confine_engine_graphs"] = config.confine_engine_graphs
    report = {
        "status": status,
        "loaded": True,
        "error": None if now.alive else _engine_down(runtime),
        "model": model,
        "requests": {"running": stats.running, "waiting": waiting},
        "kv_cache": {
            "dtype": info.kv_cache_dtype,
            "block_size": info.block_size,
            "blocks_total": stats.blocks_total,
            "blocks_free": stats.blocks_free,
        },
        "gpu_memory": now.gpu_memory,
        "host_probe_ms": state.host_probe_ms,
    }
    return report, 503 if status == "unhealthy" else 200


def _engine_down(runtime: ServingRuntime) -> str:
    """Why an unhealthy engine is unhealthy, and whether it comes back by itself."""
    if runtime.restartable:
        if not runtime.needs_restart():
            return "the engine process has stopped responding"
        return "the engine process is not running; a new one is being started"
    return "the engine thread has stopped; restart the server"


@router.api_route("/v1/health", methods=["GET", "HEAD", "POST"])
@router.api_route("/health", methods=["GET", "HEAD"])
async def health(request: Request) -> JSONResponse:
    """Status, queue sizes, KV cache occupancy, GPU memory, model config."""
    report, status = health_report(_state(request))
    return JSONResponse(report, status_code=status)


def _model_card() -> dict[str, Any]:
    return {"id": MODEL_ID, "object": "model", "created": STARTED, "owned_by": "fishserve"}


@router.api_route("/v1/models", methods=["GET", "HEAD"])
async def list_models() -> JSONResponse:
    """OpenAI's model list: the one model this server speaks with."""
    return JSONResponse({"object": "list", "data": [_model_card()]})


@router.api_route("/v1/models/{model_id}", methods=["GET", "HEAD"])
async def retrieve_model(model_id: str) -> JSONResponse:
    """OpenAI's model retrieval.

    Raises:
        ApiError: 404 for any other id than `MODEL_ID`.
    """
    if model_id != MODEL_ID:
        raise ApiError(404, f"model {model_id!r} not found; this server has {MODEL_ID!r}", "model")
    return JSONResponse(_model_card())


@router.api_route("/metrics", methods=["GET", "HEAD"])
async def metrics(request: Request) -> Response:
    """Prometheus exposition."""
    state = _state(request)
    if state.runtime is not None:
        state.metrics.update_runtime(state.runtime, state.encoding)
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")
