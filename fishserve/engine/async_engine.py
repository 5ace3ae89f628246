"""Runs the engine's step loop on its own thread; the API the server talks to.

Callers (HTTP handlers on an asyncio loop, or plain threads) `submit` requests and iterate
their frames; they never touch engine state. Submissions and cancellations reach the engine
thread through an inbox; frames come back through one queue per request, or, for requests
submitted with a sink (`EventSink`), in one call per step with every such request's events
(the engine-core process relays them to the HTTP process that way).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator

from fishserve.engine.engine import EngineEvent, EngineStats, GenerationRequest, LLMEngine
from fishserve.engine.step_profiler import StepProfiler

log = logging.getLogger(__name__)
# Takes a list of events of requests submitted with it, in order; called on the engine thread
# (keep it short: hand the list to another thread).
EventSink = Callable[[list[EngineEvent]], None]


class EngineBusyError(RuntimeError):
    """The waiting queue is full; retry later (HTTP 429)."""


def queue_full(waiting: int) -> EngineBusyError:
    """The refusal of a request while `waiting` requests wait for admission (HTTP 429)."""
    return EngineBusyError(
        f"{waiting} request{'s' if waiting != 1 else ''} waiting; try again later"
    )


class EngineDeadError(RuntimeError):
    """The engine thread is not running."""


class RequestStream:
    """The events of one request, in order, ending with a `finished` event.

    Iterate with `for` (blocking) or `async for` (when created with an event loop), or take
    events in batches with `next_batch` (async), which wakes the consumer only once `want`
    events are buffered: a streaming consumer that needs ten frames for its next audio chunk
    is woken once, not ten times.
    """

    def __init__(
        self,
        request_id: str,
        loop: asyncio.AbstractEventLoop | None,
        sink: EventSink | None = None,
    ) -> None:
        """`loop`: the event loop of an async consumer (None: blocking iteration); `sink`:
        instead of either, the engine hands this request's events to `sink` (`EventSink`)."""
        self.request_id = request_id
        self._loop = loop
        self.sink = sink
        self._error: BaseException | None = None
        self._sync: queue.SimpleQueue[EngineEvent] = queue.SimpleQueue()
        self._buffer: collections.deque[EngineEvent] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._want = 1

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the stream delivers to (None: a blocking stream)."""
        return self._loop

    def put(self, event: EngineEvent) -> None:
        """Deliver an event (called from the engine thread)."""
        if self.sink is not None:
            self.sink([event])
        elif self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self.put_in_loop, event)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                log.debug("dropped an event for request %s: event loop closed", self.request_id)
        else:
            self._sync.put(event)

    def put_in_loop(self, event: EngineEvent) -> None:
        """Deliver an event from inside the stream's own event loop (see `deliver`)."""
        if self._loop is None:
            raise RuntimeError("this stream was created without an event loop")
        self._buffer.append(event)
        waiter = self._waiter
        enough = len(self._buffer) >= self._want or event.finished or event.codes is None
        if enough and waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, error: BaseException) -> None:
        """End an async stream with `error`, raised by `next_batch` once the events already
        buffered are taken (call inside the stream's event loop). The first error stays."""
        self._error = self._error or error
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_batch(self, want: int = 1) -> list[EngineEvent]:
        """Wait until `want` events are buffered (or the final one arrived); return them all.

        Returns every buffered event, in order, up to and including a `finished` one.

        Raises:
            RuntimeError: the stream was created without an event loop.
            the stream's error (`fail`), once no event is buffered.
        """
        if self._loop is None:
            raise RuntimeError("this stream was created without an event loop")
        while len(self._buffer) < max(want, 1) and not self._has_final():
            if self._error is not None:
                if self._buffer:
                    break
                raise self._error
            self._want = max(want, 1)
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.ready()

    def _has_final(self) -> bool:
        return any(e.finished or e.codes is None for e in self._buffer)

    def ready(self) -> list[EngineEvent]:
        """The events already delivered to an async stream, without waiting (maybe none)."""
        if self._loop is None:
            raise RuntimeError("this stream was created without an event loop")
        events = []
        while self._buffer:
            events.append(self._buffer.popleft())
            if events[-1].finished:
                break
        return events

    def __iter__(self) -> Iterator[EngineEvent]:
        while True:
            event = self._sync.get()
            yield event
            if event.finished:
                return

    async def __aiter__(self) -> AsyncIterator[EngineEvent]:
        while True:
            for event in await self.next_batch(1):
                yield event
                if event.finished:
                    return


def deliver(pairs: list[tuple[RequestStream, EngineEvent]]) -> None:
    """Deliver many events of streams of one event loop (runs in that loop)."""
    for stream, event in pairs:
        stream.put_in_loop(event)


