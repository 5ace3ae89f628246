"""One synthesis from the HTTP side: references in, audio chunks out, metrics recorded.

The engine thread generates frames; this coroutine feeds them to the request's
`StreamingDecoder`, hands ready chunks to the shared decoder thread, and yields float32 audio
chunks in order. Leaving the iteration early (client gone, timeout, error) cancels the
request in the engine, which frees its KV blocks before its next step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np

from fishserve.audio.streaming import StreamingDecoder
from fishserve.engine.engine import GenerationRequest
from fishserve.models.prompt import Reference
from fishserve.server.metrics import Metrics
from fishserve.server.runtime import Runtime
from fishserve.server.voices import VoiceStore

log = logging.getLogger(__name__)


class SynthesisError(RuntimeError):
    """Generation failed for this request (HTTP 500 if nothing was sent yet)."""


class SynthesisTimeoutError(SynthesisError):
    """The request ran past the server's request timeout (HTTP 504)."""


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
    SynthesisTimeoutError.
    """
    timing = Synthesis()
    stream = runtime.engine.submit(request, asyncio.get_running_loop())
    decoder = StreamingDecoder(runtime.decoder, runtime.chunk_policy)
    deadline = timing.arrival + timeout
    finished = False
    try:
        async for event in stream:
            if time.monotonic() > deadline:
                raise SynthesisTimeoutError(f"request exceeded the {timeout:.0f} s timeout")
            if event.codes is not None:
                timing.first_frame = timing.first_frame or time.monotonic()
                decoder.push(event.codes)
            if event.finished:
                finished = True
                _check_finish(event.finish_reason, event.error)
                decoder.close()
            while (job := decoder.next_job()) is not None:
                audio = await asyncio.wrap_future(runtime.decode_worker.submit(job))
                _record_audio(timing, metrics, audio)
                yield audio
    finally:
        if not finished:
            runtime.engine.cancel(request.request_id)
            metrics.failure.labels(reason="cancelled").inc()
        else:
            _record_finish(timing, metrics, runtime.sample_rate)


def _check_finish(reason: str | None, error: str | None) -> None:
    if reason == "error":
        raise SynthesisError(error or "generation failed")
    if reason == "cancelled":
        raise SynthesisError(error or "request cancelled")


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
    log.info(
        "request done: %.2f s audio in %.2f s (RTF %.2f)",
        seconds,
        elapsed,
        elapsed / seconds if seconds else float("nan"),
    )
