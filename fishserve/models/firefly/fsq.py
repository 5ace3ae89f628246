"""Grouped FSQ quantizer with causal down/upsampling (spec §4.4, §4.5 step 2, §4.6 step 4).

The FSQ arithmetic (digit decomposition, bound, rounding, ``project_in``/``project_out``) always
runs in float32 with autocast disabled, whatever the dtype of the weights, so that codes do not
depend on the compute precision of the surrounding convolutions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import QuantizerConfig
from .layers import CausalConv1d, CausalConvTranspose1d, ConvNeXtBlock

__all__ = [
    "DownsampleFSQ",
    "FSQGroup",
    "fsq_bound",
    "fsq_codes_to_values",
    "fsq_values_to_codes",
]

FSQ_EPS = 1e-3  # spec §4.4: half_l = (L - 1) * (1 + 1e-3) / 2


def _levels_tensor(levels: Sequence[int], device: torch.device) -> Tensor:
    return _constant(tuple(levels), device)


def _basis(levels: Sequence[int], device: torch.device) -> Tensor:
    """Mixed-radix basis ``(1, L0, L0*L1, ...)`` as int64, shape ``(D,)``."""
    return _constant(tuple(math.prod(levels[:i]) for i in range(len(levels))), device)


@functools.lru_cache(maxsize=64)
def _constant(values: tuple[int, ...], device: torch.device) -> Tensor:
    """A read-only int64 tensor of `values` on `device`, made once: no host-to-device copy per
    call, so the decode path can be captured in a CUDA graph (after one warm-up call)."""
    with torch.inference_mode(False), torch.no_grad():
        return torch.tensor(values, dtype=torch.int64, device=device)


def fsq_codes_to_values(codes: Tensor, levels: Sequence[int]) -> Tensor:
    """Integer codes ``(...)`` -> normalized FSQ values ``(..., D)`` float32 (spec §4.4 decode).

    ``digit_i = (code // basis_i) mod L_i`` (floor semantics, so ids >= prod(levels) and negative
    ids wrap instead of failing); ``value_i = (digit_i - L_i // 2) / (L_i // 2)``.
    """
    codes = codes.long()[..., None]
    lv = _levels_tensor(levels, codes.device)
    digits = torch.remainder(
        torch.div(codes, _basis(levels, codes.device), rounding_mode="floor"), lv
    )
    half = (lv // 2).float()
    return (digits.float() - half) / half


def fsq_bound(z: Tensor, levels: Sequence[int]) -> Tensor:
    """FSQ bound ``tanh(z + shift) * half_l - offset`` on the last axis (size D), float32.

    ``half_l = (L - 1)(1 + 1e-3)/2``, ``offset = 0.5`` for even L else 0,
    ``shift = atanh(offset / half_l)`` (spec §4.4).
    """
    lv = torch.tensor(list(levels), dtype=torch.float32, device=z.device)
    half_l = (lv - 1) * (1 + FSQ_EPS) / 2
    offset = torch.where(torch.remainder(lv, 2) == 0, 0.5, 0.0)
    shift = torch.atanh(offset / half_l)
    return torch.tanh(z.float() + shift) * half_l - offset


def fsq_values_to_codes(bounded: Tensor, levels: Sequence[int]) -> Tensor:
    """Round bounded values ``(..., D)`` and pack the digits into int64 codes ``(...)``."""
    lv = _levels_tensor(levels, bounded.device)
    digits = torch.round(bounded).long() + lv // 2
    return (digits * _basis(levels, bounded.device)).sum(-1)


class FSQGroup(nn.Module):
    """One FSQ group ``residual_fsq.rvqs.g``: project_in C_g -> D, project_out D -> C_g (§4.4)."""

    def __init__(self, group_dim: int, levels: Sequence[int]) -> None:
        super().__init__()
        self.levels = tuple(levels)
        self.project_in = nn.Linear(group_dim, len(levels))
        self.project_out = nn.Linear(len(levels), group_dim)

    def bounded(self, x: Tensor) -> Tensor:
        """``(B, T, C_g)`` -> value to be rounded ``(B, T, D)`` float32 (bound applied twice)."""
        z = _linear_f32(x, self.project_in)
        return fsq_bound(fsq_bound(z, self.levels), self.levels)

    def decode(self, codes: Tensor) -> Tensor:
        """``(B, T)`` int codes -> ``(B, T, C_g)`` float32 latent."""
        return _linear_f32(fsq_codes_to_values(codes, self.levels), self.project_out)


class _GroupList(nn.Module):
    """Container reproducing the checkpoint naming ``residual_fsq.rvqs.<g>``."""

    def __init__(self, groups: Sequence[FSQGroup]) -> None:
        super().__init__()
        self.rvqs = nn.ModuleList(groups)


class DownsampleFSQ(nn.Module):
    """Quantizer (``quantizer``): causal downsample stack + grouped FSQ + causal upsample stack.

    Group g covers channels ``[g*C_g, (g+1)*C_g)`` and is row g of the code tensor.
    Key layout: ``downsample.k.{0: conv, 1: ConvNeXt}``, ``upsample.k.{0: transposed conv,
    1: ConvNeXt}`` (upsample index 0 mirrors the last downsample stage), ``residual_fsq.rvqs.g``.
    """

    def __init__(self, cfg: QuantizerConfig) -> None:
        super().__init__()
        self.levels = tuple(cfg.levels)
        dims, factors = cfg.all_dims, cfg.downsample_factor
        group_dim = dims[-1] // cfg.n_groups
        self.residual_fsq = _GroupList(
            [FSQGroup(group_dim, cfg.levels) for _ in range(cfg.n_groups)]
        )
        self.downsample = nn.ModuleList(
            nn.Sequential(
                CausalConv1d(dims[i], dims[i + 1], f, stride=f), ConvNeXtBlock(dims[i + 1])
            )
            for i, f in enumerate(factors)
        )
        self.upsample = nn.ModuleList(
            nn.Sequential(
                CausalConvTranspose1d(dims[i + 1], dims[i], factors[i], stride=factors[i]),
                ConvNeXtBlock(dims[i]),
            )
            for i in reversed(range(len(factors)))
        )

    @property
    def groups(self) -> nn.ModuleList:
        """The FSQ groups, in code-row order."""
        return self.residual_fsq.rvqs

    def decode_codes(self, codes: Tensor) -> Tensor:
        """``(B, G, L)`` int codes -> ``(B, C, L)`` float32 latent (FSQ lookup + project_out)."""
        with _no_autocast(codes.device):
            parts = [g.decode(codes[:, i]) for i, g in enumerate(self.groups)]
        return torch.cat(parts, dim=-1).transpose(1, 2)

    def upsample_latent(self, z: Tensor) -> Tensor:
        """``(B, C, L)`` -> ``(B, input_dim, L * prod(factors))`` in the dtype of ``z``."""
        for stage in self.upsample:
            z = stage(z)
        return z

    def downsample_features(self, x: Tensor) -> Tensor:
        """``(B, input_dim, T)`` -> ``(B, C, L)`` with ``L = ceil(ceil(T/2)/2)`` for (2, 2)."""
        for stage in self.downsample:
            x = stage(x)
        return x

    def bounded_pre_round(self, x: Tensor) -> Tensor:
        """``(B, C, L)`` downsampled features -> ``(B, G, L, D)`` float32 values to be rounded."""
        chunks = x.transpose(1, 2).chunk(len(self.groups), dim=-1)
        with _no_autocast(x.device):
            return torch.stack([g.bounded(c) for g, c in zip(self.groups, chunks, strict=True)], 1)

    def codes_from_bounded(self, bounded: Tensor) -> Tensor:
        """``(B, G, L, D)`` bounded values -> ``(B, G, L)`` int64 codes in ``[0, prod(levels))``."""
        return fsq_values_to_codes(bounded, self.levels)


def _linear_f32(x: Tensor, layer: nn.Linear) -> Tensor:
    """``layer(x)`` computed in float32 regardless of the parameter/input dtypes."""
    bias = None if layer.bias is None else layer.bias.float()
    return F.linear(x.float(), layer.weight.float(), bias)


def _no_autocast(device: torch.device) -> torch.autocast:
    return torch.autocast(device_type=device.type, enabled=False)
