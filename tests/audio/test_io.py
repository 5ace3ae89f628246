"""Tests for fishserve.audio.io (decoding reference audio, writing WAV)."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from fishserve.audio.io import AudioDecodeError, load_audio, write_wav

SR_IN = 48000
TONE_HZ = 440.0


def _stereo_tone(seconds: float = 1.0) -> np.ndarray:
    """(N, 2) float32 at 48 kHz: the same 440 Hz sine at amplitude 0.5 (L) and 0.3 (R)."""
    t = np.arange(int(SR_IN * seconds)) / SR_IN
    tone = np.sin(2 * np.pi * TONE_HZ * t)
    return np.stack([0.5 * tone, 0.3 * tone], axis=1).astype(np.float32)


def _peak_hz(audio: np.ndarray, sample_rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(len(audio))))
    return float(np.argmax(spectrum)) * sample_rate / len(audio)


@pytest.mark.parametrize(
    ("name", "kwargs", "lossless"),
    [
        ("tone.wav", {"subtype": "PCM_16"}, True),
        ("tone.flac", {}, True),
        ("tone.ogg", {"format": "OGG", "subtype": "OPUS"}, False),
        ("tone.mp3", {"format": "MP3"}, False),
    ],
)
def test_load_resamples_downmixes_and_keeps_pitch(
    tmp_path: Path, name: str, kwargs: dict, lossless: bool
) -> None:
    stereo = _stereo_tone()
    path = tmp_path / name
    sf.write(path, stereo, SR_IN, **kwargs)
    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    expected = len(stereo) * 44100 / SR_IN
    assert abs(len(audio) - expected) <= (2 if lossless else 2048)
    assert abs(_peak_hz(audio, 44100) - TONE_HZ) < 2.0
    if lossless:
        assert abs(np.abs(audio[1000:-1000]).max() - 0.4) < 5e-3  # mean of 0.5 and 0.3
    assert np.array_equal(load_audio(path.read_bytes()), audio)


def test_target_rate_without_resampling(tmp_path: Path) -> None:
    mono = _stereo_tone()[:, 0]
    sf.write(tmp_path / "a.wav", mono, SR_IN, subtype="FLOAT")
    audio = load_audio(str(tmp_path / "a.wav"), target_sr=SR_IN)
    assert np.array_equal(audio, mono)


def test_npy_is_taken_as_is(tmp_path: Path) -> None:
    data = np.linspace(-0.5, 0.5, 1000, dtype=np.float32)
    np.save(tmp_path / "a.npy", data)
    assert np.array_equal(load_audio(tmp_path / "a.npy"), data)
    assert np.array_equal(load_audio((tmp_path / "a.npy").read_bytes()), data)
    np.save(tmp_path / "b.npy", np.zeros((2, 10), dtype=np.float32))
    with pytest.raises(AudioDecodeError):
        load_audio(tmp_path / "b.npy")


@pytest.mark.parametrize(("offset", "value"), [(20, 0x9999), (34, 0)])
def test_a_wav_of_a_codec_ffmpeg_lacks_is_a_decode_error(offset: int, value: int) -> None:
    """An unknown format tag or 0 bits per sample: PyAV gives no codec context (this was an
    AttributeError, a 500 on the server)."""
    buffer = io.BytesIO()
    sf.write(buffer, np.zeros(4410, dtype=np.float32), 44100, format="WAV", subtype="PCM_16")
    data = bytearray(buffer.getvalue())
    data[offset : offset + 2] = value.to_bytes(2, "little")
    with pytest.raises(AudioDecodeError, match="audio codec is not one FFmpeg can decode"):
        load_audio(bytes(data))


def load_in_child(path: Path) -> subprocess.CompletedProcess:
    """`load_audio(path)` in a child process, printing the length, min and max (PyAV's planar
    frames of 8 or more channels crashed the process: a 7.1 reference killed the server)."""
    code = textwrap.dedent(f"""
        from fishserve.audio.io import load_audio
        audio = load_audio({str(path)!r})
        print(len(audio), float(audio.min()), float(audio.max()))
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("channels", [2, 8])
def test_many_channels_are_averaged(tmp_path: Path, channels: int) -> None:
    """Channel c holds c / 16: the mono result is their mean."""
    path = tmp_path / "many.wav"
    levels = np.arange(channels, dtype=np.float32) / 16
    sf.write(path, np.tile(levels, (4410, 1)), 44100, subtype="FLOAT")
    run = load_in_child(path)
    assert run.returncode == 0, run.stderr[-2000:]
    n, low, high = run.stdout.split()
    assert int(n) == 4410
    assert float(low) == pytest.approx(levels.mean()) == pytest.approx(float(high))


def test_more_than_eight_channels_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "many.wav"
    sf.write(path, np.full((4410, 12), 0.1, dtype=np.float32), 44100, subtype="FLOAT")
    run = load_in_child(path)
    assert run.returncode == 1 and "AudioDecodeError" in run.stderr
    assert "12 channels; at most 8 are read" in run.stderr


def test_sample_rates_above_384_khz_are_refused(tmp_path: Path) -> None:
    """A few KiB of constant FLAC at 655 kHz in 8 channels decoded to over a GiB of float32
    within the 30 s limit; the rate is refused from the stream's header."""
    tone = 0.1 * np.sin(np.arange(38_400) / 10)
    sf.write(tmp_path / "fast.flac", tone, 400_000)
    with pytest.raises(AudioDecodeError, match="sample rate 400000 Hz is above the 384000 Hz that"):
        load_audio(tmp_path / "fast.flac")
    sf.write(tmp_path / "top.flac", tone, 384_000)
    assert len(load_audio(tmp_path / "top.flac")) == 4410  # 0.1 s at 44.1 kHz


