"""Tests for fishserve.audio.encoders: each format round-trips through soundfile and PyAV.

Signal: 1.234 s (54,423 samples, an odd count) of low-passed noise plus a 220 Hz tone at 44.1 kHz.
Lossless formats must give back exactly ``float_to_int16`` of the input; lossy formats are
checked for rate, exact length (or the documented streamed-mp3 delay and padding) and a waveform
SNR above a floor (measured: mp3 22.1 dB whole and streamed, opus 17.1 dB; asserted 12 dB).
"""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
import soundfile as sf
import soxr
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fishserve.audio.encoders import (
    OPUS_SAMPLE_RATE,
    WAV_STREAM_SIZE,
    AudioFormat,
    WavStreamEncoder,
    encode_audio,
    float_to_int16,
    normalize_peak,
    response_headers,
    stream_encoder,
    wav_header,
)

SR = 44100
N = 54423
MP3_DELAY = 1105  # LAME encoder delay + decoder delay, samples (ffmpeg's initial_padding)
MP3_FRAME = 1152
LOSSY_MIN_SNR_DB = 12.0


def signal(n: int = N) -> np.ndarray:
    rng = np.random.default_rng(0)
    noise = np.convolve(rng.standard_normal(n), np.ones(8) / 8, mode="same")
    tone = np.sin(2 * np.pi * 220 * np.arange(n) / SR)
    return (0.25 * noise + 0.2 * tone).astype(np.float32)


def stream_bytes(fmt: AudioFormat, audio: np.ndarray, chunk: int = 3001) -> list[bytes]:
    """Bytes returned by each push (chunks of ``chunk`` samples) and, last, by finish."""
    encoder = stream_encoder(fmt, SR)
    parts = [encoder.push(audio[i : i + chunk]) for i in range(0, len(audio), chunk)]
    return [*parts, encoder.finish()]


def decode_pyav(data: bytes) -> tuple[int, np.ndarray]:
    """(rate, (n,) float32) decoded by PyAV/FFmpeg, int formats scaled by 1/32768."""
    with av.open(io.BytesIO(data)) as container:
        rate = container.streams.audio[0].sample_rate
        frames = [f.to_ndarray() for f in container.decode(audio=0)]
    samples = np.concatenate(frames, axis=1)[0]
    if samples.dtype == np.int16:
        return rate, samples.astype(np.float32) / 32768
    return rate, samples.astype(np.float32)


def decode_soundfile(data: bytes) -> tuple[int, np.ndarray]:
    audio, rate = sf.read(io.BytesIO(data), dtype="float32")
    return rate, audio


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference**2) / np.sum((test - reference) ** 2)))


# ---------------------------------------------------------------------------- samples
def test_float_to_int16_clips_instead_of_wrapping() -> None:
    x = np.array([1.5, -2.0, 0.5, 0.0, np.nan, 1.0, -1.0, 1e9, -np.inf], dtype=np.float32)
    assert float_to_int16(x).tolist() == [32767, -32767, 16384, 0, 0, 32767, -32767, 32767, -32767]


@settings(derandomize=True, max_examples=200)
@given(arrays(np.float32, st.integers(0, 64), elements=st.floats(-4, 4, width=32)))
def test_float_to_int16_is_rounded_and_saturating(x: np.ndarray) -> None:
    y = float_to_int16(x)
    assert y.dtype == np.int16
    expected = np.round(np.clip(x.astype(np.float64), -1, 1) * 32767)
    assert np.array_equal(y, expected.astype(np.int16))


def test_float_to_int16_rounds_half_steps_to_even_and_leaves_its_input() -> None:
    # every value k/2 / 32767 for k in [-65536, 65536): the exact halves are ties
    x = (np.arange(-65536, 65536) / 2 / 32767).astype(np.float32)
    x[::4099] = np.nan
    before = x.copy()
    expected = np.round(np.clip(np.nan_to_num(x.astype(np.float64)), -1, 1) * 32767)
    assert np.array_equal(float_to_int16(x), expected.astype(np.int16))
    assert np.array_equal(x, before, equal_nan=True)  # converted in a copy


