"""Firefly GAN VQ decoder/encoder of Fish Speech 1.5 (codes <-> 44.1 kHz waveform; spec §4)."""

from .config import BackboneConfig, FireflyConfig, HeadConfig, QuantizerConfig, SpecConfig
from .loading import (
    build_dummy_firefly,
    checkpoint_param_count,
    expected_checkpoint_shapes,
    fold_weight_norm,
    load_firefly,
    read_state_dict,
    weight_norm_keys,
)
from .model import EncodeOutput, FireflyGenerator, sequence_mask
from .spectrogram import LogMelSpectrogram, slaney_mel_filterbank

__all__ = [
    "BackboneConfig",
    "EncodeOutput",
    "FireflyConfig",
    "FireflyGenerator",
    "HeadConfig",
    "LogMelSpectrogram",
    "QuantizerConfig",
    "SpecConfig",
    "build_dummy_firefly",
    "checkpoint_param_count",
    "expected_checkpoint_shapes",
    "fold_weight_norm",
    "load_firefly",
    "read_state_dict",
    "sequence_mask",
    "slaney_mel_filterbank",
    "weight_norm_keys",
]
