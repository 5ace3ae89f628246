"""The FastAPI application: routes, API key, body-size limit, error handlers, lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response

from fishserve.server.config import ServerConfig
from fishserve.server.errors import HANDLED, error_response, handle_any
from fishserve.server.routes_admin import router as admin_router
from fishserve.server.routes_tts import router as tts_router
from fishserve.server.runtime import Runtime, build_runtime
from fishserve.server.state import ServerState

log = logging.getLogger(__name__)
# Reachable without the API key: load balancers and scrapers.
OPEN_PATHS = frozenset({"/health", "/v1/health", "/metrics"})


def create_app(
    config: ServerConfig, build: Callable[[ServerConfig], Runtime] = build_runtime
) -> FastAPI:
    """Build the app; models load at start-up unless `config.lazy_load`."""
    state = ServerState(config, build)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not config.lazy_load:
            await state.load()
        watcher = asyncio.create_task(state.watch_idle())
        yield
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
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
    app.middleware("http")(_limits(config))
    return app


def _limits(config: ServerConfig) -> Callable[[Request, Callable], Awaitable[Response]]:
    """Middleware: bearer API key (when set) and the request body size limit (413)."""

    async def middleware(request: Request, call_next: Callable) -> Response:
        if config.api_key and request.url.path not in OPEN_PATHS:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {config.api_key}".encode()):
                return error_response(401, "missing or wrong API key (Authorization: Bearer)")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > config.max_body_bytes:
            return error_response(
                413,
                f"request body of {length} bytes exceeds the limit of "
                f"{config.max_body_bytes} bytes",
            )
        return await call_next(request)

    return middleware