def test_no_normalisation_is_applied() -> None:
    quiet = 0.01 * signal()
    for fmt in (AudioFormat.WAV, AudioFormat.FLAC):
        _, decoded = decode_soundfile(encode_audio(quiet, SR, fmt))
        assert abs(np.abs(decoded).max() - np.abs(quiet).max()) < 1e-4


def test_normalize_peak_helper() -> None:
    assert np.abs(normalize_peak(0.1 * signal())).max() == pytest.approx(0.891, rel=1e-6)
    assert not normalize_peak(np.zeros(4)).any()


# ---------------------------------------------------------------------------- lossless
@pytest.mark.parametrize("fmt", [AudioFormat.WAV, AudioFormat.FLAC])
@pytest.mark.parametrize("decode", [decode_soundfile, decode_pyav])
def test_lossless_whole_file_round_trips(fmt: AudioFormat, decode) -> None:
    audio = signal()
    rate, decoded = decode(encode_audio(audio, SR, fmt))
    assert rate == SR
    assert np.array_equal(np.round(decoded * 32768).astype(np.int16), float_to_int16(audio))


def test_pcm_is_raw_s16le_at_the_stated_rate() -> None:
    audio = signal()
    whole = encode_audio(audio, SR, AudioFormat.PCM)
    assert whole == b"".join(stream_bytes(AudioFormat.PCM, audio))
    raw, _ = sf.read(
        io.BytesIO(whole),
        samplerate=SR,
        channels=1,
        format="RAW",
        subtype="PCM_16",
        endian="LITTLE",
        dtype="int16",
    )
    assert np.array_equal(raw, float_to_int16(audio))
    headers = response_headers(AudioFormat.PCM, SR)
    assert headers["X-Sample-Rate"] == "44100" and headers["X-Sample-Format"] == "s16le"
    assert headers["Content-Type"] == "audio/pcm"


def test_wav_stream_header_and_bytes() -> None:
    audio = signal()
    parts = stream_bytes(AudioFormat.WAV, audio)
    streamed, whole = b"".join(parts), encode_audio(audio, SR, AudioFormat.WAV)
    assert parts[0][:44] == wav_header(None, SR)
    assert streamed[4:8] == streamed[40:44] == WAV_STREAM_SIZE.to_bytes(4, "little")
    # Equal except the two size fields; with the final header, byte-identical.
    assert len(streamed) == len(whole)
    assert streamed[:4] + streamed[8:40] + streamed[44:] == whole[:4] + whole[8:40] + whole[44:]
    encoder = WavStreamEncoder(SR)
    body = b"".join(encoder.push(audio[i : i + 1000]) for i in range(0, N, 1000))
    assert encoder.final_header() + body[44:] == whole
    for decode in (decode_soundfile, decode_pyav):
        rate, decoded = decode(streamed)
        assert rate == SR and len(decoded) == N


def test_empty_wav_stream_is_a_valid_file() -> None:
    encoder = stream_encoder(AudioFormat.WAV, SR)
    rate, decoded = decode_soundfile(encoder.finish())
    assert rate == SR and len(decoded) == 0
    assert encoder.finish() == b""
    with pytest.raises(RuntimeError):
        encoder.push(np.zeros(3, dtype=np.float32))


def test_flac_stream_decodes_to_the_same_samples() -> None:
    audio = signal()
    rate, decoded = decode_pyav(b"".join(stream_bytes(AudioFormat.FLAC, audio)))
    assert rate == SR
    assert np.array_equal(np.round(decoded * 32768).astype(np.int16), float_to_int16(audio))


# ---------------------------------------------------------------------------- lossy
@pytest.mark.parametrize("decode", [decode_soundfile, decode_pyav])
def test_mp3_whole_file_has_exact_length(decode) -> None:
    audio = signal()
    data = encode_audio(audio, SR, AudioFormat.MP3)
    rate, decoded = decode(data)
    assert rate == SR and len(decoded) == N
    assert snr_db(audio, decoded) >= LOSSY_MIN_SNR_DB


