"""Request and response bodies of the HTTP API (pydantic v2).

`TTSRequest` is Fish Speech 1.5's `ServeTTSRequest` (spec §7.2) with the same field names and
defaults; ranges are enforced (the reference declares but does not enforce some). fishserve
extensions are marked as such. `SpeechRequest` is OpenAI's `POST /v1/audio/speech` body.

Types are strict (pydantic's strict mode): a number must be a number, not a string or a
boolean (``"seed": true`` was read as 1, ``"max_new_tokens": "3"`` as 3), a boolean must be
true or false; a whole number is accepted where a float is expected.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fishserve.server.errors import MAX_LISTED_ERRORS, ApiError, utf8_safe

# Spec §7.2 / §5: API ranges of the reference (temperature's lower bound relaxed to 0 = greedy).
TTS_FORMATS = ("wav", "pcm", "mp3", "opus", "flac")


# The longest transcript of a voice reference, inline or stored (characters).
MAX_REFERENCE_TEXT = 2000


class ReferenceAudio(BaseModel):
    """One inline voice reference: encoded audio (any common container) and its transcript.

    In JSON, `audio` is a base64 string; in msgpack, raw bytes.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    audio: bytes
    text: str = Field(default="", max_length=MAX_REFERENCE_TEXT)

    @field_validator("audio", mode="before")
    @classmethod
    def _decode_base64(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ValueError(f"audio is not valid base64: {exc}") from exc
        return value

    @field_validator("audio")
    @classmethod
    def _non_empty(cls, value: bytes) -> bytes:
        if not value:
            raise ValueError("audio is empty")
        return value


class TTSRequest(BaseModel):
    """Body of `POST /v1/tts` (Fish Speech 1.5 `ServeTTSRequest`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str = Field(min_length=1, description="Text to speak.")
    chunk_length: Annotated[int, Field(ge=100, le=300)] = 200
    format: Literal["wav", "pcm", "mp3", "opus", "flac"] = "wav"
    references: list[ReferenceAudio] = Field(default_factory=list, max_length=8)
    reference_id: str | None = None
    seed: Annotated[int, Field(ge=0, lt=2**32)] | None = None
    use_memory_cache: Literal["on", "off"] = "off"
    normalize: bool = True
    streaming: bool = False
    # Frames per segment; the first frame of a segment is never audio (spec §6.2), so >= 2.
    # Not given: the server's `default_max_new_tokens` (1024; 64 with random weights).
    max_new_tokens: Annotated[int, Field(ge=2, le=8192)] = 1024
    # NaN is refused as "not a finite number" before the range says something odd about it.
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] = 0.7
    repetition_penalty: Annotated[float, Field(ge=0.9, le=2.0, allow_inf_nan=False)] = 1.2
    temperature: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = 0.7
    # fishserve extension: generate exactly max_new_tokens frames per segment (benchmarks).
    ignore_eos: bool = False


class SpeechRequest(BaseModel):
    """Body of `POST /v1/audio/speech` (OpenAI). `instructions` is accepted and ignored;
    so are fields OpenAI's API does not define (kept in `model_extra` so the response can
    name them: an SDK's `extra_body` must not look as if it had been applied)."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str = "fish-speech-1.5"
    input: str = Field(min_length=1, max_length=4096)
    voice: str = Field(min_length=1, max_length=128)
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: Annotated[float, Field(ge=0.25, le=4.0, allow_inf_nan=False)] = 1.0
    stream_format: Literal["audio", "sse"] = "audio"
    instructions: str | None = Field(default=None, max_length=4096)


class ErrorBody(BaseModel):
    """Every error response: OpenAI's `error` object plus Fish's `statusCode`/`message`."""

    statusCode: int  # noqa: N815 (Fish Speech's field name)
    message: str
    error: dict[str, str | None]


def refuse_bad_field_names(model: type[BaseModel], data: Any, where: str = "") -> None:
    """Refuse, before validating, field names pydantic would report badly or slowly (also in
    lists of models, e.g. `references`):

    * a name that is not valid Unicode (a lone surrogate, which JSON can spell ``\\ud800``):
      pydantic reports it as an invalid string of the whole body, without its name;
    * more than `MAX_LISTED_ERRORS` unknown fields for a `model` that forbids them: pydantic
      would report each as an error, and a million keys cost seconds of CPU holding the GIL
      while their errors are built, stalling every stream.

    Raises:
        ApiError 422: naming the invalid name (escaped), or the first ten unknown fields and
            how many there are.
    """
    if not isinstance(data, dict):
        return
    for key in data:
        if isinstance(key, str) and (escaped := utf8_safe(key)) != key:
            escaped = escaped[:80]
            message = f'field name "{escaped}" in {where or "body"} is not valid Unicode'
            raise ApiError(422, message, f"{where}.{escaped}" if where else escaped)
    if model.model_config.get("extra") == "forbid":
        unknown = [key for key in data if key not in model.model_fields]
        if len(unknown) > MAX_LISTED_ERRORS:
            names = ", ".join(str(key)[:40] for key in unknown[:MAX_LISTED_ERRORS])
            message = f"{len(unknown)} unknown fields in {where or 'body'}: {names}, ..."
            raise ApiError(422, message, where or None)
    for name, field in model.model_fields.items():
        items, item_model = data.get(name), _list_item_model(field.annotation)
        if item_model is not None and isinstance(items, list):
            for i, item in enumerate(items[:MAX_LISTED_ERRORS]):
                refuse_bad_field_names(item_model, item, f"{where}{name}.{i}")


def _list_item_model(annotation: Any) -> type[BaseModel] | None:
    """`M` for an annotation ``list[M]`` with M a pydantic model, else None."""
    args = get_args(annotation)
    if get_origin(annotation) is not list or len(args) != 1:
        return None
    item = args[0]
    return item if isinstance(item, type) and issubclass(item, BaseModel) else None
