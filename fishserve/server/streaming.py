"""Response bodies of the speech routes: streamed audio, OpenAI's SSE events, whole files.

Streamed responses await the first audio chunk before they start, so that refusals (busy, bad
input, no room for audio) still get a proper status code. A failure after the start is logged
in one line and then:

* audio streams end the connection without the terminating chunk (`StreamAbortedError`, see
  `GuardMiddleware` in app.py), so clients see an incomplete response, not a short file;
* SSE streams send `{"type": "error", "error": {"message": ...}}` instead of
  `speech.audio.done`.

Either way the encoder is finished (its FFmpeg resources freed) and the generation cancelled,
also when the client goes away.

SSE `speech.audio.delta` events always carry audio: an encoder call that returned no bytes
(the end of a wav/pcm stream, an mp3 frame still filling) sends no event.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect

from fishserve.audio.encoders import AudioFormat, stream_encoder
from fishserve.server.errors import ApiError, StreamAbortedError, log_stream_failure
from fishserve.server.state import ServerState

log = logging.getLogger(__name__)
T = TypeVar("T")
DISCONNECT_POLL_SECONDS = 0.5  # how often a non-streaming request checks for its client
_INLINE_FORMATS = (AudioFormat.WAV, AudioFormat.PCM)  # cheap enough for the event loop
_DONE = {
    "type": "speech.audio.done",
    "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
}


class OffloadedEncoder:
    """A stream encoder driven from the event loop.

    mp3/opus/flac calls run in a worker thread (wav/pcm inline), one at a time. `close()`
    finishes the encoder without waiting, dropping its bytes: a stream abandoned mid-way
    still releases FFmpeg's threads and buffers, after any push still running.
    """

    def __init__(self, fmt: AudioFormat, sample_rate: int) -> None:
        self._encoder = stream_encoder(fmt, sample_rate)
        self._inline = fmt in _INLINE_FORMATS
        self._lock = threading.Lock()

    async def push(self, chunk: np.ndarray) -> bytes:
        """Encoded bytes of `chunk` that are ready."""
        return await self._call(self._encoder.push, chunk)

    async def finish(self) -> bytes:
        """The last bytes of the stream."""
        return await self._call(self._encoder.finish)

    def close(self) -> None:
        """Finish the encoder if that has not happened yet (idempotent, never blocks)."""
        if self._inline:
            self._finish_quietly()
        else:
            asyncio.get_running_loop().run_in_executor(None, self._finish_quietly)

    async def _call(self, method: Callable[..., bytes], *args: Any) -> bytes:
        if self._inline:
            return method(*args)
        return await asyncio.to_thread(self._locked, method, *args)

    def _locked(self, method: Callable[..., bytes], *args: Any) -> bytes:
        with self._lock:
            return method(*args)

    def _finish_quietly(self) -> None:
        try:
            self._locked(self._encoder.finish)
        except Exception:  # an abandoned encoder may be in any state; nothing to report
            log.debug("finishing an abandoned stream encoder failed", exc_info=True)


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work` while checking every `DISCONNECT_POLL_SECONDS` that the client is there.

    Raises:
        ClientDisconnect: the client went away; `work` is cancelled first (a generation
            awaited in it is cancelled in the engine by its own `finally`).
    """
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS)
            if not task.done() and await request.is_disconnected():
                raise ClientDisconnect
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    return task.result()


async def first_chunk(request: Request, chunks: AsyncIterator[np.ndarray]) -> np.ndarray:
    """The first audio chunk; errors raised here still become a proper error response.

    A client that goes away meanwhile (queued, or generating its first chunk) cancels the
    generation within `DISCONNECT_POLL_SECONDS`.

    Raises:
        ApiError 500: the generation ended without audio.
        ClientDisconnect: the client went away.
    """
    first = await until_disconnect(request, anext(chunks, None))
    if first is None:
        raise ApiError(500, "no audio was generated")
    return first


async def streaming_response(
    state: ServerState,
    request: Request,
    chunks: AsyncIterator[np.ndarray],
    fmt: AudioFormat,
    sample_rate: int,
    headers: dict[str, str],
) -> StreamingResponse:
    """Audio encoded as it comes (see the module docstring for failures)."""
    first = await first_chunk(request, chunks)

    async def body() -> AsyncIterator[bytes]:
        encoder = OffloadedEncoder(fmt, sample_rate)
        with state.busy():
            try:
                yield await encoder.push(first)
                async for chunk in chunks:
                    yield await encoder.push(chunk)
                yield await encoder.finish()
            except Exception as exc:
                log_stream_failure(exc, f"{fmt.value} stream")
                raise StreamAbortedError from exc
            finally:
                encoder.close()
                await chunks.aclose()

    return StreamingResponse(body(), headers=headers, media_type=fmt.content_type)


async def sse_response(
    state: ServerState,
    request: Request,
    chunks: AsyncIterator[np.ndarray],
    fmt: AudioFormat,
    sample_rate: int,
    headers: dict[str, str],
) -> StreamingResponse:
    """OpenAI's `stream_format: sse`: `speech.audio.delta` events, then `speech.audio.done`
    (or an `error` event)."""
    first = await first_chunk(request, chunks)
    headers = {k: v for k, v in headers.items() if k != "Content-Type"}

    async def body() -> AsyncIterator[bytes]:
        encoder = OffloadedEncoder(fmt, sample_rate)
        with state.busy():
            try:
                if data := await encoder.push(first):
                    yield _delta(data)
                async for chunk in chunks:
                    if data := await encoder.push(chunk):
                        yield _delta(data)
                if data := await encoder.finish():
                    yield _delta(data)
                yield _event(_DONE)
            except Exception as exc:
                message = log_stream_failure(exc, "SSE stream")
                yield _event({"type": "error", "error": {"message": message}})
            finally:
                encoder.close()
                await chunks.aclose()

    return StreamingResponse(body(), headers=headers, media_type="text/event-stream")


def _event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def _delta(data: bytes) -> bytes:
    return _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})


async def collect(request: Request, chunks: AsyncIterator[np.ndarray]) -> np.ndarray:
    """All chunks of a non-streaming request, concatenated.

    Raises:
        ClientDisconnect: the client went away; the generation is cancelled (its KV blocks
            are free within `DISCONNECT_POLL_SECONDS`).
    """

    async def gather() -> list[np.ndarray]:
        return [chunk async for chunk in chunks]

    parts = await until_disconnect(request, gather())
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
