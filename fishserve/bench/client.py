"""One timed text-to-speech request: send, read the audio stream, measure.

Times are `time.perf_counter()` seconds. Audio is counted exactly from the bytes: `pcm` is
s16le mono (2 bytes per sample), `wav` is the same after its header (the `data` chunk). The
sample rate comes from the `X-Sample-Rate` header (fishserve), the WAV header, or the
caller's fallback (OpenAI's `pcm` is documented as 24 kHz).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import struct
import time
from dataclasses import dataclass
from typing import Any

import httpx

BYTES_PER_SAMPLE = 2  # s16le
_WAV_SEARCH_BYTES = 4096  # the `data` chunk starts within this many bytes of any WAV we read


@dataclass
class RequestRecord:
    """Measurements of one request.

    Attributes:
        index: request number within its level (0-based).
        level: the level it ran at (concurrency, or arrival rate in requests/s).
        category: workload category of its text (e.g. `short-en`).
        start_s: send time, seconds since the benchmark started.
        status: "200", another HTTP status, or the failure kind ("timeout", "connect",
            "stream", "empty").
        ttfa_s: seconds from send to the first audio byte (queueing + prefill + first chunk).
        sent_s: seconds from send to the request's last byte written to its connection: the
            client's own wait for a pooled or new connection, not the server's work (the
            server answers a streamed request's headers with its first audio, so its response
            headers cannot tell the two apart). None when the request was never sent.
        latency_s: seconds from send to the last byte (or to the failure).
        audio_s: seconds of audio received.
        stall_s: extra start-up buffer (seconds) a player starting at the first audio byte
            would have needed to play without interruption (0: the stream never fell behind).
        error: short message for failures.
    """

    index: int
    level: float
    category: str
    start_s: float
    status: str
    ttfa_s: float | None = None
    sent_s: float | None = None
    latency_s: float = 0.0
    audio_s: float = 0.0
    stall_s: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """HTTP 200 with a complete, non-empty audio stream."""
        return self.status == "200"

    @property
    def rtf(self) -> float | None:
        """Real-time factor: wall seconds / audio seconds (<= 1 is faster than real time)."""
        return self.latency_s / self.audio_s if self.ok and self.audio_s > 0 else None

    def frames_per_s(self, frame_rate: float) -> float | None:
        """Audio frames delivered per wall second (`frame_rate` frames per audio second)."""
        return self.audio_s * frame_rate / self.latency_s if self.ok else None


class AudioCounter:
    """Counts audio seconds in a pcm or wav byte stream as it arrives."""

    def __init__(self, audio_format: str, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self.header_pending = audio_format == "wav"
        self.head = b""
        self.audio_bytes = 0

    def push(self, chunk: bytes) -> int:
        """Add a chunk; return how many audio bytes it carried (header bytes excluded)."""
        if not self.header_pending:
            self.audio_bytes += len(chunk)
            return len(chunk)
        self.head += chunk
        parsed = parse_wav_header(self.head)
        if parsed is None:
            if len(self.head) > _WAV_SEARCH_BYTES:
                raise ValueError("no WAV data chunk in the first 4 KiB")
            return 0
        offset, self.sample_rate = parsed
        self.header_pending = False
        audio = len(self.head) - offset
        self.audio_bytes += audio
        return audio

    @property
    def seconds(self) -> float:
        """Audio seconds so far (whole samples)."""
        return (self.audio_bytes // BYTES_PER_SAMPLE) / self.sample_rate


def parse_wav_header(head: bytes) -> tuple[int, int] | None:
    """(offset of the first sample, sample rate in Hz) of a RIFF/WAVE stream's first bytes,
    or None while the `data` chunk has not started yet.

    Raises:
        ValueError: not a RIFF/WAVE stream, or no `fmt ` chunk before `data`.
    """
    if len(head) < 12:
        return None
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        raise ValueError("response is not a RIFF/WAVE stream")
    pos, rate = 12, None
    while pos + 8 <= len(head):
        chunk_id, size = head[pos : pos + 4], struct.unpack_from("<I", head, pos + 4)[0]
        if chunk_id == b"fmt " and pos + 16 <= len(head):
            rate = struct.unpack_from("<I", head, pos + 12)[0]  # after format tag and channels
        if chunk_id == b"data":
            if rate is None:
                raise ValueError("WAV stream has no fmt chunk before its data")
            return pos + 8, rate
        pos += 8 + size + (size & 1)
    return None


@dataclass(frozen=True)
class Target:
    """Where and how requests are sent.

    Attributes:
        url: server base URL, e.g. http://127.0.0.1:8080.
        path: API path.
        audio_format: "pcm" or "wav".
        sample_rate: fallback rate (Hz) when neither a header nor the stream states it.
        api_key: sent as `Authorization: Bearer KEY` when set.
        timeout_s: seconds a request may take in all, from being sent to its last byte (a
            server that trickles bytes never trips the clients' per-read timeout); None: no
            limit beyond the clients' own.
    """

    url: str
    path: str
    audio_format: str
    sample_rate: int = 44100
    api_key: str | None = None
    timeout_s: float | None = None

    def headers(self) -> dict[str, str]:
        """Request headers."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


async def send_request(
    client: httpx.AsyncClient,
    target: Target,
    body: dict[str, Any],
    record: RequestRecord,
    clock_zero: float,
    t0: float | None = None,
) -> RequestRecord:
    """Send one request and fill `record` in; never raises for HTTP or network failures.

    Args:
        clock_zero: `time.perf_counter()` at the benchmark's start (for `record.start_s`).
        t0: when the request was due (`time.perf_counter()`); latencies count from it.
            None: now.
    """
    t0 = time.perf_counter() if t0 is None else t0
    record.start_s = t0 - clock_zero
    try:
        async with asyncio.timeout(target.timeout_s):
            await _stream(client, target, body, record, t0)
    except TimeoutError:  # the whole request's limit (asyncio.timeout)
        _fail(record, "timeout", TimeoutError(f"no complete answer in {target.timeout_s:g} s"))
    except httpx.TimeoutException as exc:
        _fail(record, "timeout", exc)
    except httpx.ConnectError as exc:
        _fail(record, "connect", exc)
    except (httpx.HTTPError, ValueError) as exc:
        _fail(record, "stream", exc)
    record.latency_s = time.perf_counter() - t0
    if record.ok and record.audio_s == 0:
        record.status, record.error = "empty", "200 without audio"
    return record


async def _stream(
    client: httpx.AsyncClient,
    target: Target,
    body: dict[str, Any],
    record: RequestRecord,
    t0: float,
) -> None:
    url = target.url.rstrip("/") + target.path

    async def trace(event: str, info: dict[str, Any]) -> None:  # httpcore's request events
        if event == "http11.send_request_body.complete":
            record.sent_s = time.perf_counter() - t0

    extensions = {"trace": trace}
    headers = target.headers()
    async with client.stream(
        "POST", url, json=body, headers=headers, extensions=extensions
    ) as response:
        record.status = str(response.status_code)
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            record.error = text[:200]
            return
        rate = int(response.headers.get("x-sample-rate", target.sample_rate))
        counter = AudioCounter(target.audio_format, rate)
        first: float | None = None
        stall = 0.0
        async for chunk in response.aiter_bytes():
            now = time.perf_counter()
            before = counter.seconds
            if counter.push(chunk) == 0:
                continue
            if first is None:
                first = now
                record.ttfa_s = now - t0
            stall = max(stall, (now - first) - before)
        record.audio_s = counter.seconds
        record.stall_s = None if first is None else stall


def _fail(record: RequestRecord, kind: str, exc: Exception) -> None:
    record.status = kind
    record.error = f"{type(exc).__name__}: {exc}"[:200]


KEEPALIVE_EXPIRY_S = 2.0
# Requests in flight per HTTP client at most (on average): httpcore's connection pool scans
# every connection, with a readability syscall each, whenever a request starts or ends, so one
# pool for hundreds of streams blocked the load generator's event loop for 1-2 s at a time and
# requests waited seconds to be sent (measured against a stand-in server on the CPU at 384
# streams: send time p90 8 s; docs/benchmarks.md §6.14).
REQUESTS_PER_CLIENT = 32


async def open_clients(
    stack: contextlib.AsyncExitStack, peak: int, timeout_s: float
) -> list[httpx.AsyncClient]:
    """HTTP clients for `peak` requests in flight, one per `REQUESTS_PER_CLIENT` (at least
    one), closed with `stack`; request i should go through client i mod their number."""
    # Idle connections expire before the server's keep-alive timeout (uvicorn: 5 s): reusing
    # one the server has just closed fails with a ReadError before the request is sent.
    limits = httpx.Limits(
        max_connections=None,  # the load pattern bounds the requests in flight
        max_keepalive_connections=min(REQUESTS_PER_CLIENT, max(1, peak)) + 4,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
    )
    timeout = httpx.Timeout(timeout_s, connect=10.0)
    count = max(1, math.ceil(peak / REQUESTS_PER_CLIENT))
    return [
        await stack.enter_async_context(httpx.AsyncClient(timeout=timeout, limits=limits))
        for _ in range(count)
    ]
