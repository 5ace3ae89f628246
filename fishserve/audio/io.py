"""Audio file decoding (reference voices) and writing (by extension), output path checks.

``load_audio`` decodes the audio containers PyAV/FFmpeg reads (wav, flac, mp3, ogg/vorbis,
ogg/opus, m4a, webm, ...; `AUDIO_DEMUXERS`: no others are probed) plus raw float ``.npy``
arrays, averages channels to mono and resamples with soxr (high quality) to the model rate
(44.1 kHz for Fish Speech 1.5, spec §4.6 step 1).
"""

from __future__ import annotations

import io
import logging
import math
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import av
import numpy as np
import soundfile as sf
import soxr

from fishserve.audio.encoders import AudioFormat, encode_audio

__all__ = [
    "AUDIO_OUTPUT_SUFFIXES",
    "NPY_MAGIC",
    "AudioDecodeError",
    "AudioTooLongError",
    "EmptyAudioError",
    "check_output_path",
    "load_audio",
    "write_audio",
    "write_wav",
]

log = logging.getLogger(__name__)
NPY_MAGIC = b"\x93NUMPY"  # the .npy format's first 6 bytes (NumPy's format.rst)
# Limits on what a file may ask us to decode: a few KiB of constant FLAC can declare 8 channels
# at 655 kHz, i.e. over a GiB of float32 within a 30 s limit. 384 kHz is the highest rate of
# common studio formats (DXD); 8 channels is 7.1 surround.
MAX_SAMPLE_RATE = 384_000
MAX_CHANNELS = 8
# FFmpeg's demuxers for audio files, the only ones probed (`format_whitelist`, an option of
# libavformat's AVFormatContext): others read more than the bytes given, e.g. an SDP text
# opens UDP sockets and waits for RTP, an ffconcat list reads local files. No protocol may be
# opened either (`protocol_whitelist`): the input is the bytes, through PyAV's own I/O.
AUDIO_DEMUXERS = ("wav", "w64", "flac", "mp3", "ogg", "mov", "matroska", "aac", "aiff", "caf", "au")
SUPPORTED_CONTAINERS = "wav, w64, flac, mp3, ogg, m4a/mp4, webm/mkv, aac, aiff, caf, au"
_DEMUX_OPTIONS = {"format_whitelist": ",".join(AUDIO_DEMUXERS), "protocol_whitelist": "none"}
# Output file extension -> encoder format; `.npy` is the raw float32 waveform.
AUDIO_OUTPUT_SUFFIXES: dict[str, AudioFormat | None] = {
    ".wav": AudioFormat.WAV,
    ".flac": AudioFormat.FLAC,
    ".mp3": AudioFormat.MP3,
    ".ogg": AudioFormat.OPUS,
    ".opus": AudioFormat.OPUS,
    ".npy": None,
}


class AudioDecodeError(ValueError):
    """The input is not decodable audio, or decodes to no samples."""


class EmptyAudioError(AudioDecodeError):
    """The input is empty (0 bytes) or decodes to no samples."""


class AudioTooLongError(AudioDecodeError):
    """The input is longer than the ``max_seconds`` the caller allows."""


def load_audio(
    source: str | Path | bytes, target_sr: int = 44100, *, max_seconds: float | None = None
) -> np.ndarray:
    """Decode audio to a mono float32 waveform at ``target_sr``.

    Args:
        source: a file path, or the file's bytes. ``.npy`` content (detected by its magic
            bytes) must be a 1-D float array already at ``target_sr``; it is not resampled.
        target_sr: output sample rate in Hz.
        max_seconds: if given, reject audio longer than this many seconds (measured at the
            file's own rate). Decoding stops as soon as the limit is passed, so a small file that
            decodes to hours of audio costs no more than ``max_seconds`` of samples; channels
            are averaged as each frame is decoded, so memory is that of mono audio at a rate
            of at most `MAX_SAMPLE_RATE`.

    Returns:
        ``(N,)`` float32 array, channels averaged, nominally in [-1, 1].

    Raises:
        FileNotFoundError: ``source`` is a path that does not exist.
        EmptyAudioError: empty input or no samples (an :class:`AudioDecodeError`).
        AudioTooLongError: longer than ``max_seconds`` (an :class:`AudioDecodeError`).
        AudioDecodeError: undecodable data, no audio stream, non-finite samples, a sample rate
            above `MAX_SAMPLE_RATE` or more than `MAX_CHANNELS` channels.
        ValueError: ``target_sr`` or ``max_seconds`` is not positive.
    """
    if target_sr <= 0:
        raise ValueError(f"target_sr must be positive, got {target_sr}")
    if max_seconds is not None and not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive, got {max_seconds}")
    data, label = _read_source(source)
    if data.startswith(NPY_MAGIC):
        audio = _load_npy(data, label)
        _check_duration(audio.shape[-1], target_sr, max_seconds, label)
    else:
        audio, sample_rate = _decode_av(data, label, max_seconds)
        if sample_rate != target_sr:
            audio = soxr.resample(audio, sample_rate, target_sr, quality="HQ")
    if audio.size == 0:
        raise EmptyAudioError(f"{label}: contains no audio samples")
    if not np.isfinite(audio).all():
        raise AudioDecodeError(f"{label}: contains NaN or infinite samples")
    return np.ascontiguousarray(audio, dtype=np.float32)


