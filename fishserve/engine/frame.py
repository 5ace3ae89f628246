"""One dual-AR decode step's sampling: the slow token, then the fast transformer's codebooks.

Shared by the batch-1 reference loop and the batched engine (spec §2.5): given the slow
transformer's last pre-norm hidden state and logits for each row, sample the token, derive
codebook 0 from it, and run the fast transformer over slots 0..nc-1 to sample codebooks 1..nc-1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fishserve.engine.sampling import exponential_noise, noise_counter, sample
from fishserve.models.attention import DenseKVCache
from fishserve.models.dual_ar import DualARTransformer


@dataclass
class BatchSampling:
    """Per-row sampling tensors for one step, all (B,) on the model's device.

    Attributes:
        temperature, top_p, penalty: float32 settings.
        seeds: int64 32-bit seeds.
        segments, frames: int64 text-segment index and frame index within the segment,
            which select the noise stream (`noise_counter`).
    """

    temperature: Tensor
    top_p: Tensor
    penalty: Tensor
    seeds: Tensor
    segments: Tensor
    frames: Tensor

    def counters(self, slot: int) -> Tensor:
        """int64 (B,) noise counters of `slot` (0 = slow token, i = codebook i)."""
        return noise_counter(self.segments, self.frames, slot)


def sample_frame(
    model: DualARTransformer,
    hidden: Tensor,
    logits: Tensor,
    params: BatchSampling,
    windows: Tensor | None,
) -> Tensor:
    """Sample one frame per row.

    Args:
        model: the DualAR model.
        hidden: (B, D) slow pre-norm hidden state of each row's last position.
        logits: (B, V) slow logits of that position.
        params: per-row sampling tensors.
        windows: int64 (B, 1 + nc, W) repetition windows (row 0 penalises the token, row
            i + 1 codebook i), or None for no penalty (the prefill frame).

    Returns:
        int64 (B, 1 + nc): [token, code_0, ..., code_{nc-1}]. code_0 = token -
        semantic_begin_id for semantic tokens, else 0 (the reference clamps at 0 and would
        crash on ids past the last semantic token; we map those to 0 too).
    """
    c = model.config
    b = hidden.shape[0]
    vocab_noise = exponential_noise(params.seeds, params.counters(0), logits.shape[-1])
    window = None if windows is None else windows[:, 0]
    token = sample(logits, params.temperature, params.top_p, params.penalty, window, vocab_noise)
    code = torch.where(model.is_semantic(token), token - model.semantic_begin_id, 0)
    codes = [code]
    cache = DenseKVCache(
        c.n_fast_layer,
        b,
        c.fast_n_local_heads,
        c.num_codebooks,
        c.fast_head_dim,
        hidden.dtype,
        hidden.device,
    )
    slots = torch.arange(c.num_codebooks, device=hidden.device)
    model.forward_fast(model.fast_input_from_hidden(hidden[:, None]), slots[:1], cache.at(0))
    for i in range(1, c.num_codebooks):
        x = model.fast_embeddings(code)[:, None]
        fast_logits = model.forward_fast(x, slots[i : i + 1], cache.at(i))[:, -1]
        noise = exponential_noise(params.seeds, params.counters(i), c.codebook_size)
        window = None if windows is None else windows[:, i + 1]
        code = sample(fast_logits, params.temperature, params.top_p, params.penalty, window, noise)
        codes.append(code)
    return torch.stack([token, *codes], dim=1)
