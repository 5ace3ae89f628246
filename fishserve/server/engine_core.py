"""The engine-core process: models, engine thread and decoder thread, away from HTTP.

In one process the engine thread shares Python's GIL with the HTTP event loop, and every
PyTorch call of an engine step (each releases the GIL) waits to win it back: a py-spy profile
of the server under load showed steps of ~70 ms that take 20-30 ms alone (docs/benchmarks.md
§6.2). So, as vLLM V1 does, the server can run the engine in its own process (spawned, so
CUDA is initialised there only): this module is that process's side; `core_client` is the
HTTP side.

Messages are pickled tuples on two one-way `multiprocessing` pipes (framed by `channel`, which
moves NumPy arrays without copies), each written by a sender thread (`Sender`) so that no
caller blocks; a pipe's end of file tells either side that the other process is gone:

HTTP -> core:
    ``("generate", rid, GenerationRequest, timeout_s, arrival)``, ``("encode", rid,
    audio_bytes)``, ``("cancel", rid)``, ``("shutdown",)``; ``arrival`` is the request's HTTP
    arrival in ``time.monotonic()`` seconds, which is system-wide on Linux, so the core
    measures the request's timeout and first-chunk deadline from the same instant;
    the relay's ``submit``, ``decode`` and ``release`` (`relay`)
core -> HTTP:
    ``("ready", RuntimeInfo)`` or ``("failed", exception)`` once, after loading;
    ``("chunk", rid, AudioChunk)``, ``("done", rid)``, ``("encoded", rid, codes)``,
    ``("error", rid, exception)``; ``("status", RuntimeStatus)`` every `STATUS_INTERVAL_S`;
    the relay's ``frames``, ``audio``, ``decode_error`` and ``submit_error``.

With `ServerConfig.stream_pipeline` "core" (the default), a ``generate`` runs
`pipeline.synthesize` here as an asyncio task, so the per-request logic (chunking, deadlines,
timeouts, cancellation) is the same as in-process. With "http", the HTTP process runs each
request's `pipeline.synthesize` and relays frames and chunks (`relay`): the relay's messages
are served on the core's reader thread, without a hop through its event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import queue
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch

from fishserve.server.channel import recv_message, send_message
from fishserve.server.config import ServerConfig
from fishserve.server.relay import RELAY_MESSAGES, CoreRelay, RelaySpec
from fishserve.server.runtime import Runtime, build_local_runtime

log = logging.getLogger(__name__)
# How often the core sends its counters (health, metrics, memory checks read the last one).
STATUS_INTERVAL_S = 0.25
# How often a wait for the core's first message checks that the process is still there.
POLL_S = 0.5
LOG_FORMAT = "%(asctime)s %(levelname)s [engine-core] %(name)s: %(message)s"


def portable_exception(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else an instance of its nearest base class that does,
    with the same message (e.g. an exception whose ``__init__`` takes two arguments).

    The HTTP side maps exception types to statuses, so the type (or its base) must arrive.
    """
    for kind in type(exc).__mro__:
        if not issubclass(kind, BaseException):
            continue
        try:
            candidate = exc if kind is type(exc) else kind(str(exc))
            pickle.loads(pickle.dumps(candidate))
        except Exception:
            continue
        return candidate
    return RuntimeError(str(exc))


class Sender:
    """Sends messages on a pipe from a daemon thread: `put` never blocks the caller.

    A message that cannot be pickled is logged and dropped; once the other end is closed,
    messages are dropped silently (that process is gone).
    """

    def __init__(self, conn: Connection, name: str) -> None:
        self.conn = conn
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, message: tuple[Any, ...]) -> None:
        """Queue `message` for sending."""
        self._queue.put(message)

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, then stop the thread and close the pipe."""
        self._queue.put(None)
        self._thread.join(timeout)
        self.conn.close()

    def _run(self) -> None:
        while (message := self._queue.get()) is not None:
            try:
                send_message(self.conn, message)
            except (OSError, EOFError):
                return  # the reading process is gone
            except Exception:
                log.exception("cannot send a %r message", message[0])


def core_main(config: ServerConfig, inbox: Connection, outbox: Connection, log_level: int) -> None:
    """Entry point of the engine-core process: load, say ready (or why not), serve, stop.

    Args:
        inbox: the pipe end messages from the HTTP process arrive on; outbox: the pipe end
            messages to it go to (module docstring).
        log_level: the HTTP process's logging level.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the HTTP process, which stops us
    orphan_watch = threading.Thread(
        target=_exit_when_orphaned, args=(os.getppid(),), name="fishserve-core-orphan", daemon=True
    )
    orphan_watch.start()
    logging.basicConfig(level=log_level, format=LOG_FORMAT)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    sender = Sender(outbox, "fishserve-core-tx")
    try:
        runtime = build_local_runtime(config)
    except BaseException as exc:  # reported to the HTTP process, which raises it
        sender.put(("failed", portable_exception(exc)))
        sender.close()
        return
    info = runtime.info
    if config.stream_pipeline == "http":
        info.relay = RelaySpec.of(runtime)
    sender.put(("ready", info))
    try:
        asyncio.run(CoreServer(runtime, inbox, sender).run())
    finally:
        runtime.shutdown()
        sender.close()
    log.info("engine core stopped")


