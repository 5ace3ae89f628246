"""One timed request against mocked servers: audio accounting, TTFA, failures by status."""

from __future__ import annotations

import asyncio
import struct

import httpx

from fishserve.bench.client import (
    AudioCounter,
    RequestRecord,
    Target,
    parse_wav_header,
    send_request,
)

RATE = 44100


def run(handler, audio_format: str = "pcm") -> RequestRecord:
    async def main() -> RequestRecord:
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(transport=transport) as client:
            record = RequestRecord(0, 1, "x", 0.0, "pending")
            target = Target("http://127.0.0.1:1", "/v1/tts", audio_format)
            return await send_request(client, target, {"text": "hi"}, record, 0.0)

    return asyncio.run(main())


def streamed(chunks: list[bytes], headers: dict[str, str] | None = None):
    async def body():
        for chunk in chunks:
            yield chunk

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=headers or {"X-Sample-Rate": str(RATE)}, content=body())

    return handler


def wav_header(rate: int, extra_chunk: bool = False) -> bytes:
    fmt = struct.pack("<4sIHHIIHH", b"fmt ", 16, 1, 1, rate, rate * 2, 2, 16)
    extra = struct.pack("<4sI", b"LIST", 4) + b"INFO" if extra_chunk else b""
    return b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + fmt + extra + b"data" + b"\xff" * 4


def test_pcm_stream_counts_audio_exactly_and_times_first_byte():
    record = run(streamed([b"\x00" * 4410, b"\x00" * 4410 * 3]))
    assert record.ok and record.status == "200"
    assert record.audio_s == 4410 * 4 / 2 / RATE  # 0.2 s
    assert 0 < record.ttfa_s <= record.latency_s
    assert record.rtf == record.latency_s / record.audio_s
    assert record.stall_s is not None and record.stall_s >= 0


def test_wav_stream_skips_the_header_and_reads_its_rate():
    header = wav_header(22050, extra_chunk=True)
    record = run(streamed([header[:10], header[10:] + b"\x00" * 100, b"\x00" * 100], {}), "wav")
    assert record.ok
    assert record.audio_s == 200 / 2 / 22050
    assert parse_wav_header(header) == (len(header), 22050)


def test_audio_counter_waits_for_the_wav_data_chunk():
    counter = AudioCounter("wav", RATE)
    header = wav_header(RATE)
    assert counter.push(header[:20]) == 0
    assert counter.push(header[20:] + b"\x00\x00") == 2
    assert counter.seconds == 1 / RATE


def test_busy_server_is_an_error_by_status_not_a_crash():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": "1"}, json={"message": "busy"})

    record = run(handler)
    assert not record.ok and record.status == "429"
    assert "busy" in record.error and record.rtf is None and record.audio_s == 0


def test_connection_failure_and_broken_stream_are_recorded():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    assert run(refuse).status == "connect"

    async def broken():
        yield b"\x00" * 100
        raise httpx.RemoteProtocolError("peer closed connection")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=broken())

    record = run(handler)
    assert record.status == "stream" and "peer closed" in record.error


def test_ok_without_audio_is_an_error():
    assert run(streamed([])).status == "empty"


def test_a_trickling_server_is_cut_off_at_the_request_timeout():
    async def body():
        for _ in range(100):  # 10 s of audio bytes, 0.1 s apart: every read is quick
            yield b"\x00" * 64
            await asyncio.sleep(0.1)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"X-Sample-Rate": str(RATE)}, content=body())

    async def main() -> RequestRecord:
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(transport=transport) as client:
            record = RequestRecord(0, 1, "x", 0.0, "pending")
            target = Target("http://127.0.0.1:1", "/v1/tts", "pcm", timeout_s=0.5)
            return await send_request(client, target, {"text": "hi"}, record, 0.0)

    record = asyncio.run(main())
    assert record.status == "timeout" and not record.ok
    assert "0.5 s" in record.error
    assert record.latency_s < 5.0  # cut off, not read to the end (10 s)
