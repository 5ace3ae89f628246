"""Exception -> HTTP status mapping and the one error body shape of every route.

Body: `{"statusCode": 4xx, "message": "...", "error": {"message", "type", "param", "code"}}`:
Fish Speech clients read `statusCode`/`message`, OpenAI SDKs read `error.message`.

Expected failures (bad input, busy, engine failures already logged by the engine) answer
quietly; anything else is a bug: a 500 whose traceback is logged once.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from fishserve.audio.io import AudioDecodeError
from fishserve.engine.async_engine import EngineBusyError, EngineDeadError
from fishserve.engine.engine import KVPoolTooSmallError
from fishserve.engine.reference import PromptTooLongError
from fishserve.server.metrics import was_counted
from fishserve.server.pipeline import ContextFullError, SynthesisError, SynthesisTimeoutError
from fishserve.server.state import ModelLoadError
from fishserve.server.voices import (
    InvalidVoiceIdError,
    VoiceDataError,
    VoiceExistsError,
    VoiceNotFoundError,
)

log = logging.getLogger(__name__)
RETRY_AFTER_SECONDS = "2"
# Starlette's multipart/form parser refuses an oversized part or field with a 400 saying this.
_PART_TOO_LARGE = re.compile(r"exceeded maximum size")


class ApiError(ValueError):
    """An error with an explicit HTTP status (raised by route code)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers


# Refusals answered before the whole body was read: the rest of it would be taken for the
# next request on the connection, so the server closes it after the response.
CLOSE = {"Connection": "close"}


class BodyTooLargeError(HTTPException):
    """The request body grew past `max_body_bytes` while it was received (HTTP 413).

    An `HTTPException` so that FastAPI's form parsing passes it on instead of answering 400.
    """

    def __init__(self, limit: int) -> None:
        message = f"request body exceeds the limit of {limit} bytes"
        super().__init__(413, message, headers=CLOSE)


class BodyTimeoutError(HTTPException):
    """The request body had not fully arrived by the request timeout (HTTP 408).

    An `HTTPException` for the same reason as `BodyTooLargeError`.
    """

    def __init__(self, timeout: float) -> None:
        message = f"request body not received within the {timeout:g} s timeout"
        super().__init__(408, message, headers=CLOSE)


class StreamAbortedError(Exception):
    """Raised by a streaming body that failed after the response started (already logged):
    the connection is closed without the terminating chunk, so the client sees the failure."""


_STATUS: list[tuple[type[Exception], int]] = [
    (VoiceNotFoundError, 404),
    (VoiceExistsError, 409),
    (InvalidVoiceIdError, 400),
    (AudioDecodeError, 400),
    (PromptTooLongError, 400),
    (KVPoolTooSmallError, 400),
    (EngineBusyError, 429),
    (EngineDeadError, 503),
    (ModelLoadError, 503),
    (SynthesisTimeoutError, 504),
    (ContextFullError, 400),
    (SynthesisError, 500),
    (ValueError, 400),
]
# 5xx failures that are not bugs: the engine or the decoder has logged the cause already.
_QUIET_SERVER_ERRORS = (SynthesisError, EngineDeadError, ModelLoadError, VoiceDataError)
# Invalid fields a 422 names at most: a body of a million unknown keys made an 82 MB answer.
MAX_LISTED_ERRORS = 10
# pydantic error types whose message names our model classes ("... or instance of TTSRequest").
_NOT_AN_OBJECT = frozenset({"model_type", "model_attributes_type", "dict_type"})


# Exception types given our JSON error body by `handle_any` (Starlette's ExceptionMiddleware).
# Anything else reaches `GuardMiddleware` in app.py, which logs it and answers 500.
HANDLED: tuple[type[Exception], ...] = (
    RequestValidationError,
    ValueError,
    RuntimeError,
    VoiceNotFoundError,
)


def utf8_safe(text: str) -> str:
    """`text` with what UTF-8 cannot encode (lone surrogates) as backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The JSON error body with `status`. Text that cannot be UTF-8 (a lone surrogate from a
    JSON ``\\ud800`` escape, echoed from a field name) is written as a backslash escape."""
    message = utf8_safe(message)
    param = None if param is None else utf8_safe(param)
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {
        "statusCode": status,
        "message": message,
        "error": {"message": message, "type": kind, "param": param, "code": str(status)},
    }
    return JSONResponse(body, status_code=status, headers=headers)


