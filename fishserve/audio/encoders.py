"""Output encoders: float audio -> wav, pcm, mp3, opus or flac bytes, whole or streamed (issue 4.4).

Sample conversion (issue 4.5): float samples are clipped to [-1, 1] and mapped to int16 by
``round(x * 32767)`` (:func:`float_to_int16`), so out-of-range values saturate instead of wrapping
around; NaN becomes 0. **No loudness normalisation is applied**: the decoder's tanh output (-1, 1)
is written as is. :func:`normalize_peak` exists for callers that want it; nothing calls it.

Formats (all mono; rates in Hz):

* ``wav``: 16-bit PCM WAV; whole files are written by libsndfile (soundfile), 44-byte header.
  Streaming sends the same 44-byte header first with the RIFF and ``data`` chunk sizes set to
  ``0xFFFFFFFF`` (the "unknown length" value FFmpeg's own WAV muxer writes to unseekable
  outputs; FFmpeg and libsndfile read such a file to its end), then raw s16le samples. Once a
  stream ends, its bytes equal :func:`encode_audio`'s except those two 4-byte size fields (bytes
  4-7 and 40-43); :meth:`WavStreamEncoder.final_header` gives the exact header for sinks that
  can seek back.
* ``pcm``: headerless s16le at the input rate (44100 for the model); the rate is stated by
  :func:`response_headers` (``X-Sample-Rate``). Streamed bytes equal whole-file bytes.
* ``mp3``: MPEG-1 Layer III by LAME through PyAV, CBR ``DEFAULT_BIT_RATES`` (128 kb/s). A whole
  file carries a Xing/LAME header, so FFmpeg/libsndfile trim the encoder delay and padding and
  decode exactly the input length. A stream cannot carry it (it is written at the end): decoders
  then see the encoder's 1105-sample priming delay (25 ms) and up to one frame (1152 samples) of
  end padding.
* ``opus``: Opus (libopus, 64 kb/s) in an Ogg container through PyAV. Opus only runs at 48 kHz,
  so the audio is resampled 44.1 -> 48 kHz with soxr (HQ) and the output rate is 48000; Ogg
  pre-skip and the final granule position make decoders return exactly
  ``round(n * 48000 / 44100)`` samples. Streams flush an Ogg page at least every 100 ms of audio;
  a finished stream has exactly the bytes of the whole-file encoding.
* ``flac``: 16-bit FLAC through PyAV. A whole file has a complete STREAMINFO (total samples,
  MD5); a stream's STREAMINFO says "total samples unknown" (0) and has no MD5, as the FLAC
  format allows for streams (FFmpeg decodes it; libsndfile needs the total and cannot).

Streaming encoders follow one protocol: ``push(chunk) -> bytes`` returns whatever the encoder can
emit so far (the container header comes with the first push), ``finish() -> bytes`` flushes the
rest; the concatenation is a valid file. Call ``finish()`` (and drop its bytes) to release the
encoder of an abandoned stream. mp3/opus/flac bytes are deterministic (FFmpeg's
``bitexact`` flag). Zero samples give a header-only file, which FFmpeg rejects for mp3 and opus
(no audio packets); callers should not send empty audio in those formats.
"""

from __future__ import annotations

import io
import struct
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import StrEnum
from typing import BinaryIO

import av
import numpy as np
import soundfile as sf
import soxr

__all__ = [
    "DEFAULT_BIT_RATES",
    "OPUS_SAMPLE_RATE",
    "WAV_STREAM_SIZE",
    "AudioFormat",
    "PcmStreamEncoder",
    "PyAVStreamEncoder",
    "StreamEncoder",
    "WavStreamEncoder",
    "encode_audio",
    "float_to_int16",
    "normalize_peak",
    "output_sample_rate",
    "response_headers",
    "stream_encoder",
    "wav_header",
]

OPUS_SAMPLE_RATE = 48000  # the only full-band rate libopus encodes
WAV_STREAM_SIZE = 0xFFFFFFFF  # RIFF/data size meaning "unknown length, read to EOF"
_INT16_SCALE = 32767.0
_WAV_HEADER_BYTES = 44


class AudioFormat(StrEnum):
    """Output formats; the value is the name clients use (``response_format``)."""

    WAV = "wav"
    PCM = "pcm"
    MP3 = "mp3"
    OPUS = "opus"
    FLAC = "flac"

    @property
    def content_type(self) -> str:
        """MIME type of the encoded bytes."""
        return _CONTENT_TYPES[self]

    @classmethod
    def parse(cls, name: str) -> AudioFormat:
        """Format from its (case-insensitive) name.

        Raises:
            ValueError: unknown name; the message lists the known ones.
        """
        try:
            return cls(name.strip().lower())
        except ValueError:
            known = ", ".join(f.value for f in cls)
            raise ValueError(f"unknown audio format {name!r}; choose one of: {known}") from None


