"""Reference voices: uploaded audio -> validated 44.1 kHz mono -> Firefly codes, cached (issue 4.3).

Accepted input: anything :func:`fishserve.audio.io.load_audio` decodes (wav, flac, mp3, ogg/vorbis,
ogg/opus, m4a/aac, ... via PyAV/FFmpeg; also a raw float ``.npy`` already at the model rate), any
sample rate, any channel count. Channels are averaged to mono and resampled with soxr (HQ) to
``decoder.config.sample_rate`` (spec §4.6 step 1), then encoded (spec §4.6 steps 2-5).

Rejected with :class:`ReferenceAudioError` (a ``ValueError``, so a 4xx for the server), whose
``reason`` is one of:

* ``"undecodable"``: not audio PyAV can decode (or NaN/inf samples);
* ``"empty"``: 0 bytes or no samples;
* ``"too_short"``: shorter than one code frame (``frame_samples`` samples, 46 ms released);
* ``"too_long"``: longer than ``max_seconds`` (default 30 s; long references push the prompt
  past the model context). Decoding stops as soon as the limit is passed;
* ``"silent"``: peak ``|x - mean(x)|`` of the mono 44.1 kHz signal below ``silence_peak``
  (default 1e-3, i.e. -60 dBFS): no sound, or only a constant (DC) offset, such as a float
  file of NaN that a client wrote as 16-bit PCM (all -1.0);
* ``"too_loud"``: peak above ``MAX_PEAK`` (+24 dBFS: float audio scaled far past full scale,
  which the encoder cannot turn into valid codes); or codes outside the codebook after
  encoding (a safety net: such a voice could never be used).

:class:`ReferenceCache` is an LRU bounded by the bytes of the cached codes, keyed by
``sha256(audio bytes)`` plus a fingerprint of the decoder (config, weights, dtype) and of the
validation limits; never by a client-supplied name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Literal

import numpy as np
import torch

from fishserve.models.firefly import FireflyGenerator

from .io import AudioDecodeError, AudioTooLongError, EmptyAudioError, load_audio

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_MAX_SECONDS",
    "SILENCE_PEAK",
    "ReferenceAudioError",
    "ReferenceCache",
    "ReferenceEncoder",
    "decoder_fingerprint",
    "encode_reference_audio",
    "prepare_reference_audio",
]

DEFAULT_MAX_SECONDS = 30.0
SILENCE_PEAK = 1e-3  # -60 dBFS: a peak below this is "silent"
MAX_PEAK = 16.0  # +24 dBFS: float samples past this are not audio at any sensible gain
DEFAULT_CACHE_BYTES = 32 * 1024 * 1024  # ~800 references of 30 s with the released decoder

Reason = Literal["undecodable", "empty", "too_short", "too_long", "silent", "too_loud"]


class ReferenceAudioError(AudioDecodeError):
    """Reference audio that cannot be used; ``reason`` says why (see module docstring)."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason


def prepare_reference_audio(
    audio_bytes: bytes,
    sample_rate: int = 44100,
    *,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    min_samples: int = 1,
    silence_peak: float = SILENCE_PEAK,
) -> np.ndarray:
    """Decode and validate reference audio.

    Args:
        audio_bytes: the uploaded file's bytes (any container/codec PyAV reads, or ``.npy``).
        sample_rate: output rate in Hz (the decoder's ``config.sample_rate``).
        max_seconds: longest accepted duration in seconds.
        min_samples: fewest accepted samples at ``sample_rate``.
        silence_peak: peak absolute amplitude below which the audio counts as silent.

    Returns:
        ``(N,)`` float32 mono waveform at ``sample_rate`` Hz.

    Raises:
        ReferenceAudioError: see the module docstring for the reasons.
    """
    label = "reference audio"
    if not audio_bytes:
        raise ReferenceAudioError("empty", f"{label} is empty (0 bytes)")
    try:
        audio = load_audio(bytes(audio_bytes), sample_rate, max_seconds=max_seconds)
    except EmptyAudioError as exc:
        raise ReferenceAudioError("empty", f"{label} contains no audio samples") from exc
    except AudioTooLongError as exc:
        raise ReferenceAudioError(
            "too_long", f"{label} is longer than the maximum of {max_seconds:g} s"
        ) from exc
    except AudioDecodeError as exc:
        detail = str(exc).split(": ", 1)[-1]  # without load_audio's own label
        raise ReferenceAudioError("undecodable", f"{label} cannot be decoded: {detail}") from exc
    if audio.size < min_samples:
        raise ReferenceAudioError(
            "too_short",
            f"{label} is {audio.size} samples long at {sample_rate} Hz; at least "
            f"{min_samples} ({min_samples / sample_rate:.3f} s) are needed",
        )
    peak = float(np.abs(audio).max())
    if peak == 0:
        raise ReferenceAudioError("silent", f"{label} is silent (every sample is zero)")
    sound = float(np.abs(audio - audio.mean(dtype=np.float64)).max())  # without a DC offset
    if sound < silence_peak:
        level = f"peak {_dbfs(sound)} dBFS" if sound > 0 else f"a constant {_dbfs(peak)} dBFS"
        raise ReferenceAudioError(
            "silent", f"{label} is silent ({level}, below {_dbfs(silence_peak)} dBFS of sound)"
        )
    if peak > MAX_PEAK:
        raise ReferenceAudioError(
            "too_loud",
            f"{label} is far louder than full scale (peak +{_dbfs(peak)} dBFS, above "
            f"+{_dbfs(MAX_PEAK)} dBFS): float samples should lie within about [-1, 1]",
        )
    return audio


