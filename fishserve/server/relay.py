"""Each stream's pipeline in the HTTP process, the models in the engine-core process.

The engine-core process (`engine_core`) holds the engine thread and the decoder thread; what
the GPU does is launched from Python there, through one GIL. In round 27 (docs/benchmarks.md
§6.27) that process used 1.55 cores at 704 streams: engine thread 0.53, the asyncio loop that
ran every stream's `pipeline.synthesize` 0.34, decoder thread 0.27, the sender 0.16; the
engine thread waited 0.58 ms (median) for the GIL each time it took it back. With the relay
(`ServerConfig.stream_pipeline` "http", not the default), `pipeline.synthesize` runs in the
HTTP process instead (chunking, playback deadlines, timeouts), and the core only generates
frames and decodes the chunks it is sent. On the H200 (§6.28) the engine then ran 7-22% more
steps per second, but the one HTTP process saturated (1.1 cores through its GIL) and time to
first audio rose: an option for when the HTTP side has cores to spare, not the default.

Messages:

HTTP -> core:
    ``("submit", GenerationRequest)``: start generating; the request's frames come back in
    ``("frames", FrameBatch)`` messages, one per engine step for all relayed requests.
    ``("decode", job_id, request_id, codes, context_frames, stateful, deadline)``: decode one
    chunk (`DecodeJob`) by ``deadline`` (monotonic seconds, or None); the samples come back as
    ``("audio", job_id, samples)`` or ``("decode_error", job_id, exception)``.
    ``("release", request_id)``: the request is over on the HTTP side (finished, failed or
    cancelled): cancel it in the engine if it still runs, cancel its chunks still queued for
    the decoder, drop its decoder state.
core -> HTTP:
    ``("frames", FrameBatch)``, ``("audio", ...)``, ``("decode_error", ...)``, and
    ``("submit_error", request_id, exception)`` when the engine refused a request (busy,
    too long, ...), raised by the request's stream on the HTTP side.

A stateful stream (`StreamingDecoder(stateful=True)`, the CPU's decoder) keeps its decoder
state (`StreamState`) in the core, keyed by request id, until its release.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from fishserve.audio.batching import DecodeJob
from fishserve.audio.streaming import ChunkPolicy
from fishserve.engine.async_engine import EngineDeadError, RequestStream
from fishserve.engine.engine import EngineEvent, GenerationRequest
from fishserve.models.firefly import FireflyConfig
from fishserve.models.firefly.streaming import StreamState

if TYPE_CHECKING:
    from fishserve.server.engine_core import Sender
    from fishserve.server.runtime import Runtime

Send = Callable[[tuple[Any, ...]], None]
# The kinds of message the HTTP process sends to the core's relay.
RELAY_MESSAGES = frozenset({"submit", "decode", "release"})
# Per event loop, the calls to make there (one thread-safe wake-up per loop and batch).
Calls = dict[asyncio.AbstractEventLoop, list[Callable[[], None]]]


@dataclass(frozen=True)
class RelaySpec:
    """What the HTTP process needs to run `pipeline.synthesize` for a core's models.

    Attributes:
        decoder_config: the decoder's config (frame size, codebooks, receptive field).
        chunk_policy: the chunk schedule (`ChunkPolicy`).
        stateful: streams decode continuing their decoder state (no left context).
        first_chunk_deadline: seconds after arrival (`ServerConfig.first_chunk_deadline`).
        early_chunk_margin: seconds (`ServerConfig.early_chunk_margin`).
    """

    decoder_config: FireflyConfig
    chunk_policy: ChunkPolicy
    stateful: bool
    first_chunk_deadline: float | None
    early_chunk_margin: float

    @classmethod
    def of(cls, runtime: Runtime) -> RelaySpec:
        """The spec of a loaded local runtime."""
        return cls(
            runtime.decoder.config,
            runtime.chunk_policy,
            runtime.stateful_decoder,
            runtime.first_chunk_deadline,
            runtime.early_chunk_margin,
        )


class FrameBatch:
    """One engine step's events of relayed requests, pickled as a few arrays.

    Built on the engine thread from the events as they are (no copy); packed only when
    pickled, on the sender thread, and unpickled as `PackedFrames`. Pickling 800
    `EngineEvent` objects took ~3.0 ms on the development CPU, the packed form 0.36 ms.

    Attributes:
        events: the events, in order (per request: its frames, then its final event).
    """

    def __init__(self, events: list[EngineEvent]) -> None:
        self.events = events

    def __reduce__(self) -> tuple[Any, ...]:
        events = self.events
        with_codes = [e.codes for e in events if e.codes is not None]
        codes = np.stack(with_codes) if with_codes else np.zeros((0, 0), np.int64)
        has_codes = [e.codes is not None for e in events]
        ends = {
            i: (e.finished, e.finish_reason, e.error)
            for i, e in enumerate(events)
            if e.finished or e.codes is None
        }
        ids = [e.request_id for e in events]
        segments = np.fromiter((e.segment for e in events), np.int64, len(events))
        return (PackedFrames, (ids, segments, has_codes, codes, ends))


class PackedFrames:
    """A `FrameBatch` as it arrives: arrays, turned into events only for the streams that
    are still listening (`deliver`), in the event loop that consumes them.

    Args:
        ids: request id of each event; segments: int64 ``(n,)`` segment of each event;
        has_codes: whether each event carries a frame; codes: int64 ``(frames, nc)``, the
            frames in event order; ends: ``{index: (finished, finish_reason, error)}`` of the
            events that end a request or carry no frame.
    """

    def __init__(
        self,
        ids: list[str],
        segments: np.ndarray,
        has_codes: list[bool],
        codes: np.ndarray,
        ends: dict[int, tuple[bool, str | None, str | None]],
    ) -> None:
        self.ids, self.segments, self.has_codes = ids, segments, has_codes
        self.codes, self.ends = codes, ends

    def events(self) -> list[EngineEvent]:
        """The events, in order."""
        return [event for _, event in self._pairs()]

    def deliver(self, streams: dict[str, RequestStream], loop: asyncio.AbstractEventLoop) -> None:
        """Hand each event to its stream in `streams` if that stream consumes in `loop`
        (call inside `loop`): per frame, one lookup, one event and one `put_in_loop`."""
        for rid, event in self._pairs():
            stream = streams.get(rid)
            if stream is not None and stream.loop is loop:
                stream.put_in_loop(event)

    def _pairs(self) -> Iterator[tuple[str, EngineEvent]]:
        rows, ends = iter(self.codes), self.ends
        segments = self.segments.tolist()
        for i, (rid, has) in enumerate(zip(self.ids, self.has_codes, strict=True)):
            event = EngineEvent(rid, next(rows) if has else None, segments[i])
            if i in ends:
                event.finished, event.finish_reason, event.error = ends[i]
            yield rid, event


# -- core side ---------------------------------------------------------------------------------
class CoreRelay:
    """The engine-core side: generates relayed requests and decodes the chunks it is sent.

    `handle` runs on the core's reader thread; the engine's events leave in one `FrameBatch`
    per step (`_sink`, on the engine thread) and decoded chunks as they are done (`_decoded`,
    on the decoder thread), all through `outbox`.

    Args:
        runtime: the core's local runtime.
        outbox: the sender to the HTTP process.
        portable: makes an exception picklable (`engine_core.portable_exception`).
    """

    def __init__(
        self,
        runtime: Runtime,
        outbox: Sender,
        portable: Callable[[BaseException], BaseException],
    ) -> None:
        self.runtime, self.outbox, self.portable = runtime, outbox, portable
        self.states: dict[str, StreamState] = {}  # stateful streams' decoder state
        self._lock = threading.Lock()
        self.queued: dict[str, set[Future[np.ndarray]]] = {}  # chunks not yet decoded

    def handle(self, message: tuple[Any, ...]) -> None:
        """Serve one relay message (see the module docstring)."""
        kind = message[0]
        if kind == "submit":
            self.submit(message[1])
        elif kind == "decode":
            self.decode(*message[1:])
        elif kind == "release":
            self.release(message[1])

    def submit(self, request: GenerationRequest) -> None:
        """Queue `request` in the engine; a refusal goes back as ``submit_error``."""
        try:
            self.runtime.engine.submit(request, sink=self._sink)
        except Exception as exc:
            self.outbox.put(("submit_error", request.request_id, self.portable(exc)))

    def _sink(self, events: list[EngineEvent]) -> None:
        self.outbox.put(("frames", FrameBatch(events)))

    def decode(
        self,
        job_id: int,
        request_id: str,
        codes: np.ndarray,
        context_frames: int,
        stateful: bool,
        deadline: float | None,
    ) -> None:
        """Queue one chunk on the decoder thread; its samples go back as ``audio``."""
        state = self.states.setdefault(request_id, StreamState()) if stateful else None
        try:
            job = DecodeJob(codes, context_frames, state)
            future = self.runtime.decode_worker.submit(job, deadline)
        except Exception as exc:
            self.outbox.put(("decode_error", job_id, self.portable(exc)))
            return
        with self._lock:
            self.queued.setdefault(request_id, set()).add(future)
        future.add_done_callback(partial(self._decoded, job_id, request_id))

    def _decoded(self, job_id: int, request_id: str, future: Future[np.ndarray]) -> None:
        with self._lock:
            pending = self.queued.get(request_id)
            if pending is not None:
                pending.discard(future)
                if not pending:
                    del self.queued[request_id]
        if future.cancelled():  # released: nobody waits for it
            return
        error = future.exception()
        if error is not None:
            self.outbox.put(("decode_error", job_id, self.portable(error)))
        else:
            self.outbox.put(("audio", job_id, future.result()))

    def release(self, request_id: str) -> None:
        """The request is over on the HTTP side: cancel it if it still runs (a no-op once it
        finished), cancel its chunks still queued for the decoder (one being decoded
        finishes), drop its decoder state."""
        self.runtime.engine.cancel(request_id)
        with self._lock:
            pending = list(self.queued.get(request_id, ()))
        for future in pending:
            future.cancel()
        self.states.pop(request_id, None)


# -- HTTP side ---------------------------------------------------------------------------------
class RelayClient:
    """The HTTP side: what `pipeline.synthesize` needs of a runtime, with the engine and the
    decoder in the core (a `pipeline.StreamHost`).

    `deliver` (the reader thread of `RemoteRuntime`) routes the core's relay messages to the
    waiting streams and decoder futures; `fail_all` ends them all, and every later request,
    once the core is gone.

    Args:
        spec: the core's `RelaySpec`; sample_rate (Hz), max_seq_len: the core's models'.
        send: puts a message on the pipe to the core (never blocks).
        alive: whether the core can take requests (else `EngineDeadError`).
    """

    def __init__(
        self,
        spec: RelaySpec,
        sample_rate: int,
        max_seq_len: int,
        send: Send,
        alive: Callable[[], bool],
    ) -> None:
        self.decoder = spec.decoder_config
        self.chunk_policy = spec.chunk_policy
        self.stateful_decoder = spec.stateful
        self.first_chunk_deadline = spec.first_chunk_deadline
        self.early_chunk_margin = spec.early_chunk_margin
        self.sample_rate, self.max_seq_len = sample_rate, max_seq_len
        self.engine = RelayedEngine(self)
        self.decode_worker = RelayedDecoder(self)
        self.send, self.alive = send, alive
        self.lock = threading.Lock()
        self.streams: dict[str, RequestStream] = {}
        self.loops: dict[asyncio.AbstractEventLoop, int] = {}  # streams per consuming loop
        self.decodes: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[np.ndarray]]] = {}
        self.job_ids = itertools.count()
        self.dead: BaseException | None = None  # set by fail_all

    @property
    def active(self) -> int:
        """Relayed requests not yet released."""
        return len(self.streams)

    def register(self, stream: RequestStream, loop: asyncio.AbstractEventLoop) -> None:
        """Listen for `stream`'s events (consumed in `loop`).

        Raises:
            EngineDeadError: the core is gone (`fail_all` ran).
            ValueError: a stream of that request id is registered already.
        """
        with self.lock:
            self._check_alive()
            if stream.request_id in self.streams:
                raise ValueError(f"duplicate request id {stream.request_id!r}")
            self.streams[stream.request_id] = stream
            self.loops[loop] = self.loops.get(loop, 0) + 1

    def await_decode(self, job_id: int, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        """A future for job `job_id`'s samples, settled in `loop`.

        Raises:
            EngineDeadError: the core is gone (`fail_all` ran).
        """
        future: asyncio.Future[np.ndarray] = loop.create_future()
        with self.lock:
            self._check_alive()
            self.decodes[job_id] = (loop, future)
        # a waiter that gives up (its request released) gets no answer: the core drops the job
        future.add_done_callback(partial(self._forget, job_id))
        return future

    def _forget(self, job_id: int, _: asyncio.Future[np.ndarray]) -> None:
        with self.lock:
            self.decodes.pop(job_id, None)

    def _check_alive(self) -> None:
        if self.dead is not None or not self.alive():
            raise EngineDeadError("the engine process is not running")

    def release(self, request_id: str) -> None:
        """End a request on this side and tell the core (once): it cancels the request if it
        still runs and drops its queued chunks and decoder state."""
        with self.lock:
            stream = self.streams.pop(request_id, None)
            if stream is not None and stream.loop is not None:
                left = self.loops.get(stream.loop, 1) - 1
                if left:
                    self.loops[stream.loop] = left
                else:
                    self.loops.pop(stream.loop, None)
        if stream is not None and self.dead is None:
            self.send(("release", request_id))

    def deliver(self, message: tuple[Any, ...], calls: Calls) -> bool:
        """Route one relay message into `calls` (made later, per loop); False if `message` is
        not a relay message. Call with `lock` held."""
        kind = message[0]
        if kind == "frames":
            for loop in self.loops:  # the events are made in the loops, only for listeners
                calls.setdefault(loop, []).append(partial(self._frames, message[1], loop))
        elif kind == "audio" or kind == "decode_error":
            waiter = self.decodes.pop(message[1], None)
            if waiter is not None:
                loop, future = waiter
                calls.setdefault(loop, []).append(partial(_settle, future, kind, message[2]))
        elif kind == "submit_error":
            stream = self.streams.get(message[1])
            if stream is not None and stream.loop is not None:
                calls.setdefault(stream.loop, []).append(partial(stream.fail, message[2]))
        else:
            return False
        return True

    def _frames(self, frames: PackedFrames, loop: asyncio.AbstractEventLoop) -> None:
        frames.deliver(self.streams, loop)

    def fail_all(self, error: BaseException, calls: Calls) -> None:
        """End every stream and decoder future with `error`, and refuse new ones (the core is
        gone)."""
        with self.lock:
            self.dead = error
            streams, self.streams, self.loops = list(self.streams.values()), {}, {}
            decodes, self.decodes = list(self.decodes.values()), {}
        for stream in streams:
            if stream.loop is not None:
                calls.setdefault(stream.loop, []).append(partial(stream.fail, error))
        for loop, future in decodes:
            calls.setdefault(loop, []).append(partial(_settle, future, "decode_error", error))


def _settle(future: asyncio.Future[np.ndarray], kind: str, value: Any) -> None:
    if future.done():  # the waiter gave up (timeout, cancellation)
        return
    if kind == "audio":
        future.set_result(value)
    else:
        future.set_exception(value)


def run_calls(calls: Calls) -> None:
    """Make `calls` in their loops: one thread-safe wake-up per loop."""
    for loop, batch in calls.items():
        try:
            loop.call_soon_threadsafe(_run_all, batch)
        except RuntimeError:  # that loop is closed: nobody waits any more
            continue


def _run_all(batch: list[Callable[[], None]]) -> None:
    for call in batch:
        call()


class RelayedEngine:
    """`AsyncEngine`'s `submit` and `cancel` for `pipeline.synthesize`, over the pipe."""

    def __init__(self, client: RelayClient) -> None:
        self.client = client

    def submit(
        self, request: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None
    ) -> RequestStream:
        """Send `request` to the core; its events arrive through the returned stream, and so
        do the core's refusals (EngineBusyError, PromptTooLongError, ...: raised by the
        stream's `next_batch`, before any event).

        Raises:
            EngineDeadError: the core is not running.
            ValueError: `loop` is None (relayed streams are async), or a duplicate request id.
        """
        if loop is None:
            raise ValueError("a relayed request needs the event loop that consumes it")
        stream = RequestStream(request.request_id, loop)
        self.client.register(stream, loop)
        self.client.send(("submit", request))
        return stream

    def cancel(self, request_id: str) -> None:
        """Stop the request: the core frees its KV blocks before the engine's first step
        after the message arrives (`RelayClient.release`)."""
        self.client.release(request_id)


class RelayedDecoder:
    """`DecodeWorker.submit` for `pipeline.synthesize`: the chunk is decoded in the core."""

    def __init__(self, client: RelayClient) -> None:
        self.client = client

    def submit(
        self, job: DecodeJob, deadline: float | None = None, request_id: str = ""
    ) -> asyncio.Future[np.ndarray]:
        """Send `job` (a chunk of request `request_id`'s stream) to the core's decoder by
        `deadline` (monotonic s; None: now); the future gives its float32 samples. Call
        inside the event loop that awaits the future.

        Raises:
            EngineDeadError: the core is not running.
        """
        job_id = next(self.client.job_ids)
        future = self.client.await_decode(job_id, asyncio.get_running_loop())
        stateful = job.state is not None
        self.client.send(
            ("decode", job_id, request_id, job.codes, job.context_frames, stateful, deadline)
        )
        return future
