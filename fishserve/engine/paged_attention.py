"""Attention over the paged KV cache for a flattened, ragged batch.

The runner flattens every scheduled sequence's new positions into one row of N positions
(B = 1 for the model) and describes the batch with `AttentionMetadata`. The backend writes the
new K/V into their slots, then attends each sequence's queries over its whole context read
through its block table. This module is the plain PyTorch implementation (gather + SDPA),
used on CPU and as the reference for fused GPU kernels, which implement the same
`forward(layer, q, k, v)` contract.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fishserve.engine.kv_cache import PagedKVCache
from fishserve.models.attention import sdpa_gqa


@dataclass
class AttentionMetadata:
    """Layout of one step's flattened batch of B sequences and N new positions.

    Attributes:
        slot_mapping: int64 (N,) cache slot of each new position.
        query_start: int64 (B + 1,) offsets of each sequence's positions in the N axis.
        context_lens: int64 (B,) positions in the cache after this step (old + new).
        block_tables: int64 (B, max_blocks) block ids, padded with 0.
        block_size: positions per block.
        max_query, max_context: the largest query length and context length, when the host
            knows them (no device read-back then); None: read from the tensors (synchronises).
    """

    slot_mapping: Tensor
    query_start: Tensor
    context_lens: Tensor
    block_tables: Tensor
    block_size: int
    max_query: int | None = None
    max_context: int | None = None

    @property
    def query_lens(self) -> Tensor:
        """int64 (B,) new positions per sequence."""
        return self.query_start[1:] - self.query_start[:-1]


def context_slots(meta: AttentionMetadata, max_context: int) -> Tensor:
    """int64 (B, max_context) slot of every context position (padding reads slot of pos 0)."""
    pos = torch.arange(max_context, device=meta.block_tables.device)
    valid = pos[None, :] < meta.context_lens[:, None]
    pos = torch.where(valid, pos[None, :], 0)
    blocks = meta.block_tables.gather(1, pos // meta.block_size)
    return blocks * meta.block_size + pos % meta.block_size


class TorchPagedAttention:
    """Gather-then-SDPA paged attention (reference implementation, any device)."""

    def __init__(self, cache: PagedKVCache, meta: AttentionMetadata) -> None:
        self.cache = cache
        self.meta = meta
        self.max_query = meta.max_query or int(meta.query_lens.max())
        self.max_context = meta.max_context or int(meta.context_lens.max())
        self.slots = context_slots(meta, self.max_context)
        self._index, self._valid = self._padding_index()
        self._real = self._valid.flatten().nonzero()[:, 0]  # one host sync per step, not layer
        self.mask = self._mask()

    def _padding_index(self) -> tuple[Tensor, Tensor]:
        """(B, max_query) index into the N axis, and which entries are real positions."""
        q = torch.arange(self.max_query, device=self.slots.device)
        valid = q[None, :] < self.meta.query_lens[:, None]
        index = torch.where(valid, self.meta.query_start[:-1, None] + q[None, :], 0)
        return index, valid

    def _mask(self) -> Tensor:
        """Boolean (B, 1, max_query, max_context): causal within each sequence's context."""
        q = torch.arange(self.max_query, device=self.slots.device)
        first = self.meta.context_lens - self.meta.query_lens  # position of the first query
        q_pos = first[:, None] + q[None, :]
        k_pos = torch.arange(self.max_context, device=self.slots.device)
        mask = k_pos[None, None, :] <= q_pos[:, :, None]
        mask &= k_pos[None, None, :] < self.meta.context_lens[:, None, None]
        mask |= (~self._valid)[:, :, None] & (k_pos == 0)  # padded queries: avoid empty rows
        return mask[:, None]

    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q (1, N, H, Dh), k/v (1, N, KV, Dh) -> (1, N, H, Dh)."""
        self.cache.write(layer, self.meta.slot_mapping, k[0], v[0])
        keys, values = self.cache.read(layer, self.slots, q.dtype)  # (B, C, KV, Dh)
        queries = q[0][self._index]  # (B, Q, H, Dh)
        out = sdpa_gqa(
            queries.transpose(1, 2),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            self.mask,
            causal=False,
        ).transpose(1, 2)  # (B, Q, H, Dh)
        return out.flatten(0, 1)[self._real][None]
