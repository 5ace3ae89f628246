"""Log-mel front end of the Firefly encoder (spec §4.6 step 2).

``log(max(FB^T · sqrt(|STFT|^2 + 1e-6), 1e-5))`` with a reflect-padded, non-centered STFT using a
periodic Hann window and a slaney-scale, slaney-normalized mel filterbank computed here (no
librosa / torchaudio dependency). Everything runs in float32 with autocast disabled.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import SpecConfig

__all__ = ["LogMelSpectrogram", "hz_to_mel_slaney", "mel_to_hz_slaney", "slaney_mel_filterbank"]

MAG_EPS = 1e-6  # added to re^2 + im^2 before the sqrt
LOG_CLAMP = 1e-5  # mel floor before the log

_F_SP = 200.0 / 3.0  # slaney scale: linear part, Hz per mel
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP  # = 15
_LOGSTEP = math.log(6.4) / 27.0


def hz_to_mel_slaney(freq: float) -> float:
    """Slaney mel scale (linear below 1 kHz, logarithmic above); Hz -> mel (python float)."""
    if freq < _MIN_LOG_HZ:
        return freq / _F_SP
    return _MIN_LOG_MEL + math.log(freq / _MIN_LOG_HZ) / _LOGSTEP


def mel_to_hz_slaney(mel: Tensor) -> Tensor:
    """Inverse of :func:`hz_to_mel_slaney`, elementwise on a tensor (keeps its dtype)."""
    log_part = _MIN_LOG_HZ * torch.exp(_LOGSTEP * (mel - _MIN_LOG_MEL))
    return torch.where(mel >= _MIN_LOG_MEL, log_part, mel * _F_SP)


def slaney_mel_filterbank(
    n_freqs: int, n_mels: int, sample_rate: int, f_min: float = 0.0, f_max: float | None = None
) -> Tensor:
    """Triangular mel filterbank, slaney scale and slaney (area) normalization.

    Band edges are spaced evenly on the mel scale between ``f_min`` and ``f_max``; filter m rises
    from edge m to m+1, falls to m+2 and is scaled by ``2 / (f_{m+2} - f_m)``. The arithmetic is
    float32 on purpose: that reproduces the reference log-mel bit-exactly (float64 differs by
    ~1e-6 in the log).

    Args:
        n_freqs: number of STFT bins (``n_fft // 2 + 1``), spaced evenly over 0..sample_rate//2 Hz.
        n_mels: number of mel bands.
        sample_rate: audio sample rate in Hz.
        f_min, f_max: band edges in Hz (``f_max=None`` -> ``sample_rate / 2``).

    Returns:
        ``(n_freqs, n_mels)`` float32 tensor.
    """
    f_max = sample_rate / 2 if f_max is None else f_max
    freqs = torch.linspace(0, sample_rate // 2, n_freqs, dtype=torch.float32)
    mels = torch.linspace(
        hz_to_mel_slaney(f_min), hz_to_mel_slaney(f_max), n_mels + 2, dtype=torch.float32
    )
    edges = mel_to_hz_slaney(mels)  # (n_mels + 2,)
    widths = edges[1:] - edges[:-1]  # (n_mels + 1,)
    dist = edges[None, :] - freqs[:, None]  # (n_freqs, n_mels + 2)
    rising = -dist[:, :-2] / widths[:-1]
    falling = dist[:, 2:] / widths[1:]
    fb = torch.clamp(torch.minimum(rising, falling), min=0.0)
    return fb * (2.0 / (edges[2:] - edges[:-2]))[None, :]


class LogMelSpectrogram(nn.Module):
    """Waveform -> log-mel, exactly as the Firefly encoder expects (spec §4.6 step 2).

    Holds no parameters or state-dict buffers; the window and filterbank are float32 tensors
    cached per device (they stay float32 when the model is cast to bf16/fp16).
    """

    def __init__(self, cfg: SpecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self._cache: dict[torch.device, tuple[Tensor, Tensor]] = {}

    def min_samples(self) -> int:
        """Shortest accepted input, in samples (reflect padding needs more than the pad)."""
        c = self.cfg
        return max(c.hop_length, (c.win_length - c.hop_length + 1) // 2 + 1)

    def _tables(self, device: torch.device) -> tuple[Tensor, Tensor]:
        if device not in self._cache:
            c = self.cfg
            window = torch.hann_window(c.win_length, periodic=True, dtype=torch.float32)
            fb = slaney_mel_filterbank(c.n_fft // 2 + 1, c.n_mels, c.sample_rate, c.f_min, c.f_max)
            self._cache[device] = (window.to(device), fb.T.contiguous().to(device))
        return self._cache[device]

    def forward(self, audio: Tensor) -> Tensor:
        """Compute the log-mel spectrogram.

        Args:
            audio: ``(B, 1, N)`` or ``(B, N)`` float waveform at ``cfg.sample_rate`` Hz.

        Returns:
            ``(B, n_mels, N // hop_length)`` float32 natural-log mel magnitudes.

        Raises:
            ValueError: wrong rank or fewer than :meth:`min_samples` samples.
        """
        if audio.ndim == 3:
            if audio.shape[1] != 1:
                raise ValueError(f"expected mono audio (B, 1, N), got {tuple(audio.shape)}")
            audio = audio[:, 0]
        if audio.ndim != 2:
            raise ValueError(
                f"expected audio of shape (B, 1, N) or (B, N), got {tuple(audio.shape)}"
            )
        if audio.shape[-1] < self.min_samples():
            raise ValueError(
                f"audio too short for the log-mel front end: {audio.shape[-1]} samples "
                f"(need at least {self.min_samples()})"
            )
        c = self.cfg
        window, fb_t = self._tables(audio.device)
        with torch.autocast(device_type=audio.device.type, enabled=False):
            pad = c.win_length - c.hop_length
            y = F.pad(audio.float()[:, None], (pad // 2, (pad + 1) // 2), mode="reflect")[:, 0]
            spec = torch.stft(
                y,
                c.n_fft,
                hop_length=c.hop_length,
                win_length=c.win_length,
                window=window,
                center=False,
                onesided=True,
                return_complex=True,
            )
            mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + MAG_EPS)
            mel = torch.matmul(fb_t, mag)
            return torch.log(torch.clamp(mel, min=LOG_CLAMP))
