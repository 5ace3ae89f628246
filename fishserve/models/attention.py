"""Attention backends: how a transformer layer reads and writes its keys and values.

The model computes queries, keys and values (RoPE already applied) and hands them to an
`AttentionBackend`, which owns where K/V live (nowhere, a dense cache, or the engine's paged
cache) and how attention over them is computed. This keeps `dual_ar.py` free of cache logic and
lets the engine plug in paged attention without touching the model (nano-vLLM's `layers/`
pattern).

Shapes everywhere: q `(B, T, H, Dh)`, k and v `(B, T, KV, Dh)`, output `(B, T, H, Dh)`, where
`H` query heads share `KV` key/value heads: query head `h` reads KV head `h // (H // KV)`
(spec §2.4, "interleave-repeated" GQA).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from fishserve.models.fusion import gpu_fused


class AttentionBackend(Protocol):
    """Computes attention for one layer and stores that layer's new K/V if it has a cache."""

    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Attend `q` (B, T, H, Dh) over the cached keys plus `k`, `v` (B, T, KV, Dh).

        Returns the attention output (B, T, H, Dh) in q's dtype.
        """
        ...


def sdpa_gqa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
    """Scaled dot-product attention with grouped KV heads, scale 1/sqrt(Dh).

    Args:
        q: (B, H, Tq, Dh). k, v: (B, KV, Tk, Dh) with H a multiple of KV.
        mask: optional boolean (B or 1, 1, Tq, Tk), True = may attend; excludes `causal`.
        causal: lower-triangular masking aligned at the top-left (Tq == Tk).

    Returns:
        (B, H, Tq, Dh).
    """
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


# Caches up to this many positions attend one query with `attend_one_position` on a GPU.
SMALL_CACHE = 32


@gpu_fused
def attend_one_position(q: Tensor, k: Tensor, v: Tensor, valid: Tensor | None = None) -> Tensor:
    """Attention of one query position over a few keys, in float32, without repeating K/V.

    For the fast transformer's cache (at most `num_codebooks` keys), where a fused kernel for
    long sequences spends most of its time on set-up: on a GPU the products, softmax and sums
    below compile into a few fused kernels (`gpu_fused`). Same math as `sdpa_gqa` (scale
    1/sqrt(Dh), query head h reads KV head h // (H // KV)), with float32 scores and sums.

    Args:
        q: (B, H, 1, Dh). k, v: (B, KV, T, Dh), H a multiple of KV.
        valid: optional bool (T,): the keys attended (others get no weight); at least one.

    Returns:
        (B, H, 1, Dh) in q's dtype.
    """
    b, h, _, dh = q.shape
    kv = k.shape[1]
    qg = q.reshape(b, kv, h // kv, 1, dh).float()  # heads kv * G .. kv * G + G - 1 share kv
    scores = (qg * k[:, :, None].float()).sum(-1) * dh**-0.5  # (B, KV, G, T)
    if valid is not None:
        scores = scores.masked_fill(~valid, float("-inf"))
    weights = scores.softmax(-1)
    out = (weights[..., None] * v[:, :, None].float()).sum(-2)  # (B, KV, G, Dh)
    return out.reshape(b, h, 1, dh).to(q.dtype)


class CausalAttention:
    """No cache: causal self-attention over the T given positions (training-style forward).

    Args:
        key_padding_mask: optional boolean (B, T), True = padding (never attended to).
    """

    def __init__(self, key_padding_mask: Tensor | None = None) -> None:
        self.key_padding_mask = key_padding_mask

    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Causal attention of q (B, T, H, Dh) over k/v (B, T, KV, Dh) -> (B, T, H, Dh)."""
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.key_padding_mask is None:
            return sdpa_gqa(q, k, v, None, causal=True).transpose(1, 2)
        t = q.shape[2]
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        mask = causal[None, None] & ~self.key_padding_mask[:, None, None, :]
        return sdpa_gqa(q, k, v, mask, causal=False).transpose(1, 2)


class DenseKVCache:
    """A dense per-layer K/V cache of shape (num_layers, B, KV, capacity, Dh).

    This is the reference's cache layout (spec §2.7), used by the batch-1 reference loop and by
    the fast (codebook) transformer, whose cache holds only `num_codebooks` positions per frame.
    Memory: 2 * num_layers * B * KV * capacity * Dh * dtype bytes, allocated up front.
    """

    def __init__(
        self,
        num_layers: int,
        batch: int,
        kv_heads: int,
        capacity: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (num_layers, batch, kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity

    def at(self, start: int) -> DenseCacheStep:
        """A backend that writes the next T positions at `start`, `start + 1`, ...

        Raises:
            ValueError: `start` is negative or past the capacity.
        """
        if not 0 <= start < self.capacity:
            raise ValueError(f"cache position {start} outside [0, {self.capacity})")
        return DenseCacheStep(self, start)


class DenseCacheStep:
    """One forward pass over a `DenseKVCache`: positions `start .. start + T - 1`."""

    def __init__(self, cache: DenseKVCache, start: int) -> None:
        self.cache = cache
        self.start = start

    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Store k/v (B, T, KV, Dh) at start.., attend q (B, T, H, Dh) causally -> (B, T, H, Dh).

        Raises:
            ValueError: the cache would overflow.
        """
        t = q.shape[1]
        end = self.start + t
        if end > self.cache.capacity:
            raise ValueError(f"KV cache overflow: {end} positions > capacity {self.cache.capacity}")
        k_cache, v_cache = self.cache.k[layer], self.cache.v[layer]
        k_cache[:, :, self.start : end] = k.transpose(1, 2)
        v_cache[:, :, self.start : end] = v.transpose(1, 2)
        keys, values = k_cache[:, :, :end], v_cache[:, :, :end]
        q = q.transpose(1, 2)
        if t == 1 and q.is_cuda and end <= SMALL_CACHE:  # the CPU keeps SDPA (fixture parity)
            out = attend_one_position(q, keys, values)
        elif t == 1:
            out = sdpa_gqa(q, keys, values, None, causal=False)
        else:
            rows = torch.arange(self.start, end, device=q.device)[:, None]
            mask = rows >= torch.arange(end, device=q.device)[None, :]
            out = sdpa_gqa(q, keys, values, mask[None, None], causal=False)
        return out.transpose(1, 2)


class SlotKVCache:
    """A dense K/V cache written at a slot given as a device tensor, without in-place writes.

    For compiling one fast-transformer position as a graph that serves every codebook slot
    (`fishserve.engine.frame.sample_codebooks_compiled`): the slot is data, not a Python
    int, so the same graph writes slot 0 and slot 7; writes make new tensors (a select
    against a one-hot slot mask), so the graph has no input mutations. Attention reads all
    `capacity` positions with those after the slot masked out (`attend_one_position`): the
    same math as `DenseKVCache` up to the summation order of the softmax.

    Args:
        k, v: per-layer tensors (B, KV, capacity, Dh); positions after the slot are ignored.
        slot: int64 (1,) the position written by this pass (one query position per pass).
    """

    def __init__(self, k: list[Tensor], v: list[Tensor], slot: Tensor) -> None:
        self.k, self.v = list(k), list(v)
        positions = torch.arange(k[0].shape[2], device=slot.device)
        self.valid = positions <= slot
        self.here = (positions == slot)[:, None]  # (capacity, 1): broadcasts over Dh

    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Write k/v (B, 1, KV, Dh) at the slot, attend q (B, 1, H, Dh) -> (B, 1, H, Dh)."""
        self.k[layer] = torch.where(self.here, k.transpose(1, 2), self.k[layer])
        self.v[layer] = torch.where(self.here, v.transpose(1, 2), self.v[layer])
        out = attend_one_position(q.transpose(1, 2), self.k[layer], self.v[layer], self.valid)
        return out.transpose(1, 2)
