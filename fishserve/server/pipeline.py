"""One request's audio: engine frames in, decoded audio chunks out.

Runs where its runtime says: in the HTTP process on a local `Runtime` (engine in-process) or on
a `relay.RelayClient` (engine and decoder in the engine-core process, `stream_pipeline` "http");
or in the engine-core process on its local runtime (`stream_pipeline` "core"). The engine thread
generates frames; this coroutine feeds them to the request's `StreamingDecoder`, hands ready
chunks to the shared decoder thread with the stream's playback deadline, and yields float32
audio chunks in order. Leaving the iteration early (client gone, timeout, error) cancels the
request in the engine, which frees its KV blocks before its next step. Metrics are the caller's
(`service.stream_audio`).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from fishserve.audio.batching import DecodeJob
from fishserve.audio.streaming import ChunkPolicy, StreamingDecoder
from fishserve.engine.async_engine import RequestStream
from fishserve.engine.engine import EngineEvent, GenerationRequest
from fishserve.models.firefly import FireflyConfig, FireflyGenerator

T = TypeVar("T")
# The engine reports a later segment whose prompt cannot run (its PromptTooLongError or
# KVPoolTooSmallError) only as the error message of the finish event; both start like this.
_PROMPT_ERROR_PREFIX = "prompt of "


class SynthesisError(RuntimeError):
    """Generation failed for this request (HTTP 500 if nothing was sent yet)."""


class SynthesisTimeoutError(SynthesisError):
    """The request ran past the server's request timeout, queued or running (HTTP 504)."""


class ContextFullError(SynthesisError):
    """A segment's prompt leaves no room for audio in the model's context: an input problem
    (HTTP 400 if nothing was sent yet)."""


class FrameSource(Protocol):
    """The engine as `synthesize` uses it (`AsyncEngine`, `relay.RelayedEngine`)."""

    def submit(
        self, request: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None
    ) -> RequestStream:
        """Queue `request`; its events arrive through the stream."""
        ...

    def cancel(self, request_id: str) -> None:
        """Stop a request (its KV blocks are freed before the next step)."""
        ...


class ChunkDecoder(Protocol):
    """The decoder thread as `synthesize` uses it (`DecodeWorker`, `relay.RelayedDecoder`)."""

    def submit(
        self, job: DecodeJob, deadline: float | None = None, request_id: str = ""
    ) -> Future[np.ndarray] | asyncio.Future[np.ndarray]:
        """Queue a chunk by `deadline` (monotonic s); the future gives its float32 samples."""
        ...


class StreamHost(Protocol):
    """What `synthesize` needs of a runtime (`runtime.Runtime`, `relay.RelayClient`)."""

    engine: FrameSource
    decoder: FireflyGenerator | FireflyConfig  # only its config is read here
    decode_worker: ChunkDecoder
    chunk_policy: ChunkPolicy
    stateful_decoder: bool
    first_chunk_deadline: float | None  # seconds after arrival
    early_chunk_margin: float  # seconds

    @property
    def sample_rate(self) -> int:
        """Output samples per second (Hz)."""
        ...

    @property
    def max_seq_len(self) -> int:
        """Positions of the model's context."""
        ...


@dataclass
class AudioChunk:
    """Decoded audio of one chunk of a stream.

    Attributes:
        samples: ``(n,)`` float32 mono samples at the decoder's rate (44,100 Hz for the release).
        queue_seconds: on a stream's first chunk, seconds from the request's arrival to its
            first generated frame (queueing plus prefill); None on later chunks.
        decode_seconds: on a stream's first chunk, seconds from its frames' hand-over to the
            decoder to its audio (the decoder's queue and call); None on later chunks.
        frames: code frames whose audio this chunk holds (0 for an empty last chunk).
        finish_reason: on a stream's last chunk, why generation ended: "stop" (the model ended
            every segment) or "length" (a segment reached its frame budget); None on earlier
            chunks. When all audio is out before the engine reports the end, the last chunk
            has no samples.
    """

    samples: np.ndarray
    queue_seconds: float | None = None
    finish_reason: str | None = None
    decode_seconds: float | None = None
    frames: int = 0


