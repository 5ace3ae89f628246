"""Decode-only paged attention with static shapes (CUDA-graph safe).

In a decode step every sequence adds exactly one position, so the batch is described by
fixed-size tensors: one slot per sequence, a block table padded to the longest possible
context, and context lengths. Nothing here reads a tensor value on the host, so the step can
be captured in a CUDA graph and replayed. Two implementations of the attention: the fused
Triton kernel (GPU) and a gather-all-blocks PyTorch version (CPU, reference).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fishserve.engine.kv_cache import PagedKVCache
from fishserve.engine.triton_attention import paged_decode_attention
from fishserve.models.attention import sdpa_gqa


@dataclass
class DecodeMetadata:
    """One decode step of B sequences (all tensors on the model's device).

    Attributes:
        slot_mapping: int64 (B,) slot of each sequence's new position.
        block_tables: int32 (B, max_blocks) block ids, padded with the null block.
        context_lens: int32 (B,) positions attended, the new one included (>= 1).
    """

    slot_mapping: Tensor
    block_tables: Tensor
    context_lens: Tensor


class DecodeAttention:
    """`AttentionBackend` for decode steps: q (B, 1, H, Dh), k/v (B, 1, KV, Dh).

    Args:
        use_triton: the fused kernel (needs Triton on a GPU); else the PyTorch gather path.
    """

    def __init__(self, cache: PagedKVCache, meta: DecodeMetadata, use_triton: bool) -> None:
        self.cache = cache
        self.meta = meta
        self.use_triton = use_triton

    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Write k/v (B, 1, KV, Dh) at the slot mapping, attend q (B, 1, H, Dh) -> (B, 1, H, Dh)."""
        cache, meta = self.cache, self.meta
        cache.write(layer, meta.slot_mapping, k[:, 0], v[:, 0])
        if self.use_triton:
            scales = (None, None)
            if cache.k_scale is not None:
                scales = (cache.k_scale[layer], cache.v_scale[layer])
            out = paged_decode_attention(
                q[:, 0],
                cache.k[layer],
                cache.v[layer],
                *scales,
                meta.block_tables,
                meta.context_lens,
                cache.layout.block_size,
            )
            return out[:, None]
        return self._torch(layer, q)

    def _torch(self, layer: int, q: Tensor) -> Tensor:
        bs = self.cache.layout.block_size
        tables = self.meta.block_tables.long()
        offsets = torch.arange(bs, device=q.device)
        slots = (tables[:, :, None] * bs + offsets).flatten(1)  # (B, max_blocks * bs)
        keys, values = self.cache.read(layer, slots, q.dtype)  # (B, C, KV, Dh)
        pos = torch.arange(slots.shape[1], device=q.device)
        mask = (pos[None, :] < self.meta.context_lens[:, None].long())[:, None, None, :]
        out = sdpa_gqa(
            q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), mask, causal=False
        )
        return out.transpose(1, 2)
