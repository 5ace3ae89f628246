"""One synthesis from the HTTP side: references in, audio chunks out, metrics recorded.

The audio itself comes from `runtime.synthesize` (`pipeline.synthesize`, in this process or in
the engine-core process). Leaving the iteration early (client gone, timeout, error) cancels
the request there, which frees its KV blocks before the engine's next step.

Metrics: a request that ends with all its audio counts as `request_success_total` (and logs
"request done") with `finished_reason` "stop" (the model ended every segment with its end
token) or "length" (a segment reached its frame budget: `max_new_tokens`, the model's context,
or `ignore_eos`); any other end counts as
`request_failure_total` with reason "error", "timeout", "invalid" (the text does not fit the
model's context) or "cancelled" (the caller stopped iterating: client gone).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

import numpy as np

from fishserve.audio.io import AudioDecodeError
from fishserve.engine.async_engine import EngineBusyError, EngineDeadError
from fishserve.engine.engine import GenerationRequest
from fishserve.models.prompt import Reference
from fishserve.server.metrics import Metrics, mark_counted
from fishserve.server.pipeline import (
    AudioChunk,
    ContextFullError,
    SynthesisError,
    SynthesisTimeoutError,
)
from fishserve.server.runtime import ServingRuntime
from fishserve.server.voices import VoiceStore

__all__ = [
    "ContextFullError",
    "InlineReference",
    "Synthesis",
    "SynthesisError",
    "SynthesisTimeoutError",
    "encode_references",
    "load_voice",
    "stream_audio",
]
log = logging.getLogger(__name__)
# Raised before any audio, these become HTTP 4xx/429/503 responses, which the error handler
# counts as refusals (`errors.handle_any`); counting them here too would count them twice.
REFUSALS = (ValueError, EngineBusyError, EngineDeadError)


@dataclass
class InlineReference:
    """A reference given with the request (encoded audio bytes + transcript), and the request
    field its audio came from (e.g. ``references.0.audio``; None for a stored voice), named as
    ``error.param`` when the audio is refused."""

    audio: bytes
    text: str
    param: str | None = None


@dataclass
class Synthesis:
    """Timing of one request, for metrics and logs (monotonic seconds), and why its generation
    ended ("stop" or "length", from its last chunk; None before)."""

    arrival: float = field(default_factory=time.monotonic)
    first_audio: float | None = None
    audio_samples: int = 0
    finish_reason: str | None = None


async def load_voice(voices: VoiceStore, voice_id: str | None) -> list[InlineReference]:
    """The stored voice `voice_id` as a reference to encode (read off the event loop); none
    for None.

    Raises:
        VoiceNotFoundError / InvalidVoiceIdError: unknown or unsafe voice id.
    """
    if voice_id is None:
        return []
    stored = await asyncio.to_thread(voices.get, voice_id)
    return [InlineReference(stored.audio, stored.text)]


async def encode_references(
    runtime: ServingRuntime, sources: list[InlineReference]
) -> list[Reference]:
    """Codes of each reference's audio, encoded off the event loop, in order.

    Raises:
        ReferenceAudioError: undecodable, empty, silent or too long audio (its ``param`` is
            the refused source's ``param``).
    """
    refs = []
    for source in sources:
        try:
            codes = await runtime.encode_reference(source.audio)
        except AudioDecodeError as exc:  # a ReferenceAudioError, or its base from the core
            exc.param = source.param  # type: ignore[attr-defined]
            raise
        refs.append(Reference(codes, source.text))
    return refs


async def stream_audio(
    runtime: ServingRuntime,
    request: GenerationRequest,
    metrics: Metrics,
    timeout: float,
    arrival: float | None = None,
) -> AsyncIterator[np.ndarray]:
    """Generate and decode `request`, yielding float32 mono chunks at the decoder's rate.

    The request's `timeout` (seconds), its first-chunk deadline, its queue time and its TTFA
    count from `arrival` (`time.monotonic()` when the HTTP request arrived, before its body was
    read; None: now), also in the engine-core process.

    Raises: as `pipeline.synthesize` (EngineBusyError, EngineDeadError and ValueError
    subclasses before anything is yielded; SynthesisError and its subclasses while streaming).
    """
    timing = Synthesis() if arrival is None else Synthesis(arrival)
    outcome = "cancelled"
    try:
        async with aclosing(runtime.synthesize(request, timeout, timing.arrival)) as chunks:
            async for chunk in chunks:
                timing.finish_reason = chunk.finish_reason or timing.finish_reason
                if len(chunk.samples):  # a stream's last chunk may only carry its reason
                    _record_audio(timing, metrics, chunk)
                    yield chunk.samples
        outcome = "stop"
    except Exception as exc:
        refused = timing.first_audio is None and isinstance(exc, REFUSALS)
        outcome = "refused" if refused else _failure_reason(exc)
        if not refused:
            mark_counted(exc)  # the error handler must not count it again as a refusal
        raise
    finally:
        if outcome == "stop":
            _record_finish(timing, metrics, runtime.sample_rate)
        elif outcome != "refused":  # a refusal becomes a 4xx/429/503, counted with those
            metrics.failure.labels(reason=outcome).inc()


def _failure_reason(exc: Exception) -> str:
    if isinstance(exc, SynthesisTimeoutError):
        return "timeout"
    if isinstance(exc, ContextFullError):
        return "invalid"
    return "error"


def _record_audio(timing: Synthesis, metrics: Metrics, chunk: AudioChunk) -> None:
    if timing.first_audio is None:
        timing.first_audio = time.monotonic()
        metrics.ttfa.observe(timing.first_audio - timing.arrival)
        if chunk.queue_seconds is not None:
            metrics.queue_time.observe(chunk.queue_seconds)
        if chunk.decode_seconds is not None:
            metrics.first_chunk_decode.observe(chunk.decode_seconds)
            metrics.first_chunk_frames.observe(chunk.frames)
    timing.audio_samples += len(chunk.samples)


def _record_finish(timing: Synthesis, metrics: Metrics, sample_rate: int) -> None:
    elapsed = time.monotonic() - timing.arrival
    seconds = timing.audio_samples / sample_rate
    metrics.e2e.observe(elapsed)
    metrics.audio_seconds.inc(seconds)
    if seconds > 0:
        metrics.rtf.observe(elapsed / seconds)
    metrics.success.labels(finished_reason=timing.finish_reason or "stop").inc()
    rtf = f"{elapsed / seconds:.2f}" if seconds > 0 else "n/a"
    log.info("request done: %.2f s audio in %.2f s (RTF %s)", seconds, elapsed, rtf)