def test_npy_whose_header_claims_more_than_it_holds_is_refused() -> None:
    """A forged shape would make `np.load` allocate it all (373 GiB here) before reading."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000,), }"
    header = header.ljust(118) + "\n"
    data = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(16)
    with pytest.raises(AudioDecodeError, match="header claims shape"):
        load_audio(data)


@pytest.mark.parametrize("data", [b"", b"not audio at all " * 64, b"RIFF\x00\x00\x00\x00WAVE"])
def test_garbage_raises(data: bytes) -> None:
    with pytest.raises(AudioDecodeError):
        load_audio(data)


def test_empty_audio_raises(tmp_path: Path) -> None:
    sf.write(tmp_path / "empty.wav", np.zeros((0, 2), dtype=np.float32), SR_IN)
    with pytest.raises(AudioDecodeError, match="no audio samples"):
        load_audio(tmp_path / "empty.wav")
    np.save(tmp_path / "empty.npy", np.zeros(0, dtype=np.float32))
    with pytest.raises(AudioDecodeError):
        load_audio(tmp_path / "empty.npy")


def test_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_audio(tmp_path / "missing.wav")
    assert issubclass(AudioDecodeError, ValueError)


def test_write_wav_clips_instead_of_wrapping(tmp_path: Path) -> None:
    path = tmp_path / "out.wav"
    write_wav(path, np.array([1.5, -2.0, 0.5, 0.0, np.nan], dtype=np.float32), 44100)
    info = sf.info(path)
    assert (info.samplerate, info.channels, info.subtype) == (44100, 1, "PCM_16")
    data, _ = sf.read(path, dtype="int16")
    assert data.tolist() == [32767, -32768, 16384, 0, 0]


def test_write_then_load_roundtrip(tmp_path: Path) -> None:
    tone = 0.25 * np.sin(np.linspace(0, 200 * np.pi, 44100)).astype(np.float32)
    write_wav(tmp_path / "rt.wav", tone, 44100)
    assert np.abs(load_audio(tmp_path / "rt.wav") - tone).max() < 1e-4


def _adts_aac(channels: int) -> bytes:
    """Half a second of a tone as ADTS AAC (PyAV's own encoder), mono or stereo."""
    import io

    import av

    buffer = io.BytesIO()
    layout = "mono" if channels == 1 else "stereo"
    with av.open(buffer, "w", format="adts") as container:
        stream = container.add_stream("aac", rate=44100, layout=layout)
        tone = (0.3 * np.sin(np.arange(22050) / 10)).astype(np.float32)
        frame = av.AudioFrame.from_ndarray(
            np.repeat(tone[None], channels, 0), format="fltp", layout=layout
        )
        frame.sample_rate, frame.pts = 44100, 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buffer.getvalue()


def test_a_channel_count_that_changes_inside_the_stream_is_named() -> None:
    """Mono then stereo AAC: refused with its reason (it was the resampler's "Frame does
    not match AudioResampler setup")."""
    assert len(load_audio(_adts_aac(2))) > 0
    with pytest.raises(AudioDecodeError, match="channel count changes inside the stream"):
        load_audio(_adts_aac(1) + _adts_aac(2))


def _encoded(container: str, codec: str, rate: int) -> bytes:
    """0.2 s of a tone in `container` with `codec`, by PyAV's own encoders."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        tone = (0.3 * np.sin(np.arange(rate // 5) / 10)).astype(np.float32)
        frame = av.AudioFrame.from_ndarray(tone[None], format="flt", layout="mono")
        frame.sample_rate, frame.pts = rate, 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("container", "codec", "rate"),
    [
        ("ipod", "aac", 44100),  # .m4a
        ("mp4", "aac", 44100),
        ("webm", "libopus", 48000),
        ("matroska", "libopus", 48000),
        ("adts", "aac", 44100),
        ("aiff", "pcm_s16be", 44100),
        ("caf", "pcm_s16le", 44100),
        ("au", "pcm_s16be", 44100),
        ("w64", "pcm_s16le", 44100),
    ],
)
def test_every_supported_container_decodes(container: str, codec: str, rate: int) -> None:
    """The containers `AUDIO_DEMUXERS` lets FFmpeg probe (besides wav, flac, ogg and mp3
    above) still decode: ~0.2 s of audio at 44.1 kHz."""
    audio = load_audio(_encoded(container, codec, rate))
    assert 0.15 < len(audio) / 44100 < 0.3 and np.abs(audio).max() > 0.1


SDP = (
    b"v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=x\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    b"m=audio 18490 RTP/AVP 0\r\n"
)


@pytest.mark.parametrize("kind", ["sdp", "ffconcat"])
def test_containers_that_open_other_inputs_are_refused(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SDP text made FFmpeg open UDP sockets and wait ~20 s for RTP; an ffconcat list read
    a local file as the voice. Both are refused at once, as not a supported container."""
    monkeypatch.chdir(tmp_path)
    write_wav(tmp_path / "local.wav", np.full(4410, 0.5, dtype=np.float32), 44100)
    data = SDP if kind == "sdp" else b"ffconcat version 1.0\nfile local.wav\n"
    with pytest.raises(AudioDecodeError, match="not an audio file in a supported container"):
        load_audio(data)
