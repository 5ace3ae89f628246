"""Shared fixtures: paths of the reference parity fixtures and the tiny models built from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fishserve.models.config import DualARConfig
from fishserve.models.dual_ar import DualARTransformer
from fishserve.models.loading import build_model, load_weights

FIXTURES = Path(__file__).parent / "fixtures"
TINY_T2S = FIXTURES / "tiny_t2s"
TINY_DECODER = FIXTURES / "tiny_decoder"
# Fixture tokenizer ids (tests/fixtures/README.md, tiny_t2s section).
TINY_SEMANTIC = (309, 1332)
TINY_IM_END = 301


def load_tiny_model(dtype: torch.dtype = torch.float32) -> DualARTransformer:
    """The tiny fixture DualAR model on CPU in `dtype`."""
    config = DualARConfig.from_file(TINY_T2S / "config.json")
    return build_model(config, TINY_SEMANTIC, load_weights(TINY_T2S), "cpu", dtype)


@pytest.fixture(scope="session")
def tiny_model() -> DualARTransformer:
    return load_tiny_model()


@pytest.fixture(scope="session")
def generate_case() -> dict[str, torch.Tensor]:
    return load_file(TINY_T2S / "generate_case.safetensors")
