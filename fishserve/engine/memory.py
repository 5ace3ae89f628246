"""Memory budget: how many KV blocks fit next to the weights, activations and decoder.

    kv_pool = budget - weights - activation_peak - decoder_workspace - reserved
    num_blocks = kv_pool // bytes_per_block

(the same accounting as vLLM's `--gpu-memory-utilization`: the budget bounds everything the
process allocates on the device, so admission by free blocks can never run it out of memory).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from fishserve.models.config import DualARConfig

log = logging.getLogger(__name__)

MiB = 2**20
# PyTorch's caching allocator reads this variable when CUDA is first used.
ALLOC_CONF_VAR = "PYTORCH_CUDA_ALLOC_CONF"
# Expandable segments: freed memory is reused across allocation sizes instead of being cached
# per segment. Without it, the variable-shape eager temporaries of a long-running server (the
# exact top-p fallback over (rows, 102,048) logits, prefill chunks) fragment the cache: on the
# H200 the server's process grew to 87.7 GiB used (86.7 GiB reserved, 30.8 GiB allocated) over
# a 40 GiB budget at 1,024 streams; with it, 40.8 GiB (docs/benchmarks.md §6.3).
DEFAULT_ALLOC_CONF = "expandable_segments:True"


def configure_cuda_allocator() -> None:
    """Use `DEFAULT_ALLOC_CONF` for PyTorch's CUDA allocator unless the user set
    ``PYTORCH_CUDA_ALLOC_CONF``; call before CUDA is first used (no effect afterwards)."""
    if ALLOC_CONF_VAR not in os.environ:
        os.environ[ALLOC_CONF_VAR] = DEFAULT_ALLOC_CONF
        log.info("%s=%s", ALLOC_CONF_VAR, DEFAULT_ALLOC_CONF)


class InsufficientMemoryError(ValueError):
    """The budget cannot hold the weights, activations, decoder and one KV block."""


@dataclass(frozen=True)
class MemoryPlan:
    """The budget's breakdown, in bytes."""

    budget: int
    weights: int
    activations: int
    decoder_workspace: int
    reserved: int
    kv_bytes_per_token: int
    block_size: int
    num_blocks: int

    @property
    def kv_pool(self) -> int:
        """Bytes of the KV pool actually allocated (whole blocks)."""
        return self.num_blocks * self.block_size * self.kv_bytes_per_token

    def sequences_of(self, positions: int = 1000) -> int:
        """How many sequences of `positions` positions fit in the pool at once."""
        per_seq = -(-positions // self.block_size)
        return self.num_blocks // per_seq

    def summary(self, positions: int = 1000) -> str:
        """One log line with every term of the breakdown, and how many sequences of
        `positions` positions (prompt + frames; the model's context at most) fit."""

        def mib(x: int) -> str:
            return f"{x / MiB:.1f} MiB"

        return (
            f"memory budget {mib(self.budget)}: weights {mib(self.weights)}, activations "
            f"{mib(self.activations)}, decoder {mib(self.decoder_workspace)}, reserved "
            f"{mib(self.reserved)}, KV pool {mib(self.kv_pool)} = {self.num_blocks} blocks x "
            f"{self.block_size} positions at {self.kv_bytes_per_token} B/position; "
            f"{self.sequences_of(positions)} sequence"
            f"{'s' if self.sequences_of(positions) != 1 else ''} of {positions:,} positions fit"
        )


def plan_memory(
    budget: int,
    weights: int,
    activations: int,
    decoder_workspace: int,
    kv_bytes_per_token: int,
    block_size: int,
    reserved: int = 0,
) -> MemoryPlan:
    """Size the KV pool from what the budget leaves.

    Raises:
        InsufficientMemoryError: not even one block fits.
    """
    left = budget - weights - activations - decoder_workspace - reserved
    num_blocks = max(left, 0) // (kv_bytes_per_token * block_size)
    if num_blocks < 1:
        raise InsufficientMemoryError(
            f"memory budget {budget / MiB:.0f} MiB is too small: weights {weights / MiB:.0f} "
            f"MiB + activations {activations / MiB:.0f} MiB + decoder "
            f"{decoder_workspace / MiB:.0f} MiB + reserved {reserved / MiB:.0f} MiB leave no "
            "room for the KV cache"
        )
    return MemoryPlan(
        budget,
        weights,
        activations,
        decoder_workspace,
        reserved,
        kv_bytes_per_token,
        block_size,
        int(num_blocks),
    )


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def estimate_activation_bytes(
    config: DualARConfig,
    max_tokens: int,
    max_seqs: int,
    dtype: torch.dtype,
    max_context: int | None = None,
) -> int:
    """Analytic upper estimate of one step's activation peak (used where it can't be measured).

    Terms: the widest slow-layer intermediates over `max_tokens` positions (qkv, SwiGLU's
    two hidden projections, residual copies), the attention scores and gathered K/V of the
    torch paged-attention path (one sequence of `max_tokens` queries over `max_context`
    keys), and fp32 sampling over the vocabulary for `max_seqs` rows (logits, sort, cumsum,
    noise: ~6 copies).
    """
    elem = torch.empty((), dtype=dtype).element_size()
    ctx = max_context or config.max_seq_len
    layer = max_tokens * (4 * config.dim + 3 * config.intermediate_size) * elem
    attention = config.n_head * max_tokens * ctx * 4 + 2 * ctx * config.dim * elem
    sampling = 6 * max_seqs * config.vocab_size * 4
    return int(layer + attention + sampling)