def write_wav(path: str | Path, audio: np.ndarray, sample_rate: int) -> None:
    """Write float audio as 16-bit PCM WAV.

    Args:
        path: output file path.
        audio: ``(N,)`` mono or ``(N, C)`` float samples; values are clipped to [-1, 1] (no
            wrap-around) and NaN becomes 0.
        sample_rate: sample rate in Hz.

    Raises:
        ValueError: ``audio`` is not 1-D/2-D or ``sample_rate`` is not positive.
    """
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim not in (1, 2):
        raise ValueError(f"audio must be (N,) or (N, C), got shape {audio.shape}")
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    clipped = np.clip(np.nan_to_num(audio, nan=0.0), -1.0, 1.0)
    sf.write(str(path), clipped, int(sample_rate), subtype="PCM_16", format="WAV")


def write_audio(path: str | Path, audio: np.ndarray, sample_rate: int) -> None:
    """Write mono float audio in the format its extension names (`AUDIO_OUTPUT_SUFFIXES`):
    16-bit wav, flac, mp3, opus in ogg (`.ogg`/`.opus`, 48 kHz), or `.npy` float32 samples.

    Raises:
        ValueError: an unsupported extension, or bad audio (see `encode_audio`).
        OSError: the file cannot be written.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in AUDIO_OUTPUT_SUFFIXES:
        raise ValueError(_suffix_message(path, AUDIO_OUTPUT_SUFFIXES))
    fmt = AUDIO_OUTPUT_SUFFIXES[suffix]
    if fmt is None:
        np.save(path, np.asarray(audio, dtype=np.float32))
    else:
        path.write_bytes(encode_audio(audio, sample_rate, fmt))


def check_output_path(path: str | Path, option: str, suffixes: Iterable[str]) -> None:
    """Fail early, before any work, if `path` cannot be written as an output file.

    Args:
        path: the output file.
        option: its command-line option, for the message (e.g. `--output`).
        suffixes: the accepted extensions (lower case, with the dot).

    Raises:
        ValueError: the extension is not one of `suffixes` (the message lists them).
        FileNotFoundError: the folder does not exist.
        IsADirectoryError: `path` is a folder.
        PermissionError: the folder (or an existing file) is not writable.
    """
    path = Path(path)
    allowed = list(suffixes)
    if path.suffix.lower() not in allowed:
        raise ValueError(f"{option}: {_suffix_message(path, allowed)}")
    folder = path.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"{option} {path}: folder {folder} does not exist")
    if path.is_dir():
        raise IsADirectoryError(f"{option} {path} is a folder, not a file")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise PermissionError(f"{option} {path}: no permission to write there")
    try:  # what permission bits do not say (root, /proc, a read-only mount): try it
        if path.exists():
            with path.open("ab"):  # appends nothing: the file is left as it is
                pass
        else:
            with tempfile.TemporaryFile(dir=folder):
                pass
    except OSError as exc:
        raise PermissionError(f"{option} {path}: cannot write there ({exc.strerror})") from exc


def _suffix_message(path: Path, suffixes: Iterable[str]) -> str:
    """`PATH has extension '.x'; use one of ...`."""
    given = f"extension {path.suffix!r}" if path.suffix else "no extension"
    return f"{path} has {given}; use one of {', '.join(suffixes)}"


def _read_source(source: str | Path | bytes) -> tuple[bytes, str]:
    """Return the raw bytes and a label for error messages."""
    if isinstance(source, bytes | bytearray | memoryview):
        return bytes(source), "audio bytes"
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"audio file not found: {path}")
    return path.read_bytes(), str(path)


def _load_npy(data: bytes, label: str) -> np.ndarray:
    _check_npy_size(data, label)
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise AudioDecodeError(f"{label}: unreadable .npy data: {exc}") from exc
    array = np.squeeze(array)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.floating):
        raise AudioDecodeError(
            f"{label}: .npy audio must be a 1-D float array, got {array.dtype} {array.shape}"
        )
    return array.astype(np.float32)


def _check_npy_size(data: bytes, label: str) -> None:
    """Refuse `.npy` bytes whose header claims more data than they hold: `np.load` would
    first allocate what the header claims (hundreds of GiB for a forged shape)."""
    fp = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(fp)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else None
        shape, _, dtype = (read or np.lib.format.read_array_header_2_0)(fp)
    except (ValueError, OSError) as exc:
        raise AudioDecodeError(f"{label}: unreadable .npy data: {exc}") from exc
    claimed, held = math.prod(shape) * dtype.itemsize, len(data) - fp.tell()
    if claimed > held:
        raise AudioDecodeError(
            f"{label}: .npy header claims shape {shape} ({claimed} bytes of {dtype}) but the "
            f"data holds {held} bytes"
        )


def _check_duration(
    n_samples: int, sample_rate: int, max_seconds: float | None, label: str
) -> None:
    """Raise :class:`AudioTooLongError` if ``n_samples`` at ``sample_rate`` Hz exceed the limit."""
    if max_seconds is not None and n_samples > max_seconds * sample_rate:
        raise AudioTooLongError(
            f"{label}: audio is longer than the allowed {max_seconds:g} s "
            f"(more than {n_samples / sample_rate:.2f} s decoded)"
        )


def _decode_av(data: bytes, label: str, max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """Decode the first audio stream to ``(samples,)`` float32, channels averaged, and its rate
    in Hz.

    Stops with :class:`AudioTooLongError` once more than ``max_seconds`` have been decoded.
    A packet that fails to decode after some audio has been decoded (junk appended to a valid
    file) ends the audio there instead of refusing the whole file.
    """
    if not data:
        raise EmptyAudioError(f"{label}: empty input")
    try:
        with av.open(io.BytesIO(data), mode="r", options=_DEMUX_OPTIONS) as container:
            if not container.streams.audio:
                raise AudioDecodeError(f"{label}: no audio stream found")
            chunks, rate = _decode_frames(container, label, max_seconds)
    except AudioDecodeError:
        raise
    except av.error.ArgumentError as exc:  # probed as a container outside AUDIO_DEMUXERS
        raise AudioDecodeError(
            f"{label}: not an audio file in a supported container ({SUPPORTED_CONTAINERS})"
        ) from exc
    except (av.error.FFmpegError, ValueError, OSError, RuntimeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)  # FFmpeg's text, without errno/file
        raise AudioDecodeError(f"{label}: not a readable audio file ({why})") from exc
    if not chunks or rate <= 0:
        raise EmptyAudioError(f"{label}: contains no audio samples")
    return np.concatenate(chunks).astype(np.float32, copy=False), rate


def _decode_frames(
    container: av.container.InputContainer, label: str, max_seconds: float | None
) -> tuple[list[np.ndarray], int]:
    """Mono ``(n,)`` float32 pieces of the first audio stream and its rate; see `_decode_av`."""
    stream = container.streams.audio[0]
    codec = stream.codec_context
    if codec is None:  # PyAV has no decoder for the stream's codec (e.g. a WAV format tag)
        raise AudioDecodeError(f"{label}: its audio codec is not one FFmpeg can decode")
    _check_format(codec.sample_rate, codec.channels, label)
    # Packed float32, layout and rate kept: one plane whatever the channel count (PyAV 18's
    # `to_ndarray` of a planar frame of 8 or more channels crashes the process).
    resampler = av.AudioResampler(format="flt")
    chunks: list[np.ndarray] = []
    rate = decoded = channels = 0
    try:
        for frame in container.decode(stream):
            rate = rate or frame.sample_rate
            channels = channels or len(frame.layout.channels)
            _check_format(frame.sample_rate, len(frame.layout.channels), label)
            if len(frame.layout.channels) != channels:  # before the resampler refuses it
                raise AudioDecodeError(f"{label}: channel count changes inside the stream")
            decoded += frame.samples
            _check_duration(decoded, rate, max_seconds, label)
            chunks.extend(_mono(f) for f in resampler.resample(frame))
    except (av.error.FFmpegError, OSError) as exc:
        if not chunks:
            raise
        log.warning("%s: audio ends at a packet that cannot be decoded (%s)", label, exc)
    chunks.extend(_mono(f) for f in resampler.resample(None))
    return chunks, rate


def _check_format(rate: int, channels: int, label: str) -> None:
    """Refuse a stream of more than `MAX_SAMPLE_RATE` Hz or `MAX_CHANNELS` channels before its
    samples are decoded (0: not known yet)."""
    if rate > MAX_SAMPLE_RATE:
        raise AudioDecodeError(
            f"{label}: sample rate {rate} Hz is above the {MAX_SAMPLE_RATE} Hz that are read"
        )
    if channels > MAX_CHANNELS:
        raise AudioDecodeError(
            f"{label}: {channels} channels; at most {MAX_CHANNELS} are read (use mono audio)"
        )


def _mono(frame: av.AudioFrame) -> np.ndarray:
    """A packed (interleaved) frame's samples averaged over its channels, ``(n,)`` float32."""
    count = len(frame.layout.channels)
    return frame.to_ndarray().reshape(-1, count).mean(axis=1, dtype=np.float32)