def status_of(exc: Exception) -> int:
    """HTTP status for an exception raised while serving a request."""
    if isinstance(exc, ApiError):
        return exc.status
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            return status
    return 500


def is_expected(exc: Exception) -> bool:
    """Whether `exc` is an anticipated failure rather than a bug (which gets a traceback)."""
    return status_of(exc) != 500 or isinstance(exc, (ApiError, *_QUIET_SERVER_ERRORS))


def public_message(exc: Exception) -> str:
    """What the client is told: the message of expected errors, only the type of bugs."""
    return str(exc) if is_expected(exc) else f"internal error: {type(exc).__name__}"


def log_unexpected(exc: Exception, where: str) -> None:
    """Log `exc` with its traceback unless it is an expected failure."""
    if not is_expected(exc):
        log.error("internal error in %s: %s: %s", where, type(exc).__name__, exc, exc_info=exc)


def log_stream_failure(exc: Exception, where: str) -> str:
    """Log one line for a stream that failed after its response started (a traceback only
    for bugs); returns the message for the client."""
    if is_expected(exc):
        log.warning("%s failed after the response started: %s", where, exc)
    else:
        log_unexpected(exc, where)
    return public_message(exc)


def shutting_down() -> JSONResponse:
    """503 for a request the server stopped before answering it (its shutdown timeout was
    over), with Retry-After and Connection: close."""
    message = "the server is shutting down and stopped this request; retry shortly"
    return error_response(503, message, headers={"Retry-After": RETRY_AFTER_SECONDS, **CLOSE})


@contextmanager
def voice_param(param: str) -> Iterator[None]:
    """An unknown or invalid voice id raised inside names request field `param` as the one at
    fault (`error.param` of the 404/400)."""
    try:
        yield
    except (VoiceNotFoundError, InvalidVoiceIdError) as exc:
        exc.param = param  # type: ignore[attr-defined]
        raise


def response_for(exc: Exception) -> JSONResponse:
    """Error response for any exception (Retry-After on 429/503)."""
    if isinstance(exc, ApiError):
        return error_response(exc.status, exc.message, exc.param, exc.headers)
    status = status_of(exc)
    retry = RETRY_AFTER_SECONDS
    if isinstance(exc, ModelLoadError):  # the next load is tried then, not sooner
        retry = str(max(1, math.ceil(exc.retry_after_s)))
    headers = {"Retry-After": retry} if status in (429, 503) else None
    param = getattr(exc, "param", None)  # set by `voice_param`
    return error_response(status, public_message(exc), param, headers)


def validation_message(exc: ValidationError | RequestValidationError) -> tuple[str, str | None]:
    """One readable line naming the invalid fields, and the first field's name (None when
    the body as a whole is invalid)."""
    parts, first = [], None
    errors = exc.errors()
    for err in errors[:MAX_LISTED_ERRORS]:
        loc = ".".join(str(x) for x in err["loc"] if x != "body")[:100]
        first = first or loc or None
        message = (
            "expected an object (a JSON object or msgpack map)"
            if err["type"] in _NOT_AN_OBJECT
            else err["msg"]
        )
        parts.append(f"{loc or 'body'}: {message}")
    if len(errors) > MAX_LISTED_ERRORS:
        parts.append(f"and {len(errors) - MAX_LISTED_ERRORS} more")
    return "; ".join(parts), first


def _count_refusal(request: Request, status: int) -> None:
    state = getattr(request.app.state, "server", None)
    if state is not None:
        state.metrics.refused(status)


async def handle_any(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI exception handler for the `HANDLED` types; logs bugs, counts refusals."""
    if isinstance(exc, ValidationError | RequestValidationError):
        message, param = validation_message(exc)
        _count_refusal(request, 422)
        return error_response(422, message, param)
    log_unexpected(exc, f"{request.method} {request.url.path}")
    response = response_for(exc)
    if not isinstance(exc, SynthesisError) and not was_counted(exc):  # else by stream_audio
        _count_refusal(request, response.status_code)
    return response


async def handle_http(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own errors (404/405 routing, 413 body limit, bad multipart) in our shape.

    An oversized multipart part is a 413, not Starlette's 400.
    """
    status, message = exc.status_code, str(exc.detail)
    if status == 400 and _PART_TOO_LARGE.search(message):
        status = 413
    if status not in (404, 405):  # a route miss is not a refused request
        _count_refusal(request, status)
    return error_response(status, message, headers=exc.headers)
