"""The HTTP connection layer under the app: a header timeout, and quieter accept errors.

Uvicorn closes an idle keep-alive connection after its `timeout_keep_alive`, but a connection
that opens and sends nothing, or sends its request headers a byte at a time, is held for good:
enough of them exhaust the process's file descriptors and the server stops accepting anyone
(slowloris). `HeaderTimeoutH11Protocol` closes a connection whose request headers are not
complete `HEADER_TIMEOUT_S` seconds after it opened or after its last response (Go's
`ReadHeaderTimeout`, nginx's `client_header_timeout`). Bodies are bounded separately, by the
app's request timeout. The server always speaks HTTP/1.1 through h11 (a dependency of
uvicorn) with this protocol: httptools, if installed, is not used.

Connections and running requests are capped (setting `max_connections`, uvicorn's
`limit_concurrency`): beyond it a new request gets a JSON 503 with Retry-After and the
connection is closed (`too_many_connections`), and `raise_open_file_limit` lifts the process's
soft descriptor limit above the cap, so that the cap, not the descriptors, runs out first.

When descriptors run out anyway, asyncio logs "socket.accept() out of system resource" with
a traceback at every retry (about 2,000 a minute); `AcceptErrorFilter` lets one through per
`ACCEPT_LOG_INTERVAL_S` and counts the rest.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any

import h11
import uvicorn.protocols.http.h11_impl as h11_impl
from uvicorn.protocols.http.h11_impl import H11Protocol

from fishserve.server.errors import CLOSE, RETRY_AFTER_SECONDS, error_response

__all__ = [
    "ACCEPT_LOG_INTERVAL_S",
    "HEADER_TIMEOUT_S",
    "AcceptErrorFilter",
    "HeaderTimeoutH11Protocol",
    "install_accept_error_filter",
    "raise_open_file_limit",
    "too_many_connections",
    "uvicorn_options",
]

# Seconds a connection may take to send a request's headers (from its opening or its last
# response). A real client sends them in one packet; 15 s covers slow mobile links.
HEADER_TIMEOUT_S = 15.0
# Seconds between two logged "out of system resource" accept errors.
ACCEPT_LOG_INTERVAL_S = 60.0
# Descriptors beyond `max_connections` for everything else (model files, pipes, the engine
# process's queues, log files).
SPARE_DESCRIPTORS = 256
log = logging.getLogger(__name__)


class HeaderTimeoutH11Protocol(H11Protocol):
    """Uvicorn's h11 protocol, closing a connection whose request headers are not complete
    `header_timeout` seconds (class attribute, default `HEADER_TIMEOUT_S`) after it opened or
    after its last response. A request whose headers arrived is never cut by it."""

    header_timeout: float = HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        """Open the connection and start its header clock."""
        super().connection_made(transport)  # type: ignore[arg-type]
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm_header_timer()

    def handle_events(self) -> None:
        """Handle received data; stop the header clock once a request's headers are in."""
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:
            self._cancel_header_timer()

    def on_response_complete(self) -> None:
        """Finish a response; the next request's headers get a fresh clock."""
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection (and its clock)."""
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _cancel_header_timer(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        """Close the connection if it is still waiting for a request's headers."""
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        self.logger.debug("closing a connection whose request headers did not arrive in time")
        self.transport.close()


class AcceptErrorFilter(logging.Filter):
    """Pass one "socket.accept() out of system resource" record per `interval` seconds
    (it then says how many were held back); other records pass untouched."""

    MESSAGE = "socket.accept() out of system resource"

    def __init__(self, interval: float = ACCEPT_LOG_INTERVAL_S) -> None:
        super().__init__()
        self.interval = interval
        self._last = -float("inf")
        self._held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether `record` is logged (records other than the accept error always are)."""
        if not str(record.msg).startswith(self.MESSAGE):
            return True
        now = time.monotonic()
        if now - self._last < self.interval:
            self._held += 1
            return False
        if self._held:
            record.msg = f"{record.msg} ({self._held} more since the last such message)"
        self._last, self._held = now, 0
        return True


def install_accept_error_filter() -> AcceptErrorFilter:
    """Attach an `AcceptErrorFilter` to the ``asyncio`` logger (once) and return it."""
    logger = logging.getLogger("asyncio")
    for existing in logger.filters:
        if isinstance(existing, AcceptErrorFilter):
            return existing
    added = AcceptErrorFilter()
    logger.addFilter(added)
    return added


async def too_many_connections(scope: Any, receive: Any, send: Any) -> None:
    """ASGI app answering a request beyond `max_connections`: 503, JSON, Retry-After, and the
    connection closed (uvicorn's own answer is a plain-text 503 without Retry-After)."""
    message = "too many open connections (setting max_connections): retry later"
    headers = {"Retry-After": RETRY_AFTER_SECONDS, **CLOSE}
    await error_response(503, message, headers=headers)(scope, receive, send)


def uvicorn_options(max_connections: int) -> dict[str, Any]:
    """Keyword arguments for `uvicorn.run`/`uvicorn.Config`: the h11 protocol with the header
    timeout, and at most `max_connections` connections or running requests, beyond which a
    request gets `too_many_connections` (installed into uvicorn's h11 protocol here)."""
    h11_impl.service_unavailable = too_many_connections  # read at each refused request
    # uvicorn refuses when `connections >= limit_concurrency`, counting the asking one: + 1
    # lets in `max_connections` of them
    return {"http": HeaderTimeoutH11Protocol, "limit_concurrency": max_connections + 1}


def raise_open_file_limit(max_connections: int) -> int:
    """Lift the soft limit on open descriptors (``RLIMIT_NOFILE``) to `max_connections` plus
    `SPARE_DESCRIPTORS`, as far as the hard limit allows; warn if that is not enough.

    Returns:
        The soft limit now.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + SPARE_DESCRIPTORS
    ceiling = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < ceiling:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
            soft = ceiling
        except (ValueError, OSError) as exc:  # e.g. macOS caps it below an infinite hard limit
            log.warning("could not raise the open-file limit to %d: %s", ceiling, exc)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "open files are limited to %d (hard limit), fewer than max_connections %d + %d: "
            "raise the limit (ulimit -n) or lower max_connections",
            soft,
            max_connections,
            SPARE_DESCRIPTORS,
        )
    return soft
