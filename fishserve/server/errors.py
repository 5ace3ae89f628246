"""Exception -> HTTP status mapping and the one error body shape of every route.

Body: `{"statusCode": 4xx, "message": "...", "error": {"message", "type", "param", "code"}}`:
Fish Speech clients read `statusCode`/`message`, OpenAI SDKs read `error.message`.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from fishserve.audio.io import AudioDecodeError
from fishserve.engine.async_engine import EngineBusyError, EngineDeadError
from fishserve.engine.engine import KVPoolTooSmallError
from fishserve.engine.reference import PromptTooLongError
from fishserve.server.service import SynthesisError, SynthesisTimeoutError
from fishserve.server.voices import InvalidVoiceIdError, VoiceExistsError, VoiceNotFoundError

RETRY_AFTER_SECONDS = "2"


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


_STATUS: list[tuple[type[Exception], int]] = [
    (VoiceNotFoundError, 404),
    (VoiceExistsError, 409),
    (InvalidVoiceIdError, 400),
    (AudioDecodeError, 400),
    (PromptTooLongError, 400),
    (KVPoolTooSmallError, 400),
    (EngineBusyError, 429),
    (EngineDeadError, 503),
    (SynthesisTimeoutError, 504),
    (SynthesisError, 500),
    (ValueError, 400),
]


# Exception types given our JSON error body. Registered by class (not as a catch-all for
# Exception) so that expected errors are not logged as crashes; anything else is a logged 500.
HANDLED: tuple[type[Exception], ...] = (
    RequestValidationError,
    ValueError,
    RuntimeError,
    VoiceNotFoundError,
    Exception,
)


def error_response(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The JSON error body with `status`."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {
        "statusCode": status,
        "message": message,
        "error": {"message": message, "type": kind, "param": param, "code": str(status)},
    }
    return JSONResponse(body, status_code=status, headers=headers)


def status_of(exc: Exception) -> int:
    """HTTP status for an exception raised while serving a request."""
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            return status
    return 500


def response_for(exc: Exception) -> JSONResponse:
    """Error response for any exception (Retry-After on 429/503)."""
    if isinstance(exc, ApiError):
        return error_response(exc.status, exc.message, exc.param, exc.headers)
    status = status_of(exc)
    headers = {"Retry-After": RETRY_AFTER_SECONDS} if status in (429, 503) else None
    message = (
        str(exc)
        if status != 500 or isinstance(exc, SynthesisError)
        else (f"internal error: {type(exc).__name__}")
    )
    return error_response(status, message, headers=headers)


def validation_message(exc: ValidationError | RequestValidationError) -> tuple[str, str | None]:
    """One readable line naming the invalid fields, and the first field's name."""
    parts, first = [], None
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"] if x != "body")
        first = first or loc
        parts.append(f"{loc or 'body'}: {err['msg']}")
    return "; ".join(parts), first


async def handle_any(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI exception handler for every exception type."""
    if isinstance(exc, ValidationError | RequestValidationError):
        message, param = validation_message(exc)
        return error_response(422, message, param)
    return response_for(exc)
