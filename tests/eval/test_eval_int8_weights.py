"""Weight-only int8 linears and the deliberate weight noise."""

from __future__ import annotations

import torch
from torch import nn

from fishserve.eval.int8_weights import Int8WeightOnlyLinear, perturb_linears, quantize_linears


def test_int8_linear_is_close_to_the_float_layer():
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    x = torch.randn(5, 64)
    q = Int8WeightOnlyLinear(linear)
    assert q.weight_int8.dtype == torch.int8 and q.scale.shape == (32,)
    err = (q(x) - linear(x)).abs().max() / linear(x).abs().max()
    assert 0 < err < 0.01


def test_quantize_replaces_every_linear_and_keeps_the_rest():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4)))
    assert quantize_linears(model) == 2
    assert isinstance(model[0], Int8WeightOnlyLinear) and isinstance(
        model[2][0], Int8WeightOnlyLinear
    )
    assert isinstance(model[1], nn.ReLU)


def test_perturbation_is_seeded_and_relative():
    torch.manual_seed(0)
    a, b = nn.Linear(16, 16), nn.Linear(16, 16)
    b.load_state_dict(a.state_dict())
    before = a.weight.clone()
    perturb_linears(a, 0.1, seed=3)
    perturb_linears(b, 0.1, seed=3)
    assert torch.equal(a.weight, b.weight)
    ratio = (a.weight - before).std() / before.std()
    assert 0.05 < ratio < 0.2