_CONTENT_TYPES = {
    AudioFormat.WAV: "audio/wav",
    AudioFormat.PCM: "audio/pcm",
    AudioFormat.MP3: "audio/mpeg",
    AudioFormat.OPUS: "audio/ogg; codecs=opus",
    AudioFormat.FLAC: "audio/flac",
}
DEFAULT_BIT_RATES = {AudioFormat.MP3: 128_000, AudioFormat.OPUS: 64_000}  # bits per second


# ---------------------------------------------------------------------------- samples
def float_to_int16(samples: np.ndarray) -> np.ndarray:
    """``(N,)`` float -> ``(N,)`` int16 = ``round(clip(x, -1, 1) * 32767)``; NaN -> 0.

    Saturates instead of wrapping around; the result lies in [-32767, 32767]. The product is
    taken in float64 (exact for float32 input) and rounded half to even. Every pass after the
    first copy works in place: the HTTP process converts every chunk it streams, and this is
    7-12x faster than ``nan_to_num``, ``clip`` and ``round`` with temporaries (20-80k samples,
    docs/benchmarks.md §6.15).
    """
    x = np.array(samples, dtype=np.float64)  # a copy, so the passes below may work in place
    np.clip(x, -1.0, 1.0, out=x)  # NaN stays NaN, +-inf saturate
    x *= _INT16_SCALE
    np.rint(x, out=x)
    nan = np.isnan(x)
    if nan.any():
        x[nan] = 0.0
    return x.astype(np.int16)


def normalize_peak(samples: np.ndarray, peak: float = 0.891) -> np.ndarray:
    """Scale ``samples`` so that max ``|x|`` equals ``peak`` (default 0.891 = -1 dBFS).

    Not applied by any encoder (see module docstring). Silent input is returned unchanged.

    Returns:
        float32 array of the input's shape.
    """
    x = np.asarray(samples, dtype=np.float32)
    current = float(np.abs(x).max()) if x.size else 0.0
    return x if current == 0.0 else (x * (peak / current)).astype(np.float32)


def output_sample_rate(fmt: AudioFormat, sample_rate: int) -> int:
    """Rate in Hz of the encoded audio: 48000 for opus, else ``sample_rate``."""
    return OPUS_SAMPLE_RATE if fmt is AudioFormat.OPUS else sample_rate


def response_headers(fmt: AudioFormat, sample_rate: int) -> dict[str, str]:
    """HTTP headers describing the encoded audio: content type, rate and, for pcm, the layout."""
    headers = {
        "Content-Type": fmt.content_type,
        "X-Sample-Rate": str(output_sample_rate(fmt, sample_rate)),
        "X-Channels": "1",
    }
    if fmt is AudioFormat.PCM:
        headers["X-Sample-Format"] = "s16le"
    return headers


# ---------------------------------------------------------------------------- whole files
def encode_audio(
    samples: np.ndarray, sample_rate: int, fmt: AudioFormat, *, bit_rate: int | None = None
) -> bytes:
    """Encode a whole clip.

    Args:
        samples: ``(N,)`` float mono audio, nominally in [-1, 1].
        sample_rate: rate of ``samples`` in Hz (44100 for the model; mp3 needs a MPEG rate).
        fmt: output format (see module docstring).
        bit_rate: bits per second for mp3/opus (default :data:`DEFAULT_BIT_RATES`).

    Returns:
        The complete file's bytes.

    Raises:
        ValueError: ``samples`` is not 1-D or ``sample_rate`` is not positive.
    """
    samples = _check_mono(samples)
    _check_rate(sample_rate)
    if fmt is AudioFormat.PCM:
        return float_to_int16(samples).tobytes()
    if fmt is AudioFormat.WAV:
        return _libsndfile_wav(float_to_int16(samples), sample_rate)
    buffer = io.BytesIO()  # seekable: the muxer finalises headers (Xing, STREAMINFO)
    encoder = PyAVStreamEncoder(fmt, sample_rate, bit_rate=bit_rate, sink=buffer)
    encoder.push(samples)
    encoder.finish()
    return buffer.getvalue()


