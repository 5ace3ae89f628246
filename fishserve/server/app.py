"""The FastAPI application: routes, API key, body-size limit, error handlers, lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fishserve.server.config import ServerConfig
from fishserve.server.errors import (
    CLOSE,
    HANDLED,
    BodyTimeoutError,
    BodyTooLargeError,
    StreamAbortedError,
    error_response,
    handle_any,
    handle_http,
    log_stream_failure,
    log_unexpected,
    response_for,
    shutting_down,
)
from fishserve.server.metrics import was_counted
from fishserve.server.routes_admin import router as admin_router
from fishserve.server.routes_tts import ARRIVAL_KEY
from fishserve.server.routes_tts import router as tts_router
from fishserve.server.runtime import ServingRuntime, build_runtime
from fishserve.server.state import ServerState

log = logging.getLogger(__name__)
# Reachable without the API key: load balancers and scrapers.
OPEN_PATHS = frozenset({"/health", "/v1/health", "/metrics"})
# Set in the task of a request whose response was ended on purpose (already logged).
_ABORTED: ContextVar[bool] = ContextVar("fishserve_response_aborted", default=False)


def create_app(
    config: ServerConfig,
    build: Callable[[ServerConfig], ServingRuntime] = build_runtime,
    runtime: ServingRuntime | None = None,
) -> FastAPI:
    """Build the app around `runtime` (models already loaded, as `fishserve serve` does so
    that load errors come before the server starts), else one `build` makes at start-up, or
    on the first request with `config.lazy_load`. `build` also reloads after an idle unload.
    """
    state = ServerState(config, build, runtime)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not config.lazy_load:
            await state.load()
        watchers = [asyncio.create_task(w) for w in (state.watch_idle(), state.watch_engine())]
        yield
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        await state.unload()

    app = FastAPI(
        title="fishserve",
        version="0.1.0",
        lifespan=lifespan,
        description="Fish Speech 1.5 text-to-speech server",
    )
    app.state.server = state
    app.include_router(tts_router)
    app.include_router(admin_router)
    for kind in HANDLED:
        app.add_exception_handler(kind, handle_any)
    app.add_exception_handler(HTTPException, handle_http)
    app.add_middleware(GuardMiddleware, state=state)
    _quiet_uvicorn_abort_line()
    return app


def check_port(host: str, port: int) -> None:
    """Check that a server can listen on `host`:`port` (bind sockets to every address `host`
    resolves to, as asyncio's server does, then close them), so that a port in use is
    reported before the models load.

    Raises:
        OSError: the address does not resolve, or cannot be bound (in use, no permission).
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    with contextlib.ExitStack() as sockets:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = sockets.enter_context(socket.socket(family, kind, proto))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise OSError(f"cannot listen on {host}:{port}: {_bind_problem(exc)}") from None


def _bind_problem(exc: OSError) -> str:
    """What went wrong binding a socket, with a hint when the port is taken."""
    if exc.errno == errno.EADDRINUSE:
        return f"{exc.strerror} (another server is running there: stop it or pick another --port)"
    return exc.strerror or str(exc)


class GuardMiddleware:
    """Pure ASGI middleware (not `BaseHTTPMiddleware`, which hides client disconnects from
    the routes and turns a failing streamed body into a clean end).

    * stamps the request's arrival (`time.monotonic()`, before its body is read; see
      `routes_tts.arrival_of`);
    * 401 without the bearer API key (when set), except on `OPEN_PATHS`;
    * 415 for a compressed body (a body with any Content-Encoding but identity: no route
      decompresses);
    * 413 when Content-Length, or the bytes received so far, exceed `max_body_bytes`
      (chunked uploads included); 408 when the body is not complete `request_timeout`
      seconds after arrival (a stalled or very slow upload, on any route); both close the
      connection (the unread body is not a next request);
    * a request cancelled by uvicorn before its response started (the shutdown timeout is
      over): JSON 503 with Retry-After instead of uvicorn's plain-text 500;
    * an exception no handler took: logged with its traceback, JSON 500;
    * an exception after the response started (a stream failing part-way): one log line, and
      the connection is closed without the terminating chunk;
    * a client gone mid-request (`ClientDisconnect`): nothing to answer, nothing logged.
    """

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry: checks the API key and body size, then calls the app."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        arrival = scope.setdefault("state", {})[ARRIVAL_KEY] = time.monotonic()  # `arrival_of`
        refusal = self._refusal(scope)
        if refusal is not None:
            self.state.metrics.refused(refusal.status_code)
            await refusal(scope, receive, send)
            return
        config = self.state.config
        call = _Call(receive, send, config.max_body_bytes, arrival, config.request_timeout)
        try:
            await self.app(scope, call.receive, call.send)
        except Exception as exc:
            await self._failed(scope, call, exc)
        except asyncio.CancelledError:
            # uvicorn cancels what still runs when `shutdown_timeout` is over; without an
            # answer here it would send a plain-text 500 for a response not yet started
            if not call.started:
                self.state.metrics.refused(503)
                await shutting_down()(scope, call.receive, call.send)
            raise

    def _refusal(self, scope: Scope) -> Response | None:
        config = self.state.config
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if config.api_key and scope["path"] not in OPEN_PATHS:
            # the scheme's name is case-insensitive (RFC 9110 §11.1); the key is not
            scheme, _, given = headers.get("authorization", "").strip().partition(" ")
            key = config.api_key.encode()
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key):
                return error_response(401, "missing or wrong API key (Authorization: Bearer)")
        encoding = headers.get("content-encoding", "identity").strip().lower()
        has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
        if has_body and encoding not in ("", "identity"):  # no route decompresses: refuse
            return error_response(
                415,
                f"unsupported Content-Encoding {encoding[:40]!r}: send the body uncompressed",
                headers=CLOSE,
            )
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > config.max_body_bytes:
            return error_response(
                413,
                f"request body of {length} bytes exceeds the limit of "
                f"{config.max_body_bytes} bytes",
                headers=CLOSE,
            )
        return None

    async def _failed(self, scope: Scope, call: _Call, exc: Exception) -> None:
        where = f"{scope['method']} {scope['path']}"
        if isinstance(exc, ClientDisconnect):
            log.debug("%s: client disconnected", where)
        elif call.started:
            if not isinstance(exc, StreamAbortedError):  # not yet logged
                log_stream_failure(exc, where)
            _ABORTED.set(True)  # returning without the final body message aborts the response
        elif isinstance(exc, BodyTooLargeError | BodyTimeoutError):  # where no handler saw it
            self.state.metrics.refused(exc.status_code)
            response = error_response(exc.status_code, str(exc.detail), headers=exc.headers)
            await response(scope, call.receive, call.send)
        else:
            log_unexpected(exc, where)
            response = response_for(exc)
            if not was_counted(exc):
                self.state.metrics.refused(response.status_code)
            await response(scope, call.receive, call.send)


