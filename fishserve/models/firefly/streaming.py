"""Stateful streaming decode: each causal layer keeps its last inputs between chunks.

Every decoder op is causal (spec §4.3): a causal conv's output at time t reads its input at
``t - (K - 1) .. t`` (effective kernel K, stride 1), a causal transposed conv's output block of
input i reads inputs ``i - ceil((k - s) / s) .. i``, and everything else (FSQ lookup, LayerNorm,
the pointwise layers, SiLU, GELU, tanh) acts on one time step. So a stream decoded chunk by
chunk gives exactly the one-shot waveform when every such layer is fed, before the chunk's
inputs, the inputs it saw last (zeros before the stream's first frame, as the one-shot causal
padding). Unlike decoding each chunk with left context frames
(`fishserve.audio.streaming.StreamingDecoder`), no frame is decoded twice.

This is the PyTorch reference of that scheme (any device, batch of streams in lockstep): the
oracle for faster kernels. Memory per stream: each layer's tail of ``K - 1`` (or
``ceil((k - s) / s)``) input steps, a few hundred KiB for the released decoder in fp32.
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

__all__ = ["StreamState", "decode_chunk"]


@dataclass
class StreamState:
    """The inputs each causal layer of one decoder saw last, for a batch of streams.

    Attributes:
        tails: per layer (keyed by ``id(module)``), its last input steps ``(B, C, n)`` in the
            decoder's dtype; a layer not yet seen starts from zeros.
        frames: code frames decoded so far (per stream, all streams in lockstep).
    """

    tails: dict[int, Tensor] = field(default_factory=dict)
    frames: int = 0


@torch.inference_mode()
def decode_chunk(decoder: FireflyGenerator, codes: Tensor, state: StreamState) -> Tensor:
    """Decode the next `codes` of each stream, continuing from `state` (updated in place).

    Args:
        codes: ``(B, G, n)`` integer codes, ``n >= 1`` frames (ids wrap as in
            `FireflyGenerator.decode`); B the same for every call on one `state`.

    Returns:
        ``(B, n * frame_samples)`` float32 waveform at ``config.sample_rate`` Hz: the samples
        of these frames in the one-shot decode of the whole stream so far.

    Raises:
        ValueError: bad codes (as `FireflyGenerator.decode_latent`).
    """
    codes = decoder._check_codes(codes)
    z = decoder.quantizer.decode_codes(codes).to(decoder.dtype)
    for stage in decoder.quantizer.upsample:
        up, block = stage
        z = _convnext(block, _transposed(up, z, state), state)
    head = decoder.head
    x = _conv(head.conv_pre, z, state)
    for up, block in zip(head.ups, head.resblocks, strict=True):
        x = _parallel(block, _transposed(up, F.silu(x), state), state)
    wav = torch.tanh(_conv(head.conv_post, F.silu(x), state))
    state.frames += codes.shape[-1]
    return wav[:, 0].float()


def _with_tail(module: nn.Module, x: Tensor, keep: int, state: StreamState) -> Tensor:
    """`x` after the module's last `keep` input steps (zeros at first); stores the new tail."""
    key = id(module)
    tail = state.tails.get(key)
    if tail is None:
        tail = x.new_zeros(x.shape[0], x.shape[1], keep)
    full = torch.cat([tail, x], dim=-1)
    state.tails[key] = full[..., full.shape[-1] - keep :]
    return full


def _conv(module: CausalConv1d, x: Tensor, state: StreamState) -> Tensor:
    """A stride-1 causal conv over `x` ``(B, C, n)`` -> ``(B, C_out, n)``."""
    if module.stride != 1:
        raise ValueError("stateful decoding needs stride-1 causal convs")
    full = _with_tail(module, x, module.effective_kernel - 1, state)
    return module.conv(full)  # no padding: the tail is the causal left context


def _transposed(module: CausalConvTranspose1d, x: Tensor, state: StreamState) -> Tensor:
    """A causal transposed conv over `x` ``(B, C, n)`` -> ``(B, C_out, n * stride)``."""
    stride = module.conv.stride[0]
    keep = math.ceil(module.trim / stride)
    y = module.conv(_with_tail(module, x, keep, state))
    return y[..., keep * stride : (keep + x.shape[-1]) * stride]


def _convnext(block: ConvNeXtBlock, x: Tensor, state: StreamState) -> Tensor:
    """`ConvNeXtBlock.forward` with its depthwise conv continued from `state`."""
    y = _conv(block.dwconv, x, state).transpose(1, 2)
    y = block.pwconv2(F.gelu(block.pwconv1(block.norm(y))))
    return x + (block.gamma * y).transpose(1, 2)


def _parallel(block: ParallelBlock, x: Tensor, state: StreamState) -> Tensor:
    """`ParallelBlock.forward` with every conv continued from `state`."""
    total = None
    for res in block.blocks:
        y = x
        for c1, c2 in zip(res.convs1, res.convs2, strict=True):
            y = y + _conv(c2, F.silu(_conv(c1, F.silu(y), state)), state)
        total = y if total is None else total + y
    return total / len(block.blocks)
