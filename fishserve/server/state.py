"""Server state shared by the routes: settings, the (lazily loaded) runtime, voices, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

from fishserve.engine.async_engine import queue_full
from fishserve.errors import USER_ERRORS
from fishserve.host_probe import host_probe_ms
from fishserve.server.config import ServerConfig
from fishserve.server.metrics import Metrics
from fishserve.server.runtime import ServingRuntime
from fishserve.server.voices import VoiceStore

log = logging.getLogger(__name__)
# Seconds after a failed model load during which requests fail at once instead of each
# loading again (a load takes seconds to minutes).
LOAD_RETRY_S = 10.0


class ModelLoadError(RuntimeError):
    """The models could not be loaded (HTTP 503; /health says "unhealthy" and why).

    Attributes:
        retry_after_s: seconds until the next load is tried (the response's Retry-After).
    """

    def __init__(self, message: str, retry_after_s: float = LOAD_RETRY_S) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServerState:
    """Holds the runtime, loading it on first use when `lazy_load` is set and unloading it
    after `idle_unload_seconds` without requests (0 = never)."""

    def __init__(
        self,
        config: ServerConfig,
        build: Callable[[ServerConfig], ServingRuntime],
        runtime: ServingRuntime | None = None,
    ) -> None:
        self.config = config
        self.voices = VoiceStore(config.references_dir)
        self.metrics = Metrics()
        self._build = build
        self._runtime = runtime
        self.load_error: str | None = None  # why the last load failed; None after a success
        self._lock = asyncio.Lock()
        self.active_requests = 0
        self.encoding = 0  # requests whose voice references are being encoded (`encoding_refs`)
        self.last_activity = time.monotonic()
        self.restarting = False  # a dead engine process is being replaced (`watch_engine`)
        self._replacing = False  # a replacement is still owed (its load failed)
        self._failed_at = -LOAD_RETRY_S  # monotonic time of the last failed load
        # this machine's host speed, taken at start-up before any load (`/health`): the
        # engine's host work per step, and so capacity, depend on it
        self.host_probe_ms = host_probe_ms()

    @property
    def runtime(self) -> ServingRuntime | None:
        """The loaded runtime, or None while unloaded."""
        return self._runtime

    async def load(self) -> ServingRuntime:
        """The runtime, loading it (in a worker thread) if needed; a failed load is tried
        again by the next call.

        Raises:
            ModelLoadError: the models failed to load (the message says why).
        """
        async with self._lock:
            failed_ago = time.monotonic() - self._failed_at
            if self._runtime is None and failed_ago < LOAD_RETRY_S:  # requests queued behind
                wait = math.ceil(LOAD_RETRY_S - failed_ago)  # a failed load do not each load again
                raise ModelLoadError(
                    f"the models failed to load: {self.load_error} (next try in {wait} s)", wait
                )
            if self._runtime is None:
                log.info("loading models")
                try:
                    self._runtime = await asyncio.to_thread(self._build, self.config)
                except Exception as exc:
                    self._failed_at = time.monotonic()
                    self.load_error = _describe(exc)
                    log.error("loading models failed: %s", self.load_error, exc_info=_bug(exc))
                    raise ModelLoadError(f"the models failed to load: {self.load_error}") from exc
                self.load_error = None
            return self._runtime

    async def unload(self) -> None:
        """Stop the engine (threads, or process) and drop the models. The runtime is dropped
        even if stopping it fails (e.g. a dead engine process's closed pipe): that is logged,
        so that a replacement, or the next request, can load a new one."""
        async with self._lock:
            runtime, self._runtime = self._runtime, None
        if runtime is None:
            return
        try:
            await asyncio.to_thread(runtime.shutdown)
            self.metrics.retire_runtime(runtime)  # its totals, then counting restarts from 0
        except Exception:
            log.exception("stopping the engine failed; its models are dropped all the same")

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Count an active request (or response stream) for idle tracking; the idle clock
        restarts when it ends."""
        self.active_requests += 1
        try:
            yield
        finally:
            self.active_requests -= 1
            self.last_activity = time.monotonic()

    @contextmanager
    def encoding_refs(self, runtime: ServingRuntime) -> Iterator[None]:
        """Count a request while its voice references are encoded: it waits for admission,
        so `/health` and `/metrics` count it as waiting, and the queue bound applies before
        the encoding is paid for.

        Raises:
            EngineBusyError: the requests waiting in `runtime`'s engine (`pending`) plus those
                already encoding reach `max_waiting` (HTTP 429 with Retry-After).
        """
        self.refuse_if_queue_full(runtime)
        self.encoding += 1
        try:
            yield
        finally:
            self.encoding -= 1

    def refuse_if_queue_full(self, runtime: ServingRuntime) -> None:
        """Refuse a request about to wait for admission when the requests already waiting,
        in the engine (`pending`) and encoding their references, reach `max_waiting` (the
        engine's own bound counts only its own queue: with both, twice as many could wait).

        Raises:
            EngineBusyError: the queue is full (HTTP 429 with Retry-After).
        """
        if (waiting := runtime.pending() + self.encoding) >= self.config.max_waiting:
            raise queue_full(waiting)

    @asynccontextmanager
    async def request(self) -> AsyncIterator[ServingRuntime]:
        """Count an active request for idle tracking and give it the runtime."""
        with self.busy():
            yield await self.load()

    async def watch_engine(self, interval: float = 0.25) -> None:
        """Replace a dead engine process (killed, crashed) by a new one (runs forever).

        Requests that were running in it have already failed (503); requests arriving while
        the new one loads wait for it, as after an idle unload. If the new one fails to load,
        loading is tried again every `LOAD_RETRY_S` seconds, with /health saying why.
        """
        while True:
            await asyncio.sleep(interval)
            try:
                await self._check_engine()
            except Exception:  # a bug here must not stop the watching
                log.exception("the engine watcher failed; it goes on watching")

    async def _check_engine(self) -> None:
        """One look of `watch_engine`: replace a dead engine process, retry a failed load."""
        runtime = self._runtime
        if runtime is None:
            if self._replacing and time.monotonic() - self._failed_at >= LOAD_RETRY_S:
                await self._replace(None)
            return
        if runtime.restartable and runtime.needs_restart():
            log.error("the engine process is not running; starting a new one")
            await self._replace(runtime)

    async def _replace(self, runtime: ServingRuntime | None) -> None:
        """Unload `runtime` (if any) and load a new one; a failure is retried later."""
        self.restarting = self._replacing = True
        try:
            if runtime is not None:
                await self.unload()
            with contextlib.suppress(ModelLoadError):  # logged; /health shows load_error
                await self.load()
                self._replacing = False
        finally:
            self.restarting = False

    async def watch_idle(self) -> None:
        """Unload the models after `idle_unload_seconds` without requests (runs forever)."""
        limit = self.config.idle_unload_seconds
        while limit > 0:
            await asyncio.sleep(min(limit, 5.0))
            idle = time.monotonic() - self.last_activity
            if self._runtime is not None and self.active_requests == 0 and idle >= limit:
                log.info("unloading models after %.0f s idle", idle)
                await self.unload()


def _bug(exc: Exception) -> Exception | None:
    """`exc` when its traceback is worth logging (not a bad path or setting), else None."""
    return None if isinstance(exc, USER_ERRORS) else exc


def _describe(exc: Exception) -> str:
    """The message of an expected load failure; type and message of anything else."""
    return str(exc) if isinstance(exc, USER_ERRORS) else f"{type(exc).__name__}: {exc}"