async def synthesize(
    runtime: StreamHost, request: GenerationRequest, timeout: float, arrival: float | None = None
) -> AsyncIterator[AudioChunk]:
    """Generate and decode `request`, yielding its audio chunks in order.

    Chunks follow the runtime's `ChunkPolicy`, except that when a client that started playing
    at its first chunk is the runtime's `early_chunk_margin` (default `EARLY_CHUNK_S`) seconds
    from running out of audio, the frames generated so far
    (at least `early_chunk_frames`; while the client is out of audio, at least the policy's
    `rebuffer_frames`) are decoded at once as a shorter chunk: when generation is
    only a little faster than real time, growing chunks would otherwise leave gaps. With the
    runtime's `first_chunk_deadline` (seconds after arrival), the first chunk goes out the same
    way at that time if its frames are not all there yet. The last chunk carries the engine's
    finish reason (`AudioChunk.finish_reason`).

    Args:
        timeout: seconds the request may take from `arrival`, queued or running.
        arrival: ``time.monotonic()`` seconds when the request arrived (at the HTTP server;
            the clock is system-wide on Linux, so this holds across processes of one
            machine); None: now. The timeout, `first_chunk_deadline` and the first chunk's
            `queue_seconds` count from it.

    Raises (before anything is yielded: from `submit`, or, with a relay, from the stream's first
    wait): EngineBusyError, EngineDeadError, ValueError subclasses for invalid requests. While
    streaming: SynthesisError, SynthesisTimeoutError (also while the request is still queued),
    ContextFullError (no audio at all, or a later segment does not fit the context).
    """
    arrival = time.monotonic() if arrival is None else arrival
    deadline = arrival + timeout
    stream = runtime.engine.submit(request, asyncio.get_running_loop())
    decoder = StreamingDecoder(runtime.decoder, runtime.chunk_policy, runtime.stateful_decoder)
    first_by = (
        None if runtime.first_chunk_deadline is None else arrival + runtime.first_chunk_deadline
    )
    playback = Playback(
        runtime.sample_rate,
        early_chunk_frames(runtime.chunk_policy),
        first_by,
        runtime.early_chunk_margin,
        runtime.chunk_policy.rebuffer_frames,
    )
    first_frame: float | None = None
    frames = 0
    finished = False
    reason: str | None = None  # the engine's finish reason, once finished
    try:
        while not finished:
            # Woken once per audio chunk, not per frame; the first frame alone (queue time).
            early = playback.early_frames()
            want = decoder.frames_wanted(early) if first_frame else 1
            batch = await _next_events(stream, want, playback.hurry_at(), deadline, timeout)
            finished = bool(batch) and batch[-1].finished  # a `finished` event is always last
            codes = [e.codes for e in batch if e.codes is not None]
            if codes:  # one push for the whole backlog: per-frame work holds the GIL
                first_frame = first_frame or time.monotonic()
                frames += len(codes)
                decoder.push(np.stack(codes, axis=1))
            if finished:
                _check_finish(batch[-1], frames, runtime.max_seq_len)
                decoder.close()
                reason = batch[-1].finish_reason
                if decoder.finished:  # no audio left to carry the reason
                    yield AudioChunk(np.zeros(0, np.float32), finish_reason=reason)
            while (job := decoder.next_job(playback.early_frames())) is not None:
                submitted = time.monotonic()
                decoded = runtime.decode_worker.submit(job, playback.due(), request.request_id)
                audio = await within(asyncio.wrap_future(decoded), deadline, timeout)
                first = not playback.started
                queued = (first_frame or arrival) - arrival if first else None
                took = time.monotonic() - submitted if first else None
                playback.add(len(audio))
                yield AudioChunk(
                    audio,
                    queue_seconds=queued,
                    finish_reason=reason if decoder.finished else None,
                    decode_seconds=took,
                    frames=job.new_frames,
                )
    finally:
        if not finished:
            runtime.engine.cancel(request.request_id)


# Default seconds before a playing client would run out of audio at which pending frames are
# decoded as a short chunk (covers a decoder call and its queueing under load). A smaller
# margin makes those chunks longer (fewer decoder calls, each with ~15 frames of context)
# at the risk of a gap when the decoder is slower than the margin (server setting
# early_chunk_margin).
EARLY_CHUNK_S = 0.25


