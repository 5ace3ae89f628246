"""Stateful streaming decode: each causal layer keeps its last inputs between chunks.

Every decoder op is causal (spec §4.3): a causal conv's output at time t reads its input at
``t - (K - 1) .. t`` (effective kernel K, stride 1), a causal transposed conv's output block of
input i reads inputs ``i - ceil((k - s) / s) .. i``, and everything else (FSQ lookup, LayerNorm,
the pointwise layers, SiLU, GELU, tanh) acts on one time step. So a stream decoded chunk by
chunk gives exactly the one-shot waveform when every such layer is fed, before the chunk's
inputs, the inputs it saw last (zeros before the stream's first frame, as the one-shot causal
padding). Unlike decoding each chunk with left context frames
(`fishserve.audio.streaming.StreamingDecoder`), no frame is decoded twice.

This is the PyTorch reference of that scheme (any device; streams with chunks of unequal
lengths share a call): the oracle for faster kernels. Memory per stream: each layer's tail of
``K - 1`` (or ``ceil((k - s) / s)``) input steps, a few hundred KiB for the released decoder
in fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fishserve.models.firefly.layers import (
    CausalConv1d,
    CausalConvTranspose1d,
    ConvNeXtBlock,
    ParallelBlock,
)
from fishserve.models.firefly.model import FireflyGenerator

__all__ = ["StreamState", "decode_chunk", "decode_chunks"]


@dataclass
class StreamState:
    """The inputs each causal layer of one decoder saw last, for one stream.

    Attributes:
        tails: per layer (keyed by ``id(module)``), its last input steps ``(C, n)`` in the
            decoder's dtype; a layer not yet seen starts from zeros.
        frames: code frames of the stream decoded so far.
    """

    tails: dict[int, Tensor] = field(default_factory=dict)
    frames: int = 0


@torch.inference_mode()
def decode_chunk(decoder: FireflyGenerator, codes: Tensor, state: StreamState) -> Tensor:
    """Decode the next ``(G, n)`` `codes` of one stream, continuing from `state` (updated in
    place); `decode_chunks` for a batch of one.

    Returns:
        ``(n * frame_samples,)`` float32 waveform (see `decode_chunks`).
    """
    n = codes.shape[-1]
    lengths = torch.tensor([n])
    return decode_chunks(decoder, codes[None], lengths, [state])[0]


@torch.inference_mode()
def decode_chunks(
    decoder: FireflyGenerator, codes: Tensor, lengths: Tensor, states: list[StreamState]
) -> list[Tensor]:
    """Decode the next chunk of several streams in one batched call, each continuing from
    its own state (updated in place).

    Chunks of unequal lengths are right-padded to the longest: every layer is causal, so the
    padding only reaches samples past a stream's chunk, which are dropped, and each layer's
    new tail is taken at the stream's own end.

    Args:
        codes: ``(B, G, L)`` integer codes, stream b's chunk in ``[:, :lengths[b]]`` (ids wrap
            as in `FireflyGenerator.decode`).
        lengths: ``(B,)`` integer frames of each chunk, in ``[1, L]``.
        states: one `StreamState` per stream (B of them).

    Returns:
        Per stream, a ``(lengths[b] * frame_samples,)`` float32 waveform at
        ``config.sample_rate`` Hz: the samples of these frames in the one-shot decode of the
        whole stream so far.

    Raises:
        ValueError: bad codes (as `FireflyGenerator.decode_latent`), lengths outside
            ``[1, L]``, or not one state per stream.
    """
    codes = decoder._check_codes(codes)
    batch, width = codes.shape[0], codes.shape[-1]
    lengths = torch.as_tensor(lengths, dtype=torch.int64).cpu()
    if lengths.shape != (batch,) or int(lengths.min()) < 1 or int(lengths.max()) > width:
        raise ValueError(f"lengths must be ({batch},) frames in [1, {width}], got {lengths}")
    if len(states) != batch:
        raise ValueError(f"one state per stream: {batch} streams, {len(states)} states")
    run = _Batch(states, lengths)
    z = decoder.quantizer.decode_codes(codes).to(decoder.dtype)
    for stage in decoder.quantizer.upsample:
        up, block = stage
        z = _convnext(block, _transposed(up, z, run), run)
    head = decoder.head
    x = _conv(head.conv_pre, z, run)
    for up, block in zip(head.ups, head.resblocks, strict=True):
        x = _parallel(block, _transposed(up, F.silu(x), run), run)
    wav = torch.tanh(_conv(head.conv_post, F.silu(x), run))[:, 0].float()
    per_frame = wav.shape[-1] // width
    for state, n in zip(states, lengths.tolist(), strict=True):
        state.frames += n
    return [wav[b, : n * per_frame] for b, n in enumerate(lengths.tolist())]


class _Batch:
    """The streams of one call: their states and valid steps at the current time scale."""

    def __init__(self, states: list[StreamState], lengths: Tensor) -> None:
        self.states = states
        self.valid = lengths.clone()  # valid input steps per stream at the current layer

    def with_tail(self, module: nn.Module, x: Tensor, keep: int) -> Tensor:
        """`x` ``(B, C, T)`` after each stream's last `keep` inputs of `module` (zeros at
        first); stores each stream's new tail, ending at its own last valid step."""
        key = id(module)
        tails = [s.tails.get(key) for s in self.states]
        zeros = x.new_zeros(x.shape[1], keep)
        full = torch.cat([torch.stack([zeros if t is None else t for t in tails]), x], dim=-1)
        for b, (state, end) in enumerate(zip(self.states, self.valid.tolist(), strict=True)):
            state.tails[key] = full[b, :, end : end + keep].clone()
        return full


def _conv(module: CausalConv1d, x: Tensor, run: _Batch) -> Tensor:
    """A stride-1 causal conv over `x` ``(B, C, T)`` -> ``(B, C_out, T)``."""
    if module.stride != 1:
        raise ValueError("stateful decoding needs stride-1 causal convs")
    full = run.with_tail(module, x, module.effective_kernel - 1)
    return module.conv(full)  # no padding: the tail is the causal left context


def _transposed(module: CausalConvTranspose1d, x: Tensor, run: _Batch) -> Tensor:
    """A causal transposed conv over `x` ``(B, C, T)`` -> ``(B, C_out, T * stride)``."""
    stride = module.conv.stride[0]
    keep = math.ceil(module.trim / stride)
    y = module.conv(run.with_tail(module, x, keep))
    run.valid = run.valid * stride
    return y[..., keep * stride : (keep + x.shape[-1]) * stride]


def _convnext(block: ConvNeXtBlock, x: Tensor, run: _Batch) -> Tensor:
    """`ConvNeXtBlock.forward` with its depthwise conv continued from each stream's state."""
    y = _conv(block.dwconv, x, run).transpose(1, 2)
    y = block.pwconv2(F.gelu(block.pwconv1(block.norm(y))))
    return x + (block.gamma * y).transpose(1, 2)


def _parallel(block: ParallelBlock, x: Tensor, run: _Batch) -> Tensor:
    """`ParallelBlock.forward` with every conv continued from each stream's state."""
    total = None
    for res in block.blocks:
        y = x
        for c1, c2 in zip(res.convs1, res.convs2, strict=True):
            y = y + _conv(c2, F.silu(_conv(c1, F.silu(y), run)), run)
        total = y if total is None else total + y
    return total / len(block.blocks)