def _exit_when_orphaned(parent: int) -> None:
    """Exit at once when the HTTP process is gone, even while loading (its pipe's end of file
    is only read after the load, which can take minutes and hold the GPU)."""
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os._exit(1)


class CoreServer:
    """Serves the HTTP process's messages with a local `Runtime` (one asyncio loop)."""

    def __init__(self, runtime: Runtime, inbox: Connection, outbox: Sender) -> None:
        self.runtime = runtime
        self.inbox, self.outbox = inbox, outbox
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.relay = CoreRelay(runtime, outbox, portable_exception)

    async def run(self) -> None:
        """Until a shutdown message, or the HTTP process is gone."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        reader = threading.Thread(
            target=self._read, args=(loop, stop), name="fishserve-core-reader", daemon=True
        )
        reader.start()
        reporter = asyncio.create_task(self._report())
        await stop.wait()
        reporter.cancel()
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    def _read(self, loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
        """Reader thread: hand each message to the loop; stop when told or orphaned."""
        while True:
            try:
                message = recv_message(self.inbox)
            except (EOFError, OSError):
                log.warning("the HTTP process is gone; stopping")
                message = ("shutdown",)
            except Exception:  # a message that cannot be read: the pipe is unusable
                log.exception("cannot read the HTTP process's messages; stopping")
                message = ("shutdown",)
            if message[0] == "shutdown":
                loop.call_soon_threadsafe(stop.set)
                return
            if message[0] in RELAY_MESSAGES:
                self._relay(message)
            else:
                loop.call_soon_threadsafe(self._handle, message)

    def _relay(self, message: tuple[Any, ...]) -> None:
        """Serve a relay message on the reader thread; an unexpected error is logged (the
        request's own errors go back to it)."""
        try:
            self.relay.handle(message)
        except Exception:
            log.exception("cannot serve a %r message", message[0])

    def _handle(self, message: tuple[Any, ...]) -> None:
        kind, rid = message[0], message[1]
        if kind == "cancel":
            task = self.tasks.get(rid)
            if task is not None:
                task.cancel()
            return
        work: Callable[..., Any] = {"generate": self._generate, "encode": self._encode}[kind]
        task = asyncio.create_task(work(rid, *message[2:]))
        self.tasks[rid] = task
        task.add_done_callback(lambda _: self.tasks.pop(rid, None))

    async def _generate(self, rid: int, request: Any, timeout: float, arrival: float) -> None:
        """Stream the request's chunks back (`timeout` s from `arrival`, monotonic s)."""
        try:
            async for chunk in self.runtime.synthesize(request, timeout, arrival):
                self.outbox.put(("chunk", rid, chunk))
        except asyncio.CancelledError:
            return  # the HTTP side stopped listening
        except Exception as exc:
            self.outbox.put(("error", rid, portable_exception(exc)))
            return
        self.outbox.put(("done", rid))

    async def _encode(self, rid: int, audio: bytes) -> None:
        try:
            codes = await self.runtime.encode_reference(audio)
        except asyncio.CancelledError:
            return
        except Exception as exc:
            self.outbox.put(("error", rid, portable_exception(exc)))
            return
        self.outbox.put(("encoded", rid, codes))

    async def _report(self) -> None:
        while True:
            self.outbox.put(("status", self.runtime.status()))
            await asyncio.sleep(STATUS_INTERVAL_S)