def test_mp3_stream_has_the_documented_delay() -> None:
    audio = signal()
    rate, decoded = decode_pyav(b"".join(stream_bytes(AudioFormat.MP3, audio)))
    assert rate == SR
    assert N + MP3_DELAY <= len(decoded) <= N + MP3_DELAY + MP3_FRAME
    assert snr_db(audio, decoded[MP3_DELAY : MP3_DELAY + N]) >= LOSSY_MIN_SNR_DB


@pytest.mark.parametrize("decode", [decode_soundfile, decode_pyav])
def test_opus_is_48k_ogg_with_exact_length(decode) -> None:
    audio = signal()
    whole = encode_audio(audio, SR, AudioFormat.OPUS)
    assert whole[:4] == b"OggS" and b"OpusHead" in whole[:64]
    assert whole == b"".join(stream_bytes(AudioFormat.OPUS, audio))
    rate, decoded = decode(whole)
    expected = soxr.resample(audio, SR, OPUS_SAMPLE_RATE, quality="HQ")
    assert rate == OPUS_SAMPLE_RATE and abs(len(decoded) - N * OPUS_SAMPLE_RATE / SR) < 1
    assert snr_db(expected, decoded[: len(expected)]) >= LOSSY_MIN_SNR_DB
    assert response_headers(AudioFormat.OPUS, SR)["X-Sample-Rate"] == "48000"


# ---------------------------------------------------------------------------- streaming
@pytest.mark.parametrize("fmt", list(AudioFormat))
def test_streams_emit_bytes_before_finish(fmt: AudioFormat) -> None:
    """With 0.25 s pushes every format hands out data early, not only at finish()."""
    parts = stream_bytes(fmt, signal(), chunk=SR // 4)
    assert len(parts[0]) > 0 or len(parts[1]) > 0
    assert sum(len(p) for p in parts[:-1]) > 0.5 * sum(len(p) for p in parts)


@pytest.mark.parametrize("fmt", [AudioFormat.MP3, AudioFormat.OPUS, AudioFormat.FLAC])
def test_output_is_deterministic(fmt: AudioFormat) -> None:
    audio = signal(4410)
    assert encode_audio(audio, SR, fmt) == encode_audio(audio, SR, fmt)


def test_format_names_and_errors() -> None:
    assert AudioFormat.parse(" MP3 ") is AudioFormat.MP3
    assert AudioFormat.OPUS.content_type == "audio/ogg; codecs=opus"
    with pytest.raises(ValueError, match="wav, pcm, mp3, opus, flac"):
        AudioFormat.parse("aac")
    with pytest.raises(ValueError, match="mono"):
        encode_audio(np.zeros((10, 2), dtype=np.float32), SR, AudioFormat.WAV)
    with pytest.raises(ValueError, match="cannot encode"):
        stream_encoder(AudioFormat.MP3, 12345)


def test_resampled_chunks_equal_a_one_shot_resample_and_close_their_source() -> None:
    import asyncio

    from fishserve.audio.encoders import resample_chunks

    tone = np.sin(np.arange(44100) * 2 * np.pi * 440 / 44100).astype(np.float32) * 0.5
    closed = []

    async def source():
        try:
            for start in range(0, tone.size, 5000):  # uneven chunks
                yield tone[start : start + 5000]
        finally:
            closed.append(True)

    async def run() -> np.ndarray:
        return np.concatenate([c async for c in resample_chunks(source(), 44100, 24000)])

    out = asyncio.run(run())
    expected = soxr.resample(tone, 44100, 24000, quality="HQ")
    assert abs(out.size - 24000) <= 1 and closed == [True]
    n = min(out.size, expected.size)
    np.testing.assert_allclose(out[:n], expected[:n], atol=2e-3)

    async def leave_early() -> list[bool]:  # a client gone after the first chunk
        resampled = resample_chunks(source(), 44100, 24000)
        await anext(resampled)
        await resampled.aclose()
        return list(closed)  # before asyncio.run's own clean-up of leftover generators

    closed.clear()
    assert asyncio.run(leave_early()) == [True]  # the source was closed with it
