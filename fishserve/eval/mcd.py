"""Mel-cepstral distortion (MCD) between two waveforms of the same utterance, in dB.

Formula (Kubichek, "Mel-cepstral distance measure for objective speech quality assessment",
IEEE PACRIM 1993, pp. 125-128; the form used throughout TTS and voice conversion work):

    MCD = (10 / ln 10) * sqrt(2 * sum_{d=1..D} (c_d - c'_d)^2)      per frame, in dB,

averaged over frames, where c_d are mel-cepstral coefficients and c_0 (energy) is left out.

Mel-cepstra here come from a mel filter bank rather than SPTK's all-pass warping: power
spectrum (Hann window, `N_FFT`-point STFT, hop `HOP`), `N_MELS` mel bands from librosa's filter
bank (`librosa.filters.mel`: Slaney mel scale and area normalisation), natural-log amplitude
ln sqrt(mel power), then the cepstrum of that log spectrum on the mel axis,

    c_d = (1 / M) * sum_{k=0..M-1} ln|X_k| cos(pi d (k + 1/2) / M),   d = 0..D,

so that ln|X_k| = c_0 + 2 sum_d c_d cos(...) like a real cepstrum. Values are comparable
between configurations of this tool, and close to, but not identical with, SPTK-based MCD.
Waveforms of different lengths are cut to the shorter one (frames are aligned in time, no
DTW: both signals come from the same codes or the same fixed number of frames).
"""

from __future__ import annotations

import functools
import math

import numpy as np

N_FFT = 2048  # 46 ms at 44.1 kHz
HOP = 512  # 11.6 ms at 44.1 kHz
N_MELS = 80
ORDER = 24  # D: coefficients c_1..c_24, a common MCD order
POWER_FLOOR = 1e-10  # mel power floor before the log (silence)
MCD_CONSTANT = 10.0 / math.log(10.0) * math.sqrt(2.0)


def power_spectrogram(wave: np.ndarray) -> np.ndarray:
    """|STFT|^2 (frames, N_FFT // 2 + 1) of a mono waveform, frames centred (reflect padded)."""
    wave = np.asarray(wave, dtype=np.float64)
    pad = N_FFT // 2
    mode = "reflect" if wave.shape[0] > pad else "constant"
    padded = np.pad(wave, pad, mode=mode)
    if padded.shape[0] < N_FFT:
        padded = np.pad(padded, (0, N_FFT - padded.shape[0]))
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]
    window = np.hanning(N_FFT + 1)[:-1]  # periodic Hann
    return np.abs(np.fft.rfft(frames * window, axis=-1)) ** 2


@functools.lru_cache(maxsize=4)
def mel_filter_bank(sample_rate: int) -> np.ndarray:
    """(N_MELS, N_FFT // 2 + 1) mel filter bank (Slaney scale and norm).

    From librosa when it imports; otherwise the same Slaney filter bank of the Firefly front end
    (`slaney_mel_filterbank`, float32 arithmetic), which agrees with librosa to ~1e-7.
    """
    try:
        from librosa.filters import mel
    except Exception:  # librosa missing or broken (e.g. a numba mismatch)
        from fishserve.models.firefly.spectrogram import slaney_mel_filterbank

        bank = slaney_mel_filterbank(N_FFT // 2 + 1, N_MELS, sample_rate)
        return bank.double().numpy().T
    return mel(sr=sample_rate, n_fft=N_FFT, n_mels=N_MELS, dtype=np.float64)


def cepstrum_basis(order: int = ORDER, bands: int = N_MELS) -> np.ndarray:
    """(order + 1, bands) cosine basis: row d = cos(pi d (k + 1/2) / M) / M."""
    d = np.arange(order + 1)[:, None]
    k = np.arange(bands)[None, :]
    return np.cos(np.pi * d * (k + 0.5) / bands) / bands


def mel_cepstrum(wave: np.ndarray, sample_rate: int, order: int = ORDER) -> np.ndarray:
    """Mel-cepstra (frames, order + 1) of a mono waveform (see the module docstring)."""
    mel_power = power_spectrogram(wave) @ mel_filter_bank(sample_rate).T  # (frames, M)
    log_amplitude = 0.5 * np.log(np.maximum(mel_power, POWER_FLOOR))
    return log_amplitude @ cepstrum_basis(order).T


def mcd_per_frame(ref: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Per-frame MCD (dB) of two cepstra (frames, order + 1); c_0 is left out."""
    diff = ref[:, 1:] - test[:, 1:]
    return MCD_CONSTANT * np.sqrt(np.sum(diff**2, axis=1))


def mcd_frames(ref: np.ndarray, test: np.ndarray, sample_rate: int) -> np.ndarray:
    """Per-frame MCD (dB) of two waveforms, cut to the shorter one."""
    n = min(ref.shape[-1], test.shape[-1])
    return mcd_per_frame(mel_cepstrum(ref[:n], sample_rate), mel_cepstrum(test[:n], sample_rate))


def mel_cepstral_distortion(ref: np.ndarray, test: np.ndarray, sample_rate: int) -> float:
    """Mean MCD (dB) of two waveforms of the same utterance (0.0 when identical)."""
    return float(np.mean(mcd_frames(ref, test, sample_rate)))
