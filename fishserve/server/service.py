"""One synthesis from the HTTP side: references in, audio chunks out, metrics recorded.

The engine thread generates frames; this coroutine feeds them to the request's
`StreamingDecoder`, hands ready chunks to the shared decoder thread, and yields float32 audio
chunks in order. Leaving the iteration early (client gone, timeout, error) cancels the
request in the engine, which frees its KV blocks before its next step.

Metrics: a request that ends with all its audio counts as `request_success_total
{finished_reason="stop"}` (and logs "request done"); any other end counts as
`request_failure_total` with reason "error", "timeout", "invalid" (the text does not fit the
model's context) or "cancelled" (the caller stopped iterating: client gone).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from fishserve.audio.streaming import StreamingDecoder
from fishserve.engine.async_engine import RequestStream
from fishserve.engine.engine import EngineEvent, GenerationRequest
from fishserve.models.prompt import Reference
from fishserve.server.metrics import Metrics
from fishserve.server.runtime import Runtime
from fishserve.server.voices import VoiceStore

log = logging.getLogger(__name__)
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


@dataclass
class InlineReference:
    """A reference given with the request (encoded audio bytes + transcript)."""

    audio: bytes
    text: str


@dataclass
class Synthesis:
    """Timing of one request, for metrics and logs (monotonic seconds)."""

    arrival: float = field(default_factory=time.monotonic)
    first_frame: float | None = None
    first_audio: float | None = None
    audio_frames: int = 0
    audio_samples: int = 0


async def resolve_references(
    runtime: Runtime, voices: VoiceStore, voice_id: str | None, inline: list[InlineReference]
) -> list[Reference]:
    """Codes of a stored voice and/or inline references, encoded off the event loop.

    Raises:
        VoiceNotFoundError / InvalidVoiceIdError: unknown or unsafe voice id.
        ReferenceAudioError: undecodable, empty, silent or too long audio.
    """
    sources = [InlineReference(r.audio, r.text) for r in inline]
    if voice_id is not None:
        stored = await asyncio.to_thread(voices.get, voice_id)
        sources.insert(0, InlineReference(stored.audio, stored.text))
    refs = []
    for source in sources:
        codes = await asyncio.to_thread(runtime.references.encode, source.audio)
        refs.append(Reference(codes, source.text))
    return refs


async def stream_audio(
    runtime: Runtime, request: GenerationRequest, metrics: Metrics, timeout: float
) -> AsyncIterator[np.ndarray]:
    """Generate and decode `request`, yielding float32 mono chunks at the decoder's rate.

    Raises (from `submit`, before anything is yielded): EngineBusyError, EngineDeadError,
    ValueError subclasses for invalid requests. While streaming: SynthesisError,
    SynthesisTimeoutError (also while the request is still queued), ContextFullError (no
    audio at all, or a later segment does not fit the context).
    """
    timing = Synthesis()
    stream = runtime.engine.submit(request, asyncio.get_running_loop())
    decoder = StreamingDecoder(runtime.decoder, runtime.chunk_policy)
    outcome = "cancelled"
    try:
        finished = False
        while not finished:
            # Woken once per audio chunk, not per frame; the first frame alone (queue time).
            want = decoder.frames_wanted() if timing.first_frame else 1
            batch = await _next_events(stream, want, timing.arrival + timeout, timeout)
            event = batch[-1]  # a `finished` event is always a stream's last
            finished = event.finished
            codes = [e.codes.numpy() for e in batch if e.codes is not None]
            if codes:  # one push for the whole backlog: per-frame work holds the GIL
                timing.first_frame = timing.first_frame or time.monotonic()
                timing.audio_frames += len(codes)
                decoder.push(np.stack(codes, axis=1))
            if finished:
                _check_finish(event, timing, runtime.max_seq_len)
                decoder.close()
            while (job := decoder.next_job()) is not None:
                deadline = _playback_deadline(timing, runtime.sample_rate)
                decoded = asyncio.wrap_future(runtime.decode_worker.submit(job, deadline))
                audio = await _within(decoded, timing.arrival + timeout, timeout)
                _record_audio(timing, metrics, audio)
                yield audio
        outcome = "stop"
    except Exception as exc:
        outcome = _failure_reason(exc)
        raise
    finally:
        if outcome == "stop":
            _record_finish(timing, metrics, runtime.sample_rate)
        else:
            runtime.engine.cancel(request.request_id)
            metrics.failure.labels(reason=outcome).inc()


async def _next_events(
    stream: RequestStream, want: int, deadline: float, timeout: float
) -> list[EngineEvent]:
    """The stream's next events once `want` are there (or the last one), waiting at most until
    `deadline` (monotonic seconds).

    Raises:
        SynthesisTimeoutError: the deadline passed (queued or running).
    """
    return await _within(stream.next_batch(want), deadline, timeout)


async def _within(work: Awaitable[T], deadline: float, timeout: float) -> T:
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


def _check_finish(event: EngineEvent, timing: Synthesis, max_seq_len: int) -> None:
    if event.finish_reason == "error":
        message = event.error or "generation failed"
        if message.startswith(_PROMPT_ERROR_PREFIX):
            raise ContextFullError(f"the text does not fit the model's context: {message}")
        raise SynthesisError(message)
    if event.finish_reason == "cancelled":
        raise SynthesisError(event.error or "request cancelled")
    if timing.audio_frames == 0:  # max_new_tokens >= 2: the prompt left room for 1 frame only
        raise ContextFullError(
            f"the text and references leave no room for audio in the model's "
            f"{max_seq_len}-position context; shorten them"
        )


def _playback_deadline(timing: Synthesis, sample_rate: int) -> float | None:
    """When a client playing since its first audio runs dry (monotonic s); None: no audio yet."""
    if timing.first_audio is None:
        return None
    return timing.first_audio + timing.audio_samples / sample_rate


def _failure_reason(exc: Exception) -> str:
    if isinstance(exc, SynthesisTimeoutError):
        return "timeout"
    if isinstance(exc, ContextFullError):
        return "invalid"
    return "error"


def _record_audio(timing: Synthesis, metrics: Metrics, audio: np.ndarray) -> None:
    if timing.first_audio is None:
        timing.first_audio = time.monotonic()
        metrics.ttfa.observe(timing.first_audio - timing.arrival)
        if timing.first_frame is not None:
            metrics.queue_time.observe(timing.first_frame - timing.arrival)
    timing.audio_samples += len(audio)


def _record_finish(timing: Synthesis, metrics: Metrics, sample_rate: int) -> None:
    elapsed = time.monotonic() - timing.arrival
    seconds = timing.audio_samples / sample_rate
    metrics.e2e.observe(elapsed)
    metrics.audio_seconds.inc(seconds)
    if seconds > 0:
        metrics.rtf.observe(elapsed / seconds)
    metrics.success.labels(finished_reason="stop").inc()
    rtf = f"{elapsed / seconds:.2f}" if seconds > 0 else "n/a"
    log.info("request done: %.2f s audio in %.2f s (RTF %s)", seconds, elapsed, rtf)
