"""One request's audio where the models live: engine frames in, decoded audio chunks out.

Runs in the process that owns the GPU (the engine-core process, or the HTTP process itself when
the engine runs in-process). The engine thread generates frames; this coroutine feeds them to
the request's `StreamingDecoder`, hands ready chunks to the shared decoder thread with the
stream's playback deadline, and yields float32 audio chunks in order. Leaving the iteration
early (client gone, timeout, error) cancels the request in the engine, which frees its KV
blocks before its next step. Metrics are the caller's (`service.stream_audio`).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from fishserve.audio.streaming import StreamingDecoder
from fishserve.engine.engine import EngineEvent, GenerationRequest

if TYPE_CHECKING:
    from fishserve.server.runtime import Runtime

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
class AudioChunk:
    """Decoded audio of one chunk of a stream.

    Attributes:
        samples: ``(n,)`` float32 mono samples at the decoder's rate (44,100 Hz for the release).
        queue_seconds: on a stream's first chunk, seconds from the request's arrival to its
            first generated frame (queueing plus prefill); None on later chunks.
    """

    samples: np.ndarray
    queue_seconds: float | None = None


async def synthesize(
    runtime: Runtime, request: GenerationRequest, timeout: float
) -> AsyncIterator[AudioChunk]:
    """Generate and decode `request`, yielding its audio chunks in order.

    Args:
        timeout: seconds the request may take from now, queued or running.

    Raises (from `submit`, before anything is yielded): EngineBusyError, EngineDeadError,
    ValueError subclasses for invalid requests. While streaming: SynthesisError,
    SynthesisTimeoutError (also while the request is still queued), ContextFullError (no
    audio at all, or a later segment does not fit the context).
    """
    arrival = time.monotonic()
    deadline = arrival + timeout
    stream = runtime.engine.submit(request, asyncio.get_running_loop())
    decoder = StreamingDecoder(runtime.decoder, runtime.chunk_policy)
    first_frame: float | None = None
    first_audio: float | None = None
    frames = samples = 0
    finished = False
    try:
        while not finished:
            # Woken once per audio chunk, not per frame; the first frame alone (queue time).
            want = decoder.frames_wanted() if first_frame else 1
            batch = await within(stream.next_batch(want), deadline, timeout)
            event = batch[-1]  # a `finished` event is always a stream's last
            finished = event.finished
            codes = [e.codes.numpy() for e in batch if e.codes is not None]
            if codes:  # one push for the whole backlog: per-frame work holds the GIL
                first_frame = first_frame or time.monotonic()
                frames += len(codes)
                decoder.push(np.stack(codes, axis=1))
            if finished:
                _check_finish(event, frames, runtime.max_seq_len)
                decoder.close()
            while (job := decoder.next_job()) is not None:
                due = None if first_audio is None else first_audio + samples / runtime.sample_rate
                decoded = asyncio.wrap_future(runtime.decode_worker.submit(job, due))
                audio = await within(decoded, deadline, timeout)
                queued = None
                if first_audio is None:
                    first_audio = time.monotonic()
                    queued = (first_frame or first_audio) - arrival
                samples += len(audio)
                yield AudioChunk(audio, queued)
    finally:
        if not finished:
            runtime.engine.cancel(request.request_id)


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