class AsyncEngine:
    """Owns an `LLMEngine` and the thread that steps it.

    Args:
        engine: the engine (used only from the engine thread after `start`).
        max_waiting: requests allowed to wait for admission; beyond it `submit` raises
            `EngineBusyError`.

    Raises:
        ValueError: bad step-profiler settings in the environment (`StepProfiler.from_env`).
    """

    def __init__(self, engine: LLMEngine, max_waiting: int = 256) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self.profiler = StepProfiler.from_env()
        self._inbox: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}
        self._lock = threading.Lock()
        self._stats = engine.stats()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fishserve-engine", daemon=True)

    # -- caller side ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread."""
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine thread; unfinished requests get a cancelled event."""
        self._stop.set()
        self._inbox.put(("wake", None))
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Whether the engine thread is running."""
        return self._thread.is_alive() and not self._stop.is_set()

    def submit(
        self,
        request: GenerationRequest,
        loop: asyncio.AbstractEventLoop | None = None,
        sink: EventSink | None = None,
    ) -> RequestStream:
        """Validate and queue a request; returns its event stream (`RequestStream`: async
        with `loop`, blocking without; with `sink`, events go there instead).

        Raises:
            EngineDeadError: the engine is not running.
            EngineBusyError: the waiting queue is full.
            ValueError (PromptTooLongError, KVPoolTooSmallError, ...): invalid request.
        """
        if not self.alive:
            raise EngineDeadError("the engine is not running")
        seq = self.engine.prepare(request)
        stream = RequestStream(request.request_id, loop, sink)
        with self._lock:
            if (waiting := self._pending()) >= self.max_waiting:
                raise queue_full(waiting)
            if request.request_id in self._streams:
                raise ValueError(f"duplicate request id {request.request_id!r}")
            self._streams[request.request_id] = stream
        self._inbox.put(("add", seq))
        return stream

    def cancel(self, request_id: str) -> None:
        """Cancel a request (its blocks are freed before the next step)."""
        self._inbox.put(("abort", request_id))

    def stats(self) -> EngineStats:
        """Counters as of the last step."""
        return self._stats

    def pending(self) -> int:
        """Requests that must wait for admission now, counted as `submit`'s queue bound
        counts them (including those submitted since the last step, which `stats` does
        not show yet)."""
        with self._lock:
            return self._pending()

    def _pending(self) -> int:
        """Requests that must wait for admission (lock held).

        Requests beyond `max_num_seqs` (or what real-time admission lets run now, when on)
        wait for sure; the last step's waiting count adds those held back for lack of KV
        blocks or by real-time admission.
        """
        capacity = self.engine.config.max_num_seqs
        if self.engine.admission is not None:
            capacity = min(capacity, self.engine.admission.capacity)
        return max(len(self._streams) - capacity, self._stats.waiting, 0)

    # -- engine thread -------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._drain_inbox(block=not self.engine.has_work())
                if self.engine.has_work():
                    self.profiler.before_step()
                    outputs = self.engine.step()
                    self.profiler.after_step()
                    self._dispatch(outputs)
                self._stats = self.engine.stats()
        except Exception:
            log.exception("engine thread crashed")
        finally:
            self._stop.set()
            self._cancel_all()
            self.profiler.close()

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, payload: object) -> None:
        if kind == "add":
            try:
                self.engine.enqueue(payload)  # type: ignore[arg-type]
            except ValueError as exc:
                rid = payload.request_id  # type: ignore[attr-defined]
                self._dispatch(
                    [EngineEvent(rid, finished=True, finish_reason="error", error=str(exc))]
                )
        elif kind == "abort":
            event = self.engine.abort(str(payload))
            if event is not None:
                self._dispatch([event])

    def _dispatch(self, events: list[EngineEvent]) -> None:
        """Hand a step's events to their streams: one wake-up per event loop, and one call
        per sink, not per event (a step at batch 1,000 would otherwise schedule 1,000
        cross-thread callbacks)."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, EngineEvent]]] = {}
        sunk: dict[EventSink, list[EngineEvent]] = {}
        with self._lock:
            for event in events:
                stream = self._streams.get(event.request_id)
                if stream is None:
                    continue
                if event.finished:
                    del self._streams[event.request_id]
                loop = stream.loop
                if stream.sink is not None:
                    sunk.setdefault(stream.sink, []).append(event)
                elif loop is None:
                    stream.put(event)
                else:
                    batches.setdefault(loop, []).append((stream, event))
        for sink, sink_events in sunk.items():
            sink(sink_events)
        for loop, pairs in batches.items():
            try:
                loop.call_soon_threadsafe(deliver, pairs)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                log.debug("dropped %d events for a closed event loop", len(pairs))

    def _cancel_all(self) -> None:
        with self._lock:
            streams, self._streams = self._streams, {}
        for rid, stream in streams.items():
            stream.put(
                EngineEvent(rid, finished=True, finish_reason="cancelled", error="engine stopped")
            )
