"""Teacher-forced fidelity: the same token sequence through two configurations.

The sequence is a prompt followed by fixed audio frames (the reference configuration's
generated codes, as prompt columns). It runs once through the slow transformer with paged
attention over a `PagedKVCache` of the configuration's KV dtype (the engine's prefill path, so
every query attends to K/V read back from the quantized cache), then through the fast
transformer teacher-forced the way `DualARTransformer.forward` does it: slot 0 is the slow
hidden state, slot i the embedding of the next frame's code i - 1.

Metrics per predicted frame, against the reference configuration's logits:

- top-1 agreement: argmax equal (slow head: the semantic token; codebook i: its code).
- KL(P_ref || P_test) = sum_v p_ref(v) (log p_ref(v) - log p_test(v)), in nats, over the full
  softmax of the logits (temperature 1, no top-p).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fishserve.engine.kv_cache import KVCacheLayout, PagedKVCache
from fishserve.engine.paged_attention import AttentionMetadata, TorchPagedAttention
from fishserve.models.attention import CausalAttention
from fishserve.models.dual_ar import DualARTransformer
from fishserve.models.prompt import frames_to_columns


@dataclass
class TeacherForced:
    """Logits of the N positions that predict the N audio frames (float32, CPU).

    Attributes:
        slow: (N, V) slow-head logits.
        fast: (N, nc, C) codebook logits.
    """

    slow: Tensor
    fast: Tensor


@dataclass
class Fidelity:
    """Agreement of a configuration with the reference, over all compared frames.

    Attributes:
        frames: predicted frames compared.
        slow_top1, slow_kl: slow head top-1 agreement (0..1) and mean KL (nats).
        codebook_top1, codebook_kl: per codebook, top-1 agreement and mean KL (nats).
    """

    frames: int
    slow_top1: float
    slow_kl: float
    codebook_top1: list[float]
    codebook_kl: list[float]

    @property
    def codebook_top1_min(self) -> float:
        """The worst codebook's agreement."""
        return min(self.codebook_top1)


def sequence_columns(model: DualARTransformer, prompt: Tensor, codes: Tensor) -> Tensor:
    """int64 (1 + nc, P + N): the prompt, then the frames `codes` (nc, N) as columns."""
    frames = frames_to_columns(
        codes, model.semantic_begin_id, codebook_size=model.config.codebook_size
    )
    return torch.cat([prompt, frames], dim=1)


def paged_hidden(
    model: DualARTransformer, columns: Tensor, kv_dtype: str, block_size: int
) -> Tensor:
    """Slow pre-norm hidden states (T, D) of a whole sequence, prefilled into a paged cache."""
    c, device = model.config, model.embeddings.weight.device
    t = columns.shape[1]
    num_blocks = math.ceil(t / block_size)
    layout = KVCacheLayout(c.n_layer, c.n_local_heads, c.head_dim, block_size, num_blocks, kv_dtype)
    cache = PagedKVCache(layout, device)
    positions = torch.arange(t, device=device)
    meta = AttentionMetadata(
        slot_mapping=positions,
        query_start=torch.tensor([0, t], device=device),
        context_lens=torch.tensor([t], device=device),
        block_tables=torch.arange(num_blocks, device=device)[None],
        block_size=block_size,
    )
    embedded = model.embed(columns[None].to(device))
    return model.forward_slow(embedded, positions, TorchPagedAttention(cache, meta))[0]


@torch.inference_mode()
def teacher_forced(
    model: DualARTransformer, prompt: Tensor, codes: Tensor, kv_dtype: str, block_size: int = 16
) -> TeacherForced:
    """Logits predicting each of the frames `codes` (nc, N) after `prompt` (1 + nc, P)."""
    nc, (p, n) = model.config.num_codebooks, (prompt.shape[1], codes.shape[1])
    columns = sequence_columns(model, prompt, codes)
    hidden = paged_hidden(model, columns, kv_dtype, block_size)[p - 1 : p + n - 1]  # (N, D)
    slow = model.slow_logits(hidden)
    next_codes = codes[: nc - 1].T.to(hidden.device)  # (N, nc - 1): codes 0..nc-2 of each frame
    fast_in = torch.cat(
        [model.fast_input_from_hidden(hidden[:, None]), model.fast_embeddings(next_codes)], dim=1
    )
    slots = torch.arange(nc, device=hidden.device)
    fast = model.forward_fast(fast_in, slots, CausalAttention())
    return TeacherForced(slow.float().cpu(), fast.float().cpu())


def kl_and_top1(ref: Tensor, test: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row KL(ref || test) in nats and argmax equality for logits (..., V)."""
    log_p, log_q = F.log_softmax(ref.float(), -1), F.log_softmax(test.float(), -1)
    kl = F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(-1)
    return kl, ref.argmax(-1) == test.argmax(-1)


def compare(refs: list[TeacherForced], tests: list[TeacherForced]) -> Fidelity:
    """Fidelity pooled over all frames of all requests (each frame weighs the same)."""
    slow_ref = torch.cat([r.slow for r in refs])
    slow_test = torch.cat([t.slow for t in tests])
    fast_ref = torch.cat([r.fast for r in refs])
    fast_test = torch.cat([t.fast for t in tests])
    slow_kl, slow_same = kl_and_top1(slow_ref, slow_test)
    fast_kl, fast_same = kl_and_top1(fast_ref, fast_test)  # (N, nc)
    return Fidelity(
        frames=slow_ref.shape[0],
        slow_top1=slow_same.double().mean().item(),
        slow_kl=slow_kl.double().mean().item(),
        codebook_top1=fast_same.double().mean(0).tolist(),
        codebook_kl=fast_kl.double().mean(0).tolist(),
    )