class _Call:
    """The receive/send pair of one request: counts body bytes (413 past `limit`), bounds the
    body's arrival by the request timeout (408 when it is not complete `timeout` seconds after
    `arrival`, monotonic), and notes whether the response has started."""

    def __init__(
        self, receive: Receive, send: Send, limit: int, arrival: float, timeout: float
    ) -> None:
        self._receive, self._send, self.limit = receive, send, limit
        self.arrival, self.timeout = arrival, timeout
        self.received = 0
        self.body_done = False
        self.started = False

    async def receive(self) -> Message:
        if self.body_done:  # later receives wait for a disconnect, as long as the response
            return await self._receive()
        left = self.arrival + self.timeout - time.monotonic()
        try:
            message = await asyncio.wait_for(self._receive(), max(left, 0.0))
        except TimeoutError:
            raise BodyTimeoutError(self.timeout) from None
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                raise BodyTooLargeError(self.limit)
            self.body_done = not message.get("more_body", False)
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)


class _AbortFilter(logging.Filter):
    """Drops uvicorn's "ASGI callable returned without completing response." for responses
    `GuardMiddleware` ended on purpose: the reason has been logged already. Turns its
    "Exception in ASGI application" with a traceback, for a response cancelled by uvicorn
    itself (a stream still open when `shutdown_timeout` ran out), into one warning line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if _ABORTED.get() and message.startswith("ASGI callable returned"):
            return False
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, asyncio.CancelledError) and message.startswith("Exception in ASGI"):
            record.msg, record.args = "a response was cut off by the server: %s", (exc,)
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_ABORT_FILTER = _AbortFilter()


def _quiet_uvicorn_abort_line() -> None:
    logger = logging.getLogger("uvicorn.error")
    if _ABORT_FILTER not in logger.filters:
        logger.addFilter(_ABORT_FILTER)
