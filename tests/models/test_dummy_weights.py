"""Random ("dummy") weights of the language model: flat vs peaked slow logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fishserve.models.loading import PEAKED_LOGIT_STD, load_text2semantic

TINY_T2S = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_t2s"


def slow_logit_std(dummy_logits: str) -> tuple[float, dict[str, torch.Tensor]]:
    model, _ = load_text2semantic(TINY_T2S, load_format="dummy", dummy_logits=dummy_logits)
    hidden = torch.randn(512, model.config.dim, generator=torch.Generator().manual_seed(0))
    hidden = hidden / hidden.pow(2).mean(-1, keepdim=True).sqrt()  # RMS 1, as after the norm
    with torch.inference_mode():
        std = model.output(hidden).std().item()
    return std, model.state_dict()


def test_peaked_logits_have_the_stated_spread_and_nothing_else_changes() -> None:
    flat_std, flat = slow_logit_std("flat")
    peaked_std, peaked = slow_logit_std("peaked")
    dim = 64  # the tiny fixture
    assert flat_std == pytest.approx(0.02 * dim**0.5, rel=0.15)
    assert peaked_std == pytest.approx(PEAKED_LOGIT_STD, rel=0.15)
    changed = [k for k in flat if not torch.equal(flat[k], peaked[k])]
    assert changed == ["output.weight"]


def test_peaked_logits_need_random_weights() -> None:
    with pytest.raises(ValueError, match="random weights only"):
        load_text2semantic(TINY_T2S, dummy_logits="peaked")
    with pytest.raises(ValueError, match="dummy_logits must be one of"):
        load_text2semantic(TINY_T2S, load_format="dummy", dummy_logits="spiky")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("tpu", "unknown device 'tpu'"),
        ("meta", "unsupported device 'meta'"),
        ("mps", "unsupported device 'mps'"),
    ],
)
def test_only_cpu_and_cuda_devices_are_taken(name: str, message: str) -> None:
    """meta and mps parse as torch devices but crashed later with a traceback."""
    from fishserve.models.loading import resolve_device

    with pytest.raises(ValueError, match=message):
        resolve_device(name)
    assert resolve_device("cpu") == torch.device("cpu")
