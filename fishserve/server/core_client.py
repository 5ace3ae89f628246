"""The HTTP side of the engine-core process (`engine_core`): a `ServingRuntime` that forwards.

`start_remote_runtime` spawns the process and waits until it has loaded the models;
`RemoteRuntime` then sends requests, cancellations and reference audio, and routes what comes
back (audio chunks, errors, counters) to the waiting coroutines; with a relay
(`stream_pipeline` "http") it runs each request's `pipeline.synthesize` here and routes the
core's frames and decoded chunks to it (`relay.RelayClient`). One reader thread receives
everything and wakes each event loop once per batch of messages. If the core process dies
(its pipe reaches end of file), every waiting request fails with `EngineDeadError` (HTTP 503),
`/health` says unhealthy, and the server state starts a new core (`ServerState`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import logging
import multiprocessing as mp
import threading
import time
from collections.abc import AsyncIterator
from functools import partial
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import torch

from fishserve.engine.async_engine import EngineDeadError
from fishserve.engine.engine import EngineStats, GenerationRequest
from fishserve.server.channel import recv_message, widen_pipe
from fishserve.server.config import ServerConfig
from fishserve.server.engine_core import POLL_S, Sender, core_main
from fishserve.server.gc_control import FULL_COLLECTIONS
from fishserve.server.pipeline import AudioChunk, synthesize, within
from fishserve.server.relay import Calls, RelayClient, run_calls
from fishserve.server.runtime import RuntimeInfo, RuntimeStatus

log = logging.getLogger(__name__)
# Seconds `shutdown` waits for the core to stop by itself before killing it.
SHUTDOWN_WAIT_S = 30.0
# Messages routed per reader wake-up at most.
READ_BATCH = 256
# Seconds without a status message (sent every 0.25 s) after which the core counts as stalled:
# unhealthy, though not restarted (a long pause may end).
STALE_S = 10.0
# Seconds past a request's timeout that the HTTP side waits for the core (which enforces the
# timeout itself) before giving up on a stalled core.
TIMEOUT_GRACE_S = 5.0
# Seconds the HTTP side waits for a reference to be encoded (a 30 s reference takes well under
# a second on a GPU, a few seconds on a CPU).
ENCODE_TIMEOUT_S = 60.0
_Mailbox = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[tuple[Any, ...]]"]


def start_remote_runtime(config: ServerConfig) -> RemoteRuntime:
    """Spawn the engine-core process and wait until its models are loaded.

    Raises:
        whatever loading raised in the core (FileNotFoundError, ValueError such as
        InsufficientMemoryError, ...), with the same type (or its nearest picklable base)
        and message;
        RuntimeError: the process died while loading (e.g. killed for memory).
    """
    ctx = mp.get_context("spawn")
    inbox_r, inbox_w = ctx.Pipe(duplex=False)
    outbox_r, outbox_w = ctx.Pipe(duplex=False)
    widen_pipe(inbox_w)  # the messages are `channel`'s (both processes)
    widen_pipe(outbox_r)
    level = logging.getLogger().getEffectiveLevel()
    process = ctx.Process(
        target=core_main, args=(config, inbox_r, outbox_w, level), name="fishserve-engine-core"
    )
    process.start()
    inbox_r.close()  # the core's ends: closing ours lets each side see the other one go
    outbox_w.close()
    log.info("engine core started (pid %d); loading models there", process.pid)
    try:
        message = _first_message(process, outbox_r)
    except BaseException:  # a load error, or Ctrl-C while loading: no core left behind
        if process.is_alive():
            process.kill()
        process.join(SHUTDOWN_WAIT_S)
        inbox_w.close()
        outbox_r.close()
        raise
    return RemoteRuntime(process, inbox_w, outbox_r, message[1])


def _first_message(process: BaseProcess, outbox: Connection) -> tuple[Any, ...]:
    """The core's "ready" message.

    Raises:
        the core's load error ("failed"), or RuntimeError if the process died first.
    """
    died = RuntimeError("the engine process exited while loading the models")
    while True:
        try:
            if not outbox.poll(POLL_S):
                if not process.is_alive():
                    raise died
                continue
            message = recv_message(outbox)
        except EOFError:
            process.join(SHUTDOWN_WAIT_S)
            raise RuntimeError(
                f"the engine process exited (code {process.exitcode}) while loading the models"
            ) from None
        if message[0] == "failed":
            process.join(SHUTDOWN_WAIT_S)
            raise message[1]
        return message


def estimate_waiting(waiting: int, running: int, max_num_seqs: int, sent_since: int) -> int:
    """Requests waiting for admission in the core, from its last status (`waiting`, `running`)
    and the `sent_since` requests sent after it: those the free sequence slots can take join
    the running batch at the next step (none while some already wait: they go first). An
    estimate either way (a short KV pool can hold requests back with slots free; the core's
    own `max_waiting` bound refuses what this lets through). Counting every request sent
    since as waiting refused bursts with slots free (429s for 16 of 40 requests with 8 slots
    and `max_waiting` 16, from an adversarial helper's run). `max_num_seqs` 0: unknown, no
    slot counted free."""
    free = 0 if waiting else max(0, max_num_seqs - running)
    return waiting + max(0, sent_since - free)


class RemoteRuntime:
    """A `ServingRuntime` whose models live in the engine-core process.

    Args:
        process: the running core process; inbox/outbox: our ends of its pipes (to it, from
            it).
        info: what the core reported when it was ready.
    """

    restartable = True  # a dead core can be replaced by a new one (see ServerState)

    def __init__(
        self, process: BaseProcess, inbox: Connection, outbox: Connection, info: RuntimeInfo
    ) -> None:
        self.process = process
        self.info = info
        self._inbox, self._outbox = Sender(inbox, "fishserve-core-client-tx"), outbox
        self._ids = itertools.count()
        self._mailboxes: dict[int, _Mailbox] = {}
        self._lock = threading.Lock()
        self._status = RuntimeStatus(EngineStats(0, 0, 0, 0, 0, 0), True, None, False, 0.0, 0, 0)
        self._dead = False
        self._stopping = False
        self._status_at = time.monotonic()
        self._sent_since_status = 0  # generate requests sent after the last status message
        self.relay = (
            None
            if info.relay is None
            else RelayClient(
                info.relay, info.sample_rate, info.max_seq_len, self._send_relayed, self._alive
            )
        )
        self._reader = threading.Thread(target=self._read, name="fishserve-core-rx", daemon=True)
        self._reader.start()
        atexit.register(self.shutdown)  # before multiprocessing's exit hook joins the process

    @property
    def sample_rate(self) -> int:
        """Output sample rate in Hz (44100 for the release)."""
        return self.info.sample_rate

    @property
    def max_seq_len(self) -> int:
        """Positions of the model's context."""
        return self.info.max_seq_len

    def status(self) -> RuntimeStatus:
        """The core's last counters (at most `STATUS_INTERVAL_S` old); not alive once the
        process is gone, or stalled (no status message for `STALE_S`)."""
        status = self._status
        stalled = time.monotonic() - self._status_at > STALE_S
        if stalled or self.needs_restart():
            status = RuntimeStatus(**{**vars(status), "alive": False})
        return status

    def pending(self) -> int:
        """Requests waiting for admission: the core's last count plus those sent since that
        its free sequence slots cannot take (`estimate_waiting`)."""
        engine = self._status.engine
        slots = self.info.max_num_seqs
        if engine.admission_capacity is not None:  # real-time admission lets fewer run now
            slots = min(slots, engine.admission_capacity)
        return estimate_waiting(engine.waiting, engine.running, slots, self._sent_since_status)

    def idle(self) -> bool:
        """Whether no request of this process is waiting for the core's messages."""
        with self._lock:
            return not self._mailboxes and (self.relay is None or not self.relay.active)

    def needs_restart(self) -> bool:
        """True when the core process is gone, or says its engine thread stopped."""
        return self._dead or not self.process.is_alive() or not self._status.alive

    def memory_critical(self) -> bool:
        """True when the core last saw the device nearly out of memory."""
        return self._status.memory_critical

    def decoder_lag(self) -> float:
        """Seconds the core's audio decoder was last seen behind its streams' deadlines."""
        return self._status.decoder_lag_seconds

    async def synthesize(
        self, request: GenerationRequest, timeout: float, arrival: float | None = None
    ) -> AsyncIterator[AudioChunk]:
        """The request's audio chunks, generated and decoded in the core.

        Args:
            timeout: seconds the request may take from `arrival`.
            arrival: ``time.monotonic()`` seconds of the request's HTTP arrival (None: now);
                sent to the core as is, since the monotonic clock is system-wide on Linux.

        With a relay (`stream_pipeline` "http"), `pipeline.synthesize` runs here; else in
        the core.

        Raises: as `pipeline.synthesize`; EngineDeadError if the core process dies.
        """
        if self.relay is not None:
            async for chunk in self._relayed(request, timeout, arrival):
                yield chunk
            return
        rid, mailbox = self._open()
        done = False
        arrival = time.monotonic() if arrival is None else arrival
        deadline = arrival + timeout + TIMEOUT_GRACE_S
        try:
            self._inbox.put(("generate", rid, request, timeout, arrival))
            self._sent_since_status += 1
            while True:
                message = await within(mailbox.get(), deadline, timeout)
                if message[0] == "chunk":
                    yield message[2]
                    continue
                done = True
                if message[0] == "error":
                    raise message[2]
                return
        finally:
            self._close(rid, cancel=not done)

    async def _relayed(
        self, request: GenerationRequest, timeout: float, arrival: float | None
    ) -> AsyncIterator[AudioChunk]:
        """`pipeline.synthesize` here, with the engine and decoder in the core (`relay`)."""
        assert self.relay is not None
        try:
            async for chunk in synthesize(self.relay, request, timeout, arrival):
                yield chunk
        finally:
            self.relay.release(request.request_id)

    def _send_relayed(self, message: tuple[Any, ...]) -> None:
        if message[0] == "submit":
            self._sent_since_status += 1
        self._inbox.put(message)

    def _alive(self) -> bool:
        """Whether the core can take requests (not known dead, process running)."""
        return not self._dead and self.process.is_alive()

    async def encode_reference(self, audio: bytes) -> torch.Tensor:
        """``(G, L)`` int64 CPU codes of reference audio, encoded in the core.

        Raises:
            ReferenceAudioError (as its base AudioDecodeError): bad audio; EngineDeadError;
            SynthesisTimeoutError: no answer in `ENCODE_TIMEOUT_S` (a stalled core).
        """
        rid, mailbox = self._open()
        done = False
        deadline = time.monotonic() + ENCODE_TIMEOUT_S
        try:
            self._inbox.put(("encode", rid, bytes(audio)))
            message = await within(mailbox.get(), deadline, ENCODE_TIMEOUT_S)
            done = True
            if message[0] == "error":
                raise message[2]
            return message[2]
        finally:
            self._close(rid, cancel=not done)

    def shutdown(self) -> None:
        """Stop the core (it finishes nothing further) and fail whatever still waits; full
        garbage collections of this process go back to CPython."""
        self._stopping = True
        FULL_COLLECTIONS.stop()
        atexit.unregister(self.shutdown)
        if self.process.is_alive():
            self._inbox.put(("shutdown",))
            self.process.join(SHUTDOWN_WAIT_S)
            if self.process.is_alive():
                log.warning("the engine core did not stop in %.0f s; killing it", SHUTDOWN_WAIT_S)
                self.process.kill()  # SIGKILL: also ends a stopped (SIGSTOPped) process
                self.process.join(5)
        self._inbox.close()
        self._fail_all("the engine process stopped")

    # -- plumbing ------------------------------------------------------------------------------
    def _open(self) -> tuple[int, asyncio.Queue[tuple[Any, ...]]]:
        """A new request id and the queue its messages arrive on.

        Raises:
            EngineDeadError: the core process is gone.
        """
        if not self._alive():
            raise EngineDeadError("the engine process is not running")
        rid = next(self._ids)
        mailbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        with self._lock:
            self._mailboxes[rid] = (asyncio.get_running_loop(), mailbox)
        return rid, mailbox

    def _close(self, rid: int, cancel: bool) -> None:
        with self._lock:
            self._mailboxes.pop(rid, None)
        if cancel and not self._dead:
            self._inbox.put(("cancel", rid))

    def _read(self) -> None:
        """Reader thread: route messages to their mailboxes until the core is gone."""
        while True:
            messages: list[tuple[Any, ...]] = []
            try:
                messages.append(recv_message(self._outbox))
                while len(messages) < READ_BATCH and self._outbox.poll(0):
                    messages.append(recv_message(self._outbox))  # already there: one wake-up
            except (EOFError, OSError):
                self._deliver(messages)  # what the core sent before it went
                break
            except Exception:  # a message that cannot be read: the pipe is unusable
                log.exception("cannot read the engine process's messages")
                self._deliver(messages)
                break
            self._deliver(messages)
        if not self._stopping:
            self.process.join(1)  # for its exit code
            log.error("the engine process exited unexpectedly (code %s)", self.process.exitcode)
        self._fail_all("the engine process is not running")

    def _deliver(self, messages: list[tuple[Any, ...]]) -> None:
        calls: Calls = {}
        relay = self.relay
        with self._lock, relay.lock if relay is not None else contextlib.nullcontext():
            for message in messages:
                if message[0] == "status":
                    self._status, self._status_at = message[1], time.monotonic()
                    self._sent_since_status = 0
                elif relay is None or not relay.deliver(message, calls):
                    box = self._mailboxes.get(message[1])
                    if box is not None:
                        loop, queue = box
                        calls.setdefault(loop, []).append(partial(queue.put_nowait, message))
        run_calls(calls)

    def _fail_all(self, reason: str) -> None:
        """Mark the core dead and end every waiting request with EngineDeadError."""
        self._dead = True
        with self._lock:
            boxes, self._mailboxes = list(self._mailboxes.items()), {}
        error = EngineDeadError(reason)
        calls: Calls = {}
        if self.relay is not None:
            self.relay.fail_all(error, calls)
        for rid, (loop, queue) in boxes:
            calls.setdefault(loop, []).append(partial(queue.put_nowait, ("error", rid, error)))
        run_calls(calls)