def encode_reference_audio(
    decoder: FireflyGenerator,
    audio_bytes: bytes,
    *,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    silence_peak: float = SILENCE_PEAK,
    gpu_turn: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
) -> torch.Tensor:
    """Validate reference audio and encode it with the Firefly encoder (spec §4.6).

    `gpu_turn` is held around the device work only (not the audio decoding and checks): the
    server's `GpuTurns` when the engine and the decoder take turns on the GPU.

    Returns:
        ``(G, L)`` int64 CPU codes, ``L = ceil(ceil(T / 2) / 2)`` with ``T = N // hop`` mel frames;
        all ``L`` columns are kept, as the engine does (spec §4.6 step 5).

    Raises:
        ReferenceAudioError: see :func:`prepare_reference_audio`.
    """
    cfg = decoder.config
    audio = prepare_reference_audio(
        audio_bytes,
        cfg.sample_rate,
        max_seconds=max_seconds,
        min_samples=cfg.frame_samples,
        silence_peak=silence_peak,
    )
    with gpu_turn(), torch.inference_mode():
        wave = torch.from_numpy(audio).to(decoder.device)[None, None]  # (1, 1, N) float32
        codes, _ = decoder.encode(wave, torch.tensor([wave.shape[-1]], device=decoder.device))
        codes = codes[0].to("cpu", torch.int64)  # waits for the device
    if codes.numel() and not (int(codes.min()) >= 0 and int(codes.max()) < cfg.codebook_size):
        raise ReferenceAudioError(
            "too_loud", "reference audio gave codes outside the codebook: check its level"
        )
    return codes


def decoder_fingerprint(decoder: FireflyGenerator) -> str:
    """sha256 hex of the decoder's config, parameter dtype and every parameter/buffer's bytes.

    Two decoders get the same fingerprint only if they encode identically. Cost: one pass over
    the weights (~0.2 s for the released 47 M parameters); compute it once per decoder.
    """
    digest = hashlib.sha256()
    digest.update(json.dumps(decoder.config.to_dict(), sort_keys=True).encode())
    digest.update(str(decoder.dtype).encode())
    for name, tensor in decoder.state_dict().items():
        digest.update(name.encode())
        data = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(data.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class ReferenceCache:
    """Thread-safe LRU of encoded references, bounded by the bytes of the stored codes.

    Keys are opaque strings (use :meth:`ReferenceEncoder.cache_key`); values are ``(G, L)``
    int64 tensors, copied on the way in and out so callers cannot alter cached entries. An entry
    larger than ``max_bytes`` is not stored.

    Raises:
        ValueError: ``max_bytes`` is negative.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> torch.Tensor | None:
        """The cached codes for ``key`` (marked most recently used), or ``None``."""
        with self._lock:
            codes = self._entries.get(key)
            if codes is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return codes.clone()

    def put(self, key: str, codes: torch.Tensor) -> None:
        """Store ``codes`` under ``key``, evicting least recently used entries to fit."""
        size = _nbytes(codes)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= _nbytes(old)
            while self._entries and self._bytes + size > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= _nbytes(evicted)
            self._entries[key] = codes.detach().to("cpu").clone()
            self._bytes += size

    @property
    def nbytes(self) -> int:
        """Bytes of codes currently stored."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries


class ReferenceEncoder:
    """Encode reference audio bytes to codes through a content-addressed :class:`ReferenceCache`.

    Two requests with the same bytes share one cache entry whatever name the client gives them;
    concurrent first requests for the same bytes may both encode (the results are identical).
    Encoding runs on the calling thread, its device work inside ``gpu_turn()`` (default: no
    lock; the server sets its `GpuTurns` there when the GPU is shared in turns).
    """

    def __init__(
        self,
        decoder: FireflyGenerator,
        cache: ReferenceCache | None = None,
        *,
        max_seconds: float = DEFAULT_MAX_SECONDS,
        silence_peak: float = SILENCE_PEAK,
        fingerprint: str | None = None,
    ) -> None:
        """``fingerprint`` overrides :func:`decoder_fingerprint` (e.g. a checkpoint file hash)."""
        self.decoder = decoder
        self.cache = cache if cache is not None else ReferenceCache()
        self.max_seconds = max_seconds
        self.silence_peak = silence_peak
        base = fingerprint or decoder_fingerprint(decoder)
        # Limits are part of the namespace so that a cache shared with a more permissive
        # encoder cannot hand out codes of audio this encoder would reject.
        self._namespace = hashlib.sha256(f"{base}|{max_seconds!r}|{silence_peak!r}".encode())
        self.gpu_turn: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext

    def cache_key(self, audio_bytes: bytes) -> str:
        """``<namespace sha256>:<sha256 of the audio bytes>``."""
        return f"{self._namespace.hexdigest()}:{hashlib.sha256(audio_bytes).hexdigest()}"

    def encode(self, audio_bytes: bytes) -> torch.Tensor:
        """Codes ``(G, L)`` int64 for ``audio_bytes``, from the cache when possible.

        Raises:
            ReferenceAudioError: see :func:`prepare_reference_audio` (failures are not cached).
        """
        key = self.cache_key(bytes(audio_bytes))
        codes = self.cache.get(key)
        if codes is None:
            codes = encode_reference_audio(
                self.decoder,
                audio_bytes,
                max_seconds=self.max_seconds,
                silence_peak=self.silence_peak,
                gpu_turn=self.gpu_turn,
            )
            self.cache.put(key, codes)
        return codes


def _nbytes(codes: torch.Tensor) -> int:
    return codes.numel() * codes.element_size()


def _dbfs(peak: float) -> str:
    return "-inf" if peak <= 0 else f"{20 * np.log10(peak):.1f}"