def early_chunk_frames(policy: ChunkPolicy) -> int:
    """Fewest frames worth an early chunk: half the first chunk (each decoder call also
    decodes the left context again, so tiny chunks cost the decoder most)."""
    return max(1, policy.first_chunk_frames // 2)


class Playback:
    """Where a client playing the stream in real time since its first chunk stands.

    Args:
        sample_rate: output samples per second (Hz).
        early_frames: the least frames of an early chunk (`early_chunk_frames`).
        first_chunk_by: monotonic seconds by which the first chunk should go out early if its
            frames are not all generated yet; None: no such deadline.
        margin: seconds before the client runs out of audio at which pending frames go out
            early (`EARLY_CHUNK_S` by default).
        rebuffer_frames: the least frames of an early chunk once `due` has passed, i.e. while
            the audio sent is behind a client playing without pauses since the first chunk
            (`ChunkPolicy.rebuffer_frames`; 0: `early_frames` still). Under overload,
            streams that already stalled then send fewer, longer chunks instead of whatever a
            decoder round trip let them generate: each chunk costs the decoder a call slot and
            its left context, and the engine's process the host work of a chunk.
    """

    def __init__(
        self,
        sample_rate: int,
        early_frames: int,
        first_chunk_by: float | None = None,
        margin: float = EARLY_CHUNK_S,
        rebuffer_frames: int = 0,
    ) -> None:
        self.sample_rate, self._early = sample_rate, early_frames
        self._rebuffer = max(early_frames, rebuffer_frames)
        self.first_chunk_by, self.margin = first_chunk_by, margin
        self.start: float | None = None  # monotonic seconds of the first chunk
        self.samples = 0

    @property
    def started(self) -> bool:
        """Whether the first chunk is out."""
        return self.start is not None

    def add(self, samples: int) -> None:
        """Count a chunk of `samples` handed to the client."""
        self.start = self.start if self.start is not None else time.monotonic()
        self.samples += samples

    def due(self) -> float | None:
        """When the client runs out of audio (monotonic s); None before the first chunk."""
        return None if self.start is None else self.start + self.samples / self.sample_rate

    def hurry_at(self) -> float | None:
        """When pending frames should go out early: `margin` seconds before `due`, or
        before the first chunk `first_chunk_by`."""
        due = self.due()
        return self.first_chunk_by if due is None else due - self.margin

    def early_frames(self) -> int | None:
        """`early_frames` once `hurry_at` has passed (the larger `rebuffer_frames` once `due`
        has too), else None."""
        hurry, now = self.hurry_at(), time.monotonic()
        if hurry is None or now < hurry:
            return None
        due = self.due()
        return self._rebuffer if due is not None and now >= due else self._early


async def _next_events(
    stream: RequestStream, want: int, hurry_at: float | None, deadline: float, timeout: float
) -> list[EngineEvent]:
    """The stream's events once `want` are buffered (or its last one); at `hurry_at`
    (monotonic s, if sooner) whatever is buffered, maybe nothing.

    Raises:
        SynthesisTimeoutError: `deadline` passed.
    """
    if hurry_at is not None and hurry_at < deadline:
        remaining = hurry_at - time.monotonic()
        if remaining <= 0:
            return stream.ready() or await within(stream.next_batch(want), deadline, timeout)
        try:
            async with asyncio.timeout(remaining):
                return await stream.next_batch(want)
        except TimeoutError:
            return stream.ready()
    return await within(stream.next_batch(want), deadline, timeout)


async def within(work: Awaitable[T], deadline: float, timeout: float) -> T:
    """Await `work` until `deadline` (monotonic seconds) at most; `timeout` is for the message.

    Raises:
        SynthesisTimeoutError: the deadline passed (work is cancelled).
    """
    remaining = deadline - time.monotonic()
    try:
        if remaining <= 0:
            raise TimeoutError
        async with asyncio.timeout(remaining):
            return await work
    except TimeoutError:
        if inspect.iscoroutine(work):
            work.close()  # never awaited when the deadline had already passed
        raise SynthesisTimeoutError(f"request exceeded the {timeout:g} s timeout") from None


def _check_finish(event: EngineEvent, frames: int, max_seq_len: int) -> None:
    """Raise for a stream that ended without its audio (`frames`: frames generated)."""
    if event.finish_reason == "error":
        message = event.error or "generation failed"
        if message.startswith(_PROMPT_ERROR_PREFIX):
            raise ContextFullError(f"the text does not fit the model's context: {message}")
        raise SynthesisError(message)
    if event.finish_reason == "cancelled":
        raise SynthesisError(event.error or "request cancelled")
    if frames == 0:  # max_new_tokens >= 2: the prompt left room for 1 frame only
        raise ContextFullError(
            f"the text and references leave no room for audio in the model's "
            f"{max_seq_len}-position context; shorten them"
        )
