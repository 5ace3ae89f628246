"""One dual-AR decode step's sampling: the slow token, then the fast transformer's codebooks.

Shared by the batch-1 reference loop and the batched engine (spec §2.5): given the slow
transformer's last pre-norm hidden state and logits for each row, sample the token, derive
codebook 0 from it, and run the fast transformer over slots 0..nc-1 to sample codebooks 1..nc-1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fishserve.engine.host_copy import download, to_device
from fishserve.engine.sampling import (
    exponential_noise,
    noise_counter,
    sample,
    sample_prefiltered,
)
from fishserve.models.attention import DenseKVCache, SlotKVCache
from fishserve.models.dual_ar import DualARTransformer
from fishserve.models.fusion import fusion_enabled, gpu_fused


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

    def select(self, rows: Tensor) -> BatchSampling:
        """The settings of `rows` (int64 (R,) indices) only."""
        return BatchSampling(
            *(t[rows] for t in (self.temperature, self.top_p, self.penalty, self.seeds)),
            self.segments[rows],
            self.frames[rows],
        )


def sample_token(
    logits: Tensor, params: BatchSampling, window: Tensor | None, top_k_prefilter: int
) -> tuple[Tensor, Tensor | None]:
    """Sample the slow token of each row (no host synchronisation).

    Args:
        logits: (B, V) slow logits. window: int64 (B, W) penalty window or None.
        top_k_prefilter: candidates of `sample_prefiltered`; 0 (or >= V) samples over the full
            vocabulary with a full sort (`sample`).

    Returns:
        ``(token, exact)``: int64 (B,); bool (B,) rows the prefilter got exactly (None without
        prefilter). Rows that are not exact must go through `resample_rows_`.
    """
    counters = params.counters(0)
    if 0 < top_k_prefilter < logits.shape[-1]:
        return sample_prefiltered(
            logits,
            params.temperature,
            params.top_p,
            params.penalty,
            window,
            params.seeds,
            counters,
            top_k_prefilter,
        )
    noise = exponential_noise(params.seeds, counters, logits.shape[-1])
    return sample(logits, params.temperature, params.top_p, params.penalty, window, noise), None


def inexact_rows(exact: Tensor | None) -> Tensor | None:
    """int64 (R,) rows the prefilter could not decide, or None (waits for the device).

    The mask comes to the host through pinned memory and the rows go back the same way:
    ``nonzero`` on the device would read its count through pageable memory, which blocks the
    other threads' CUDA calls while it waits (`fishserve.engine.host_copy`).
    """
    rows = inexact_rows_host(exact)
    return None if rows is None else to_device(torch.from_numpy(rows), exact.device)


def inexact_rows_host(exact: Tensor | None) -> np.ndarray | None:
    """`inexact_rows` as int64 (R,) host indices, or None (waits for the device)."""
    if exact is None:
        return None
    rows = np.flatnonzero(~download(exact))
    return rows if rows.size else None


def resample_rows_(
    token: Tensor,
    rows: Tensor,
    logits: Tensor,
    params: BatchSampling,
    window: Tensor | None,
) -> None:
    """Overwrite `token[rows]` with the full-vocabulary draw (`sample`) of those rows.

    Args:
        token: int64 (B,) tokens, updated in place. rows: int64 (R,).
        logits: (R, V) slow logits of those rows. window: int64 (B, W) or None.
    """
    sub = params.select(rows)
    noise = exponential_noise(sub.seeds, sub.counters(0), logits.shape[-1])
    sub_window = None if window is None else window[rows]
    token[rows] = sample(logits, sub.temperature, sub.top_p, sub.penalty, sub_window, noise)


def sample_frame(
    model: DualARTransformer,
    hidden: Tensor,
    logits: Tensor,
    params: BatchSampling,
    windows: Tensor | None,
    top_k_prefilter: int = 0,
) -> tuple[Tensor, int]:
    """Sample one frame per row.

    Args:
        model: the DualAR model.
        hidden: (B, D) slow pre-norm hidden state of each row's last position.
        logits: (B, V) slow logits of that position.
        params: per-row sampling tensors.
        windows: int64 (B, 1 + nc, W) repetition windows (row 0 penalises the token, row
            i + 1 codebook i), or None for no penalty (the prefill frame).
        top_k_prefilter: see `sample_token` (rows it cannot decide are resampled exactly,
            which synchronises with the device).

    Returns:
        The frames, int64 (B, 1 + nc): [token, code_0, ..., code_{nc-1}] (code_0 = token -
        semantic_begin_id for semantic tokens, else 0: the reference clamps at 0 and would
        crash on ids past the last semantic token; we map those to 0 too), and how many rows
        the top-k prefilter left to the full sort.
    """
    window = None if windows is None else windows[:, 0]
    token, exact = sample_token(logits, params, window, top_k_prefilter)
    rows = inexact_rows(exact)
    if rows is not None:
        resample_rows_(token, rows, logits[rows], params, window)
    frames = sample_codebooks(model, hidden, token, params, windows)
    return frames, 0 if rows is None else int(rows.numel())


def sample_codebooks_compiled(
    model: DualARTransformer,
    hidden: Tensor,
    token: Tensor,
    params: BatchSampling,
    windows: Tensor | None,
) -> Tensor:
    """`sample_codebooks` on a GPU with each codebook position as one compiled graph.

    Op by op, the fast transformer's 8 positions of 4 layers and their sampling are ~700
    small kernels per step (docs/benchmarks.md §6.10). Here a position (4 layers and the
    head, `_fast_slot`) and a codebook draw (`_sample_slot`) are each one torch.compile
    graph in which inductor fuses the norms, RoPE, cache writes, attention and sampling
    arithmetic between the matrix products. The slot is a device tensor (`SlotKVCache`),
    so the same two graphs serve every position and batch size (dynamic shapes; a batch of
    one runs as two copies of its row, since torch.compile specialises on a size of 1).
    Compiled once per process (inductor caches the code on disk for later starts).

    On the CPU, or with FISHSERVE_FUSION=0, this is `sample_codebooks`. Otherwise the
    frames are those of `sample_codebooks` up to the rounding order inside fused reductions.

    Args and returns: as `sample_codebooks`.
    """
    if not (hidden.is_cuda and fusion_enabled()):
        return sample_codebooks(model, hidden, token, params, windows)
    b = hidden.shape[0]
    if b == 1:
        rows = torch.zeros(2, dtype=torch.int64, device=hidden.device)
        pair = None if windows is None else windows[rows]
        return sample_codebooks_by_slot(
            model, hidden[rows], token[rows], params.select(rows), pair
        )[:1]
    return sample_codebooks_by_slot(model, hidden, token, params, windows)


def sample_codebooks_by_slot(
    model: DualARTransformer,
    hidden: Tensor,
    token: Tensor,
    params: BatchSampling,
    windows: Tensor | None,
) -> Tensor:
    """`sample_codebooks` as 8 calls of the same two slot functions (`_fast_slot`,
    `_sample_slot`; compiled on a GPU, plain on the CPU). Args and returns: as
    `sample_codebooks`."""
    b = hidden.shape[0]
    c = model.config
    code = torch.where(model.is_semantic(token), token - model.semantic_begin_id, 0)
    codes = [code]
    shape = (c.n_fast_layer, b, c.fast_n_local_heads, c.num_codebooks, c.fast_head_dim)
    k = torch.zeros(shape, dtype=hidden.dtype, device=hidden.device)
    v = torch.zeros_like(k)
    x = model.fast_input_from_hidden(hidden[:, None])
    for i in range(c.num_codebooks):
        slot = torch.full((1,), i, dtype=torch.int64, device=hidden.device)
        if i:
            x = model.fast_embeddings(code)[:, None]
        logits, k, v = _fast_slot(model, x, slot, k, v)
        if i:
            code = _sample_slot(logits, params, windows, slot)
            codes.append(code)
    return torch.stack([token, *codes], dim=1)


@gpu_fused
def _fast_slot(
    model: DualARTransformer, x: Tensor, slot: Tensor, k: Tensor, v: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """One fast-transformer position: x (B, 1, D) at `slot` int64 (1,), caches k, v
    (layers, B, KV, nc, Dh) -> (logits (B, C), new k, new v)."""
    cache = SlotKVCache(k.unbind(0), v.unbind(0), slot)
    logits = model.forward_fast(x, slot, cache)[:, -1]
    return logits, torch.stack(cache.k), torch.stack(cache.v)


@gpu_fused
def _sample_slot(
    logits: Tensor, params: BatchSampling, windows: Tensor | None, slot: Tensor
) -> Tensor:
    """The code of codebook `slot` (int64 (1,), 1..nc-1) from its logits (B, C): int64 (B,)."""
    counters = noise_counter(params.segments, params.frames, slot)
    noise = exponential_noise(params.seeds, counters, logits.shape[-1])
    window = None if windows is None else windows.index_select(1, slot + 1)[:, 0]
    return sample(logits, params.temperature, params.top_p, params.penalty, window, noise)


def sample_codebooks(
    model: DualARTransformer,
    hidden: Tensor,
    token: Tensor,
    params: BatchSampling,
    windows: Tensor | None,
) -> Tensor:
    """Codebook 0 from the token, then the fast transformer samples codebooks 1..nc-1.

    Args:
        hidden: (B, D) slow hidden states; token: int64 (B,) sampled slow tokens; params,
            windows: as in `sample_frame`.

    Returns:
        int64 (B, 1 + nc) frames (see `sample_frame`).
    """
    c = model.config
    b = hidden.shape[0]
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
