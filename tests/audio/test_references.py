"""Tests for fishserve.audio.references: any-format reference audio -> codes, errors, cache.

Each case encodes the same 1.5 s synthetic voice (140 Hz harmonics below 3.4 kHz, vibrato,
syllable-rate envelope, generated analytically at the file's own rate) and is compared with its
44.1 kHz mono 16-bit WAV twin. Measured on the tiny fixture decoder (random weights, so codes are
fragile: unrelated audio still agrees on ~41% of codes, the twin shifted by 25 ms on ~36%):

* lossless (wav/flac, 8-96 kHz, mono/stereo): waveform SNR 43-79 dB, codes agree 98.8-99.8%
  (resampling and 16-bit rounding); asserted SNR >= 35 dB, agreement >= 97%.
* lossy (mp3, ogg/opus, ogg/vorbis, m4a/aac): SNR 18-38 dB, agreement 67-87%; asserted
  SNR >= 12 dB and agreement >= 55% (the codec's own error, not a pipeline error: a wrong rate,
  channel mix or a delay would give ~0 dB).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf
import torch

from fishserve.audio.io import AudioDecodeError
from fishserve.audio.references import (
    ReferenceAudioError,
    ReferenceCache,
    ReferenceEncoder,
    decoder_fingerprint,
    encode_reference_audio,
    prepare_reference_audio,
)
from fishserve.models.firefly import FireflyGenerator, load_firefly

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_decoder"
SECONDS = 1.5


def load_tiny_decoder() -> FireflyGenerator:
    """A fresh tiny fixture decoder: 4 groups, 256 samples/frame, 44.1 kHz, CPU fp32."""
    return load_firefly(TINY / "generator.pth", TINY / "config.json")


@pytest.fixture(scope="module")
def tiny_decoder() -> FireflyGenerator:
    """The shared tiny decoder of this module (tests must not modify it)."""
    return load_tiny_decoder()


def voice(sample_rate: int, seconds: float = SECONDS) -> np.ndarray:
    """``(N,)`` float32 synthetic voice at ``sample_rate`` Hz, peak 0.5, energy below 3.4 kHz."""
    t = np.arange(round(sample_rate * seconds)) / sample_rate
    f0, depth, rate = 140.0, 8.0, 5.0  # Hz
    phase = 2 * np.pi * (f0 * t - depth / (2 * np.pi * rate) * np.cos(2 * np.pi * rate * t))
    x = sum(np.sin(k * phase + 0.3 * k) / k for k in range(1, 25))
    x = x * (0.55 + 0.45 * np.sin(2 * np.pi * 3.0 * t))
    return (0.5 * x / np.abs(x).max()).astype(np.float32)


def stereo(mono: np.ndarray) -> np.ndarray:
    """``(N, 2)`` whose channel mean is ``mono``."""
    return np.stack([1.2 * mono, 0.8 * mono], axis=1)


def soundfile_bytes(audio: np.ndarray, sample_rate: int, **kwargs) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, audio, sample_rate, **{"format": "WAV", **kwargs})
    return buffer.getvalue()


def m4a_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    """AAC in an MP4 (m4a) container, written with PyAV."""
    planar = np.ascontiguousarray(np.atleast_2d(audio.T), dtype=np.float32)  # (C, N)
    layout = "mono" if planar.shape[0] == 1 else "stereo"
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="ipod") as container:
        stream = container.add_stream("aac", rate=sample_rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(planar, format="fltp", layout=layout)
        frame.sample_rate, frame.pts = sample_rate, 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buffer.getvalue()


def wav(fmt: str = "WAV", subtype: str = "PCM_16") -> Callable[[np.ndarray, int], bytes]:
    return lambda audio, sr: soundfile_bytes(audio, sr, format=fmt, subtype=subtype)


LOSSLESS = [
    ("wav-8k-mono", 8000, 1, wav()),
    ("wav-16k-mono", 16000, 1, wav()),
    ("wav-22k-stereo-pcm24", 22050, 2, wav(subtype="PCM_24")),
    ("wav-48k-stereo-float", 48000, 2, wav(subtype="FLOAT")),
    ("flac-44k-stereo", 44100, 2, wav("FLAC")),
    ("flac-96k-mono", 96000, 1, wav("FLAC")),
]
LOSSY = [
    ("mp3-44k-mono", 44100, 1, wav("MP3", "MPEG_LAYER_III")),
    ("mp3-24k-stereo", 24000, 2, wav("MP3", "MPEG_LAYER_III")),
    ("opus-48k-mono", 48000, 1, wav("OGG", "OPUS")),
    ("opus-16k-stereo", 16000, 2, wav("OGG", "OPUS")),
    ("vorbis-44k-mono", 44100, 1, wav("OGG", "VORBIS")),
    ("m4a-44k-mono", 44100, 1, m4a_bytes),
    ("m4a-48k-stereo", 48000, 2, m4a_bytes),
]


@pytest.fixture(scope="module")
def twin(tiny_decoder: FireflyGenerator) -> tuple[np.ndarray, torch.Tensor]:
    """The 44.1 kHz mono 16-bit WAV twin: its prepared audio and codes."""
    data = soundfile_bytes(voice(44100), 44100, format="WAV", subtype="PCM_16")
    return prepare_reference_audio(data), encode_reference_audio(tiny_decoder, data)


def case_bytes(sample_rate: int, channels: int, write: Callable) -> bytes:
    mono = voice(sample_rate)
    return write(mono if channels == 1 else stereo(mono), sample_rate)


def compare(decoder, data: bytes, twin) -> tuple[float, float, torch.Tensor]:
    """(waveform SNR dB vs the twin over the twin's length, code agreement, codes)."""
    twin_audio, twin_codes = twin
    audio = prepare_reference_audio(data)
    codes = encode_reference_audio(decoder, data)
    n = len(twin_audio)
    noise = np.sum((audio[:n] - twin_audio) ** 2.0)
    snr = 10 * np.log10(np.sum(twin_audio**2.0) / noise)
    frames = min(codes.shape[1], twin_codes.shape[1])
    agreement = (codes[:, :frames] == twin_codes[:, :frames]).double().mean().item()
    return snr, agreement, codes


@pytest.mark.parametrize(
    ("name", "rate", "channels", "write"), LOSSLESS, ids=[c[0] for c in LOSSLESS]
)
def test_lossless_case_matches_its_twin(tiny_decoder, twin, name, rate, channels, write) -> None:
    snr, agreement, codes = compare(tiny_decoder, case_bytes(rate, channels, write), twin)
    assert codes.dtype == torch.int64 and codes.shape == twin[1].shape
    assert snr >= 35.0, f"{name}: SNR {snr:.1f} dB"
    assert agreement >= 0.97, f"{name}: {agreement:.3f} of codes agree"


@pytest.mark.parametrize(("name", "rate", "channels", "write"), LOSSY, ids=[c[0] for c in LOSSY])
def test_lossy_case_matches_its_twin(tiny_decoder, twin, name, rate, channels, write) -> None:
    snr, agreement, codes = compare(tiny_decoder, case_bytes(rate, channels, write), twin)
    # AAC pads to whole 1024-sample frames: up to 2 more code frames (256 samples each).
    assert 0 <= codes.shape[1] - twin[1].shape[1] <= 2
    assert snr >= 12.0, f"{name}: SNR {snr:.1f} dB"
    assert agreement >= 0.55, f"{name}: {agreement:.3f} of codes agree"


# ---------------------------------------------------------------------------- rejections
def silent_wav(peak: float) -> bytes:
    return soundfile_bytes(np.full(44100, peak, dtype=np.float32), 44100, subtype="FLOAT")


@pytest.mark.parametrize(
    ("data", "reason", "message"),
    [
        (b"", "empty", "empty"),
        (soundfile_bytes(np.zeros(0, dtype=np.float32), 44100), "empty", "no audio samples"),
        (b"definitely not audio " * 50, "undecodable", "cannot be decoded"),
        (soundfile_bytes(voice(44100)[:100], 44100), "too_short", "100 samples long at 44100 Hz"),
        (silent_wav(0.0), "silent", "silent"),
        (silent_wav(5e-4), "silent", "-66.0 dBFS"),
        (soundfile_bytes(np.full(44100, -1.0), 44100), "silent", "a constant 0.0 dBFS"),
        (soundfile_bytes(0.5 + voice(44100) * 1e-4, 44100), "silent", r"peak -\d"),
        (soundfile_bytes(voice(8000, 31.0), 8000), "too_long", "maximum of 30 s"),
        (soundfile_bytes(voice(44100) * 1e30, 44100, subtype="FLOAT"), "too_loud", "far louder"),
    ],
    ids=[
        "no-bytes",
        "no-samples",
        "garbage",
        "too-short",
        "zeros",
        "minus-66-dBFS",
        "full-scale-dc",
        "quiet-on-an-offset",
        "31-s",
        "1e30",
    ],
)
def test_bad_reference_is_rejected(
    tiny_decoder: FireflyGenerator, data: bytes, reason: str, message: str
) -> None:
    with pytest.raises(ReferenceAudioError, match=message) as info:
        encode_reference_audio(tiny_decoder, data)
    assert info.value.reason == reason
    assert isinstance(info.value, AudioDecodeError) and isinstance(info.value, ValueError)


def test_a_little_past_full_scale_is_fine_but_codes_off_the_codebook_are_refused(
    tiny_decoder: FireflyGenerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    hot = soundfile_bytes(voice(16000) / np.abs(voice(16000)).max() * 2.0, 16000, subtype="FLOAT")
    codes = encode_reference_audio(tiny_decoder, hot)  # +6 dBFS: clipped audio, still audio
    assert int(codes.max()) < tiny_decoder.config.codebook_size
    encode = tiny_decoder.encode
    monkeypatch.setattr(tiny_decoder, "encode", lambda *a: (encode(*a)[0] + 10**6, None))
    with pytest.raises(ReferenceAudioError, match="outside the codebook") as info:
        encode_reference_audio(tiny_decoder, hot)
    assert info.value.reason == "too_loud"


def test_limits_are_configurable(tiny_decoder: FireflyGenerator) -> None:
    data = soundfile_bytes(voice(16000), 16000)
    with pytest.raises(ReferenceAudioError, match="maximum of 1 s"):
        encode_reference_audio(tiny_decoder, data, max_seconds=1.0)
    quiet = soundfile_bytes(voice(16000) * 0.01, 16000, subtype="FLOAT")  # peak -46 dBFS
    assert encode_reference_audio(tiny_decoder, quiet).shape[0] == 4
    with pytest.raises(ReferenceAudioError, match="silent"):
        encode_reference_audio(tiny_decoder, quiet, silence_peak=0.01)
    offset = soundfile_bytes(voice(44100) * 0.01 + 0.5, 44100, subtype="FLOAT")
    assert encode_reference_audio(tiny_decoder, offset).shape[0] == 4  # sound on a DC offset


def test_encoder_holds_the_gpu_turn_for_its_device_work_only(tiny_decoder) -> None:
    """With the GPU shared in turns, the encode's device work runs inside `gpu_turn`; bad audio
    is rejected before the turn is taken (its checks are host work)."""
    from contextlib import contextmanager

    from fishserve.audio.references import ReferenceEncoder

    turns: list[str] = []

    @contextmanager
    def gpu_turn():
        turns.append("enter")
        yield
        turns.append("exit")

    encoder = ReferenceEncoder(tiny_decoder)
    encoder.gpu_turn = gpu_turn
    with pytest.raises(ReferenceAudioError):
        encoder.encode(b"not audio")
    assert turns == []
    codes = encoder.encode(soundfile_bytes(voice(16000), 16000))
    assert turns == ["enter", "exit"] and codes.shape[0] == 4


# ---------------------------------------------------------------------------- cache
def codes_of(size: int, value: int = 0) -> torch.Tensor:
    """``(1, size)`` int64 codes: ``8 * size`` bytes."""
    return torch.full((1, size), value, dtype=torch.int64)


def test_cache_is_lru_bounded_by_bytes() -> None:
    cache = ReferenceCache(max_bytes=800)  # 100 int64 codes
    cache.put("a", codes_of(40))
    cache.put("b", codes_of(40))
    assert cache.get("a") is not None  # "b" is now the least recently used
    cache.put("c", codes_of(40))
    assert "b" not in cache and "a" in cache and "c" in cache
    assert cache.nbytes == 640 and len(cache) == 2
    cache.put("huge", codes_of(101))  # larger than the whole cache: not stored
    assert "huge" not in cache and cache.nbytes == 640
    cache.put("a", codes_of(10))  # replacing an entry re-counts its bytes
    assert cache.nbytes == 400


def test_cache_returns_copies() -> None:
    cache = ReferenceCache()
    original = codes_of(5, value=7)
    cache.put("k", original)
    original.fill_(0)
    got = cache.get("k")
    got.fill_(1)
    assert torch.equal(cache.get("k"), codes_of(5, value=7))


def test_cache_is_thread_safe() -> None:
    cache = ReferenceCache(max_bytes=8 * 1000)

    def work(worker: int) -> None:
        for i in range(300):
            key = f"{(worker * 7 + i) % 40}"
            if cache.get(key) is None:
                cache.put(key, codes_of(10 + i % 50))

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stored = sum(cache.get(k).numel() * 8 for k in map(str, range(40)) if k in cache)
    assert cache.nbytes == stored <= cache.max_bytes


def test_encoder_caches_by_content_and_decoder(tiny_decoder: FireflyGenerator) -> None:
    data = case_bytes(22050, 2, wav())
    cache = ReferenceCache()
    encoder = ReferenceEncoder(tiny_decoder, cache)
    first = encoder.encode(data)
    assert (cache.hits, cache.misses, len(cache)) == (0, 1, 1)
    assert torch.equal(encoder.encode(bytearray(data)), first)  # same bytes: a hit
    assert (cache.hits, len(cache)) == (1, 1)
    assert torch.equal(first, encode_reference_audio(tiny_decoder, data))
    encoder.encode(case_bytes(16000, 1, wav()))  # other bytes: another entry
    assert len(cache) == 2

    other = load_tiny_decoder()
    assert decoder_fingerprint(other) == decoder_fingerprint(tiny_decoder)
    with torch.no_grad():
        other.backbone.norm.bias.add_(0.1)
    assert decoder_fingerprint(other) != decoder_fingerprint(tiny_decoder)
    other_encoder = ReferenceEncoder(other, cache)
    assert other_encoder.cache_key(data) != encoder.cache_key(data)
    assert ReferenceEncoder(tiny_decoder, cache, max_seconds=10).cache_key(data) != (
        encoder.cache_key(data)
    )


def test_encoder_does_not_cache_failures(tiny_decoder: FireflyGenerator) -> None:
    cache = ReferenceCache()
    encoder = ReferenceEncoder(tiny_decoder, cache, fingerprint="fixed")
    for _ in range(2):
        with pytest.raises(ReferenceAudioError):
            encoder.encode(silent_wav(0.0))
    assert len(cache) == 0 and cache.misses == 2