def wav_header(num_samples: int | None, sample_rate: int) -> bytes:
    """The 44-byte 16-bit mono WAV header libsndfile writes, for ``num_samples`` samples.

    ``None`` gives the streaming header: RIFF and data sizes :data:`WAV_STREAM_SIZE`. Sizes that
    do not fit 32 bits are also written as :data:`WAV_STREAM_SIZE`.
    """
    header = bytearray(_libsndfile_wav(np.zeros(0, dtype=np.int16), sample_rate))
    if len(header) != _WAV_HEADER_BYTES or header[36:40] != b"data":
        raise RuntimeError("unexpected WAV header layout from libsndfile")
    data_bytes = WAV_STREAM_SIZE if num_samples is None else 2 * num_samples
    riff_bytes = min(WAV_STREAM_SIZE, data_bytes + _WAV_HEADER_BYTES - 8)
    struct.pack_into("<I", header, 4, riff_bytes)
    struct.pack_into("<I", header, 40, min(WAV_STREAM_SIZE, data_bytes))
    return bytes(header)


def _libsndfile_wav(pcm: np.ndarray, sample_rate: int) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, pcm, sample_rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


# ---------------------------------------------------------------------------- streaming
class StreamEncoder(ABC):
    """Incremental encoder of one mono stream (see module docstring for the protocol)."""

    def __init__(self, fmt: AudioFormat, sample_rate: int) -> None:
        _check_rate(sample_rate)
        self.format = fmt
        self.input_sample_rate = sample_rate
        self.sample_rate = output_sample_rate(fmt, sample_rate)  # rate of the encoded audio
        self.samples_in = 0
        self._finished = False

    @property
    def content_type(self) -> str:
        """MIME type of the stream."""
        return self.format.content_type

    def push(self, chunk: np.ndarray) -> bytes:
        """Encode ``(n,)`` float samples; returns the bytes ready so far (may be empty).

        Raises:
            ValueError: ``chunk`` is not 1-D.
            RuntimeError: called after :meth:`finish`.
        """
        if self._finished:
            raise RuntimeError("push() after finish()")
        chunk = _check_mono(chunk)
        self.samples_in += chunk.size
        return self._push(chunk)

    def finish(self) -> bytes:
        """Flush the encoder and container; returns the last bytes. Later calls return b""."""
        if self._finished:
            return b""
        self._finished = True
        return self._finish()

    @abstractmethod
    def _push(self, chunk: np.ndarray) -> bytes: ...

    @abstractmethod
    def _finish(self) -> bytes: ...


class PcmStreamEncoder(StreamEncoder):
    """Raw s16le; every push returns its samples' bytes."""

    def __init__(self, sample_rate: int) -> None:
        super().__init__(AudioFormat.PCM, sample_rate)

    def _push(self, chunk: np.ndarray) -> bytes:
        return float_to_int16(chunk).tobytes()

    def _finish(self) -> bytes:
        return b""


class WavStreamEncoder(StreamEncoder):
    """WAV with the streaming header (sizes ``0xFFFFFFFF``), then raw s16le samples."""

    def __init__(self, sample_rate: int) -> None:
        super().__init__(AudioFormat.WAV, sample_rate)
        self._header_sent = False

    def final_header(self) -> bytes:
        """The header with the true sizes of the samples pushed so far (for seekable sinks)."""
        return wav_header(self.samples_in, self.input_sample_rate)

    def _header(self) -> bytes:
        if self._header_sent:
            return b""
        self._header_sent = True
        return wav_header(None, self.input_sample_rate)

    def _push(self, chunk: np.ndarray) -> bytes:
        return self._header() + float_to_int16(chunk).tobytes()

    def _finish(self) -> bytes:
        return self._header()  # an empty stream is still a valid (empty) WAV


@dataclass(frozen=True)
class _AvSpec:
    container: str
    codec: str
    options: dict[str, str]


_AV_SPECS = {
    AudioFormat.MP3: _AvSpec("mp3", "libmp3lame", {}),
    AudioFormat.OPUS: _AvSpec("ogg", "libopus", {"page_duration": "100000"}),  # microseconds
    AudioFormat.FLAC: _AvSpec("flac", "flac", {}),
}


