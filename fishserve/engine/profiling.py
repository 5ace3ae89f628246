"""Measure the activation peak of the largest step the engine will run (CUDA only).

Before the KV pool is sized, the engine runs one dummy step as large as it will ever schedule:
a prefill chunk of `max_num_batched_tokens` positions (the general path's attention scores
are quadratic in it) followed by sampling a frame for `max_num_seqs` rows (the 102k-wide
vocabulary sort), on a throw-away KV cache just big enough for it. The peak of the PyTorch
allocator above its level before the step, minus that temporary cache, is the activation
budget (vLLM's `profile_run` works the same way).
"""

from __future__ import annotations

import torch

from fishserve.engine.frame import BatchSampling, sample_frame
from fishserve.engine.kv_cache import KVCacheLayout, PagedKVCache
from fishserve.engine.paged_attention import AttentionMetadata, TorchPagedAttention
from fishserve.engine.sampling import REPETITION_WINDOW
from fishserve.models.dual_ar import DualARTransformer


def dummy_step(
    model: DualARTransformer, tokens: int, seqs: int, block_size: int, kv_dtype: str
) -> None:
    """One prefill of `tokens` positions plus sampling for `seqs` rows, on random inputs."""
    c = model.config
    device = model.embeddings.weight.device
    tokens = min(tokens, c.max_seq_len)  # a chunk never spans more than the context
    blocks = -(-tokens // block_size)
    cache = PagedKVCache(
        KVCacheLayout(c.n_layer, c.n_local_heads, c.head_dim, block_size, blocks, kv_dtype), device
    )
    table = torch.arange(blocks, device=device)
    pos = torch.arange(tokens, device=device)
    meta = AttentionMetadata(
        table[pos // block_size] * block_size + pos % block_size,
        torch.tensor([0, tokens], device=device),
        torch.tensor([tokens], device=device),
        table[None],
        block_size,
    )
    columns = torch.zeros(1, 1 + c.num_codebooks, tokens, dtype=torch.int64, device=device)
    hidden = model.forward_slow(model.embed(columns), pos, TorchPagedAttention(cache, meta))
    rows = hidden[0, torch.arange(seqs, device=device) % tokens]
    ones = torch.ones(seqs, device=device)
    zeros = torch.zeros(seqs, dtype=torch.int64, device=device)
    windows = torch.zeros(
        seqs, 1 + c.num_codebooks, REPETITION_WINDOW, dtype=torch.int64, device=device
    )
    sampling = BatchSampling(ones, ones, ones, zeros, zeros, zeros)
    sample_frame(model, rows, model.slow_logits(rows), sampling, windows)


@torch.inference_mode()
def profile_activation_bytes(
    model: DualARTransformer, max_tokens: int, max_seqs: int, block_size: int, kv_dtype: str
) -> int:
    """Peak activation bytes of the largest step (see the module docstring); CUDA only."""
    device = model.embeddings.weight.device
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    dummy_step(model, max_tokens, max_seqs, block_size, kv_dtype)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    torch.cuda.empty_cache()
    return int(peak)
