"""Mel-cepstral distortion: zero for identical audio, the formula's constant, gain invariance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fishserve.eval.mcd import mcd_per_frame, mel_cepstral_distortion, mel_cepstrum

RATE = 44100


def noise(seed: int, seconds: float = 0.5) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(int(RATE * seconds)).astype(np.float32) * 0.1


def test_identical_audio_has_zero_mcd():
    wave = noise(0)
    assert mel_cepstral_distortion(wave, wave.copy(), RATE) == 0.0


def test_formula_constant_matches_kubichek():
    ref = np.zeros((3, 25))
    test = ref.copy()
    test[:, 1] = 1.0  # one unit in c_1 on every frame
    np.testing.assert_allclose(mcd_per_frame(ref, test), 10 / math.log(10) * math.sqrt(2))
    test[:, 0] = 5.0  # c_0 (energy) is left out
    np.testing.assert_allclose(mcd_per_frame(ref, test), 10 / math.log(10) * math.sqrt(2))


def test_gain_changes_only_c0_so_mcd_stays_zero():
    wave = noise(1)
    assert mel_cepstral_distortion(wave, 3.0 * wave, RATE) == pytest.approx(0.0, abs=1e-6)


def test_different_audio_has_positive_mcd_and_lengths_are_cut():
    a, b = noise(2), noise(3, seconds=0.6)
    mcd = mel_cepstral_distortion(a, b, RATE)
    assert mcd > 0.5
    assert mel_cepstrum(a, RATE).shape == (len(a) // 512 + 1, 25)


def test_filtered_audio_is_further_than_slightly_noisy_audio():
    wave = noise(4)
    slightly = wave + 0.001 * noise(5)
    muffled = np.convolve(wave, np.ones(16) / 16, mode="same").astype(np.float32)
    assert (
        0
        < mel_cepstral_distortion(wave, slightly, RATE)
        < mel_cepstral_distortion(wave, muffled, RATE)
    )