class _Sink:
    """Write-only, unseekable byte sink that PyAV writes into and we drain after each push."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def write(self, data: bytes) -> int:
        self._buffer += data
        return len(data)

    def drain(self) -> bytes:
        data = bytes(self._buffer)
        self._buffer.clear()
        return data


class PyAVStreamEncoder(StreamEncoder):
    """mp3 / opus-in-ogg / flac through PyAV (FFmpeg's LAME, libopus and FLAC encoders).

    Samples are clipped, resampled with a streaming soxr resampler when the codec needs another
    rate (opus: 48 kHz), converted to int16 and fed to the encoder, which frames them itself.

    Args:
        fmt: ``MP3``, ``OPUS`` or ``FLAC``.
        sample_rate: input rate in Hz.
        bit_rate: bits per second for mp3/opus (default :data:`DEFAULT_BIT_RATES`).
        sink: a seekable binary file (e.g. ``io.BytesIO``) to write a finalised file into; the
            default is an internal unseekable sink whose bytes ``push``/``finish`` return. With
            an external sink ``push``/``finish`` return ``b""``.

    Raises:
        ValueError: a format PyAV does not handle here, or a rate the codec rejects.
    """

    def __init__(
        self,
        fmt: AudioFormat,
        sample_rate: int,
        *,
        bit_rate: int | None = None,
        sink: BinaryIO | None = None,
    ) -> None:
        if fmt not in _AV_SPECS:
            raise ValueError(f"{fmt.value} is not encoded through PyAV")
        super().__init__(fmt, sample_rate)
        spec = _AV_SPECS[fmt]
        rates = av.Codec(spec.codec, "w").audio_rates  # None: any rate
        if rates and self.sample_rate not in rates:
            raise ValueError(f"{fmt.value} cannot encode {self.sample_rate} Hz; use one of {rates}")
        self._sink = _Sink() if sink is None else None
        # flush_packets: hand bytes over after every packet; bitexact: deterministic bytes (Ogg
        # serial number 0 instead of random, no FFmpeg version strings).
        options = {**spec.options, "flush_packets": "1", "fflags": "+bitexact"}
        target = sink if sink is not None else self._sink
        self._container = av.open(target, "w", format=spec.container, options=options)
        self._stream = self._container.add_stream(spec.codec, rate=self.sample_rate, layout="mono")
        rate = bit_rate or DEFAULT_BIT_RATES.get(fmt)
        if rate:
            self._stream.bit_rate = rate
        self._resampler = (
            soxr.ResampleStream(sample_rate, self.sample_rate, 1, dtype="float32", quality="HQ")
            if sample_rate != self.sample_rate
            else None
        )
        self._pts = 0
        self._container.start_encoding()  # write the container header now, even for no audio

    def _push(self, chunk: np.ndarray) -> bytes:
        self._encode(self._resample(chunk, last=False))
        return self._drain()

    def _finish(self) -> bytes:
        self._encode(self._resample(np.zeros(0, dtype=np.float32), last=True))
        self._mux(self._stream.encode(None))
        self._container.close()
        return self._drain()

    def _resample(self, chunk: np.ndarray, *, last: bool) -> np.ndarray:
        chunk = np.clip(np.nan_to_num(chunk, nan=0.0), -1.0, 1.0)
        if self._resampler is None:
            return chunk
        return self._resampler.resample_chunk(chunk, last=last)

    def _encode(self, samples: np.ndarray) -> None:
        if samples.size == 0:
            return
        frame = av.AudioFrame.from_ndarray(
            float_to_int16(samples)[None], format="s16", layout="mono"
        )
        frame.sample_rate = self.sample_rate
        frame.pts = self._pts
        self._pts += samples.size
        self._mux(self._stream.encode(frame))

    def _mux(self, packets: list) -> None:
        for packet in packets:
            self._container.mux(packet)

    def _drain(self) -> bytes:
        return self._sink.drain() if self._sink is not None else b""


def stream_encoder(
    fmt: AudioFormat, sample_rate: int, *, bit_rate: int | None = None
) -> StreamEncoder:
    """A new streaming encoder for ``fmt`` (see module docstring for each format's stream)."""
    if fmt is AudioFormat.PCM:
        return PcmStreamEncoder(sample_rate)
    if fmt is AudioFormat.WAV:
        return WavStreamEncoder(sample_rate)
    return PyAVStreamEncoder(fmt, sample_rate, bit_rate=bit_rate)


# ---------------------------------------------------------------------------- checks
def _check_mono(samples: np.ndarray) -> np.ndarray:
    x = np.asarray(samples, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"audio must be mono (N,) samples, got shape {x.shape}")
    return x


def _check_rate(sample_rate: int) -> None:
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")


# ---------------------------------------------------------------------------- rate change
async def resample_chunks(
    chunks: AsyncIterator[np.ndarray], in_rate: int, out_rate: int
) -> AsyncIterator[np.ndarray]:
    """`chunks` of float32 samples at `in_rate` Hz, resampled to `out_rate` Hz as they come.

    One streaming soxr resampler (HQ) for the whole stream, so chunk boundaries leave no
    seams; its last samples come when `chunks` ends. Empty outputs are skipped. Closing this
    iterator closes `chunks`. Used for OpenAI's `pcm`, which is defined as 24 kHz.

    Raises:
        ValueError: a rate that is not positive.
    """
    _check_rate(in_rate)
    _check_rate(out_rate)
    stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")
    try:
        async for chunk in chunks:
            if (out := stream.resample_chunk(_check_mono(chunk), last=False)).size:
                yield out
        if (tail := stream.resample_chunk(np.zeros(0, np.float32), last=True)).size:
            yield tail
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
