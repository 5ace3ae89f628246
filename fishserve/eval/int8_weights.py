"""Weight-only int8 linear layers (evaluation only; the server does not use them yet).

Each weight row (output channel) is quantized symmetrically:

    scale_o = max_i |W[o, i]| / 127,   Q[o, i] = round(W[o, i] / scale_o) in [-127, 127]

and the layer computes y = (x Q^T) * scale + b, which equals x (Q * scale)^T + b: the int8
matrix is cast to the activation dtype for the product (a plain-PyTorch reference, not a fused
int8 kernel, so it saves weight memory but not time). Embeddings and norms stay as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

INT8_MAX = 127


class Int8WeightOnlyLinear(nn.Module):
    """A linear layer with an int8 weight and one scale per output channel."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / INT8_MAX
        q = (weight / scale[:, None]).round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
        dtype = linear.weight.dtype
        self.register_buffer("weight_int8", q)
        self.register_buffer("scale", scale.to(dtype))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), False)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., in) -> (..., out): int8 weights cast to x's dtype, times per-row scales."""
        y = F.linear(x, self.weight_int8.to(x.dtype)) * self.scale
        return y if self.bias is None else y + self.bias


def quantize_linears(model: nn.Module) -> int:
    """Replace every `nn.Linear` inside `model` in place; return how many were replaced."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    for parent, name, child in targets:
        setattr(parent, name, Int8WeightOnlyLinear(child))
    return len(targets)


@torch.no_grad()
def perturb_linears(model: nn.Module, relative_std: float, seed: int = 0) -> None:
    """Add N(0, (relative_std * std(W))^2) noise to every linear weight (seeded, on CPU)."""
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            w = module.weight
            noise = torch.randn(w.shape, generator=gen) * (relative_std * w.float().std().item())
            w.add_(noise.to(device=w.device, dtype=w.dtype))
