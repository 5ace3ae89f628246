"""The batch-1 reference generation loop (spec §6.3): small and clear, not fast.

This is the semantic reference for the batched engine: with fp32 weights and KV cache, the
engine must emit exactly the codes this loop emits. It uses a dense KV cache sized to the
prompt plus the frame budget (not the reference's fixed 8,192 positions).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fishserve.engine.frame import BatchSampling, sample_frame
from fishserve.engine.sampling import REPETITION_WINDOW, SamplingParams
from fishserve.models.attention import DenseKVCache
from fishserve.models.dual_ar import DualARTransformer


class PromptTooLongError(ValueError):
    """The prompt leaves no room for a generated frame within the model's context."""


def frame_budget(prompt_len: int, max_new_tokens: int, max_seq_len: int) -> int:
    """How many frames one segment may generate (spec §6.3).

    `max_new_tokens` 0 means "until the context is full"; the total is clipped to
    `max_seq_len`.

    Raises:
        PromptTooLongError: the prompt alone fills the context.
    """
    room = max_seq_len - prompt_len
    if room <= 0:
        raise PromptTooLongError(
            f"prompt of {prompt_len} positions leaves no room in the {max_seq_len}-position "
            "context: shorten the text (or the voice reference's audio and transcript, if "
            "the request has one)"
        )
    return room if max_new_tokens <= 0 else min(max_new_tokens, room)


def batch_sampling(params: SamplingParams, seed: int, segment: int, device) -> BatchSampling:
    """A one-row `BatchSampling` for `params` at frame 0 of `segment`."""

    def full(value: float | int, dtype: torch.dtype) -> Tensor:
        return torch.full((1,), value, dtype=dtype, device=device)

    return BatchSampling(
        temperature=full(params.temperature, torch.float32),
        top_p=full(params.top_p, torch.float32),
        penalty=full(params.repetition_penalty, torch.float32),
        seeds=full(seed, torch.int64),
        segments=full(segment, torch.int64),
        frames=full(0, torch.int64),
    )


def repetition_window(history: Tensor, step: int) -> Tensor:
    """The penalty window at decode iteration `step` (spec §5).

    Args:
        history: int64 (1 + nc, n) frames produced by the decode loop so far, zero-padded to
            at least 16 columns (unwritten columns are zeros, as in the reference).

    Returns:
        (1 + nc, 16): columns [0, 16) while step < 16, else [step - 16, step).
    """
    start = max(step - REPETITION_WINDOW, 0)
    return history[:, start : start + REPETITION_WINDOW]


@torch.inference_mode()
def generate(
    model: DualARTransformer,
    prompt: Tensor,
    params: SamplingParams,
    im_end_id: int,
    max_new_tokens: int = 0,
    seed: int = 0,
    segment: int = 0,
) -> Tensor:
    """Generate frames for one prompt (spec §6.3).

    Args:
        model: the DualAR model.
        prompt: int (1 + nc, T) prompt columns.
        params: sampling settings (the seed used is `seed`, not `params.seed`).
        im_end_id: id of `<|im_end|>`; a decode step that samples it ends generation (the
            prefill token is never checked).
        max_new_tokens: frame budget including the prefill frame; 0 = until the context ends.
        seed: 32-bit noise seed. segment: text-segment index (selects the noise stream).

    Returns:
        int64 (1 + nc, n) generated frames, the prefill frame first and, if generation
        stopped on `<|im_end|>`, that frame last.

    Raises:
        PromptTooLongError: no room for any frame.
    """
    device = model.embeddings.weight.device
    dtype = model.embeddings.weight.dtype
    c = model.config
    prompt = prompt.to(device=device, dtype=torch.int64)
    t = prompt.shape[1]
    budget = frame_budget(t, max_new_tokens, c.max_seq_len)
    cache = DenseKVCache(c.n_layer, 1, c.n_local_heads, t + budget, c.head_dim, dtype, device)
    sampling = batch_sampling(params, seed, segment, device)

    hidden = model.forward_slow(
        model.embed(prompt[None]), torch.arange(t, device=device), cache.at(0)
    )[:, -1]
    frame, _ = sample_frame(model, hidden, model.slow_logits(hidden), sampling, None)
    frames = [frame[0]]
    history = torch.zeros(
        1 + c.num_codebooks, max(budget, REPETITION_WINDOW), dtype=torch.int64, device=device
    )
    for step in range(budget - 1):
        pos = t + step
        x = model.embed(frame[:, :, None])
        hidden = model.forward_slow(x, torch.tensor([pos], device=device), cache.at(pos))[:, -1]
        sampling.frames += 1
        windows = repetition_window(history, step)[None]
        frame, _ = sample_frame(model, hidden, model.slow_logits(hidden), sampling, windows)
        history[:, step] = frame[0]
        frames.append(frame[0])
        if int(frame[0, 0]) == im_end_id:
            break
    return torch.stack(frames, dim=1)
