"""The HiFi-GAN head as fused channels-last Triton convolutions (GPU decoding, issue 8).

:class:`~fishserve.models.firefly.layers.HiFiGANHead` in PyTorch is ~110 convolutions, each
wrapped in SiLU, padding and residual-add kernels, and cuDNN transposes every activation
between NCHW and NHWC around each ``conv1d`` (measured on an H200: about 40% of the head's
time, docs/benchmarks.md §2). :class:`TritonHead` computes the same function with one kernel
per convolution on ``(B, T, C)`` (channels-last) activations:

* ``out[t] = scale * (bias + sum_j W_j^T act(x[t - (K-1-j) * d]) + residual[t]) + accumulate[t]``
  where ``act`` is SiLU (or identity) applied as the input is loaded, taps ``j < K`` read the
  causal (left-zero-padded) window, the products run on tensor cores (``tl.dot``, float32
  accumulation), and residual add, ``tanh``, and the running mean of a
  :class:`~fishserve.models.firefly.layers.ParallelBlock` happen in the epilogue: each
  activation is read and written once per convolution. The epilogue can also write SiLU of
  the result (instead of it, or beside it), and :class:`TritonHead` uses that so that no
  convolution applies SiLU on load: there it was recomputed once per tap, which made a 7- or
  11-tap convolution of 16-128 channels 2.0-2.6x slower (H200, docs/benchmarks.md §6.19).
* a causal transposed convolution with stride ``s`` and kernel ``k <= m*s`` is the same kernel:
  output sample ``s*t + r`` is ``sum_i W[:, :, r + s*i]^T x[t - i]`` (``i < m``), i.e. an
  ``m``-tap causal convolution with ``s * C_out`` output channels whose ``(B, T, s*C_out)``
  result *is* the ``(B, s*T, C_out)`` upsampled activation, with no data movement.

Rounding differs from the PyTorch head only in where it happens (one rounding per fused
convolution instead of one per op); with float32 weights the products use IEEE float32
(no TF32), so the head matches to ~1e-6. Needs Triton and CUDA; with ``TRITON_INTERPRET=1`` it
also runs on the CPU (slowly), which is how the tests check it without a GPU.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .layers import CausalConv1d, CausalConvTranspose1d, HiFiGANHead, ParallelBlock

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the PyTorch head is used instead
    triton = None
    tl = None

__all__ = [
    "PackedConv",
    "TritonHead",
    "causal_conv_cl",
    "triton_head_available",
    "triton_interpreted",
]


def triton_interpreted() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``: tests)."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")


def triton_head_available() -> bool:
    """Whether Triton is importable (the kernels also need CUDA or ``TRITON_INTERPRET=1``)."""
    return triton is not None


if triton is not None:

    @triton.jit
    def _causal_conv_kernel(
        x_ptr,
        w_ptr,
        b_ptr,
        res_ptr,
        acc_ptr,
        out_ptr,
        act_ptr,
        valid_ptr,
        skip_ptr,
        in_len,
        out_len,
        res_len,
        rate,
        scale,
        C_IN: tl.constexpr,
        C_OUT: tl.constexpr,
        KSIZE: tl.constexpr,
        DIL: tl.constexpr,
        SILU_IN: tl.constexpr,
        HAS_RES: tl.constexpr,
        HAS_ACC: tl.constexpr,
        HAS_VALID: tl.constexpr,
        HAS_SKIP: tl.constexpr,
        TANH_OUT: tl.constexpr,
        SILU_OUT: tl.constexpr,
        ACT_OUT: tl.constexpr,
        IEEE: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        pid_t = tl.program_id(0)
        pid_n = tl.program_id(1)
        batch = tl.program_id(2).to(tl.int64)
        if HAS_SKIP:  # a constexpr branch: no load without a skip tensor
            tile_end = tl.minimum((pid_t + 1) * BLOCK_T, out_len)
            if tile_end <= tl.load(skip_ptr + batch):  # no row of this tile is wanted
                return
        offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        n_ok = offs_n < C_OUT
        x_base = x_ptr + batch * in_len * C_IN
        lo = 0  # first input row of this item: rows before it read as zeros (causal padding)
        if HAS_VALID:
            lo = tl.maximum(in_len - tl.load(valid_ptr + batch).to(tl.int32) * rate, 0)
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        steps: tl.constexpr = (C_IN + BLOCK_K - 1) // BLOCK_K  # channel slices per tap
        for it in range(KSIZE * steps):  # one flat loop over (tap, slice): software-pipelined
            j = it // steps
            kk = (it % steps) * BLOCK_K + offs_k
            t_src = offs_t + (in_len - out_len) - (KSIZE - 1 - j) * DIL
            t_ok = (t_src >= lo) & (t_src < in_len)
            k_ok = kk < C_IN
            xv = tl.load(
                x_base + t_src[:, None] * C_IN + kk[None, :],
                mask=t_ok[:, None] & k_ok[None, :],
                other=0.0,
            )
            if SILU_IN:
                xf = xv.to(tl.float32)
                xv = (xf * tl.sigmoid(xf)).to(xv.dtype)
            wv = tl.load(
                w_ptr + (j * C_IN + kk[:, None]) * C_OUT + offs_n[None, :],
                mask=k_ok[:, None] & n_ok[None, :],
                other=0.0,
            )
            if IEEE:
                acc += tl.dot(xv, wv, input_precision="ieee")
            else:
                acc += tl.dot(xv, wv)
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if TANH_OUT:
            acc = 2.0 * tl.sigmoid(2.0 * acc) - 1.0
        out_off = (batch * out_len + offs_t[:, None]) * C_OUT + offs_n[None, :]
        o_ok = (offs_t < out_len)[:, None] & n_ok[None, :]
        if HAS_RES:  # the residual is right-aligned with the output (its last out_len rows)
            res_t = batch * res_len + offs_t + (res_len - out_len)
            res_off = res_t[:, None] * C_OUT + offs_n[None, :]
            acc += tl.load(res_ptr + res_off, mask=o_ok, other=0.0).to(tl.float32)
        acc = acc * scale
        if HAS_ACC:
            acc += tl.load(acc_ptr + out_off, mask=o_ok, other=0.0).to(tl.float32)
        if ACT_OUT:  # SiLU of the result as a second output, for the next conv's input
            act = acc * tl.sigmoid(acc)
            tl.store(act_ptr + out_off, act.to(act_ptr.dtype.element_ty), mask=o_ok)
        if SILU_OUT:
            acc = acc * tl.sigmoid(acc)
        tl.store(out_ptr + out_off, acc.to(out_ptr.dtype.element_ty), mask=o_ok)


@dataclass(frozen=True)
class PackedConv:
    """A causal convolution's weights packed for the kernel.

    Attributes:
        weight: ``(K, C_in, C_out)`` contiguous, in the compute dtype (tap-major, so each tap
            is one ``C_in x C_out`` matrix of a ``tl.dot``).
        bias: ``(C_out,)``.
        dilation: spacing of the taps, in time steps.
        upsample: for a packed transposed convolution, its stride ``s`` (``C_out`` is then
            ``s`` times the real output channels); 1 otherwise.
    """

    weight: Tensor
    bias: Tensor
    dilation: int
    upsample: int = 1

    @property
    def kernel_size(self) -> int:
        """Number of taps K."""
        return self.weight.shape[0]

    @staticmethod
    def from_conv(conv: CausalConv1d) -> PackedConv:
        """Pack a stride-1 :class:`CausalConv1d`: ``[C_out, C_in, k]`` -> ``[k, C_in, C_out]``.

        Raises:
            ValueError: the conv is strided or grouped (the head has neither).
        """
        c = conv.conv
        if c.stride[0] != 1 or c.groups != 1:
            raise ValueError("only stride-1, ungrouped convolutions can be packed")
        weight = c.weight.detach().permute(2, 1, 0).contiguous()
        return PackedConv(weight, _bias(c.bias, c.out_channels, weight), c.dilation[0])

    @staticmethod
    def from_transposed(conv: CausalConvTranspose1d) -> PackedConv:
        """Pack a causal transposed conv (stride s, kernel k) as a ``ceil(k/s)``-tap conv.

        Packed ``w[j, c_in, r * C_out + c] = W[c_in, c, r + s * (m - 1 - j)]`` (zero past k), so
        output row t of the packed conv holds samples ``s*t .. s*t + s - 1`` (module docstring).
        """
        c = conv.conv
        s, k = c.stride[0], c.kernel_size[0]
        c_in, c_out = c.in_channels, c.out_channels
        taps = -(-k // s)
        weight = F.pad(c.weight.detach(), (0, taps * s - k))  # [C_in, C_out, m*s]
        weight = weight.view(c_in, c_out, taps, s).flip(2)  # [C_in, C_out, j, r]
        weight = weight.permute(2, 0, 3, 1).reshape(taps, c_in, s * c_out).contiguous()
        bias = _bias(c.bias, c_out, weight).repeat(s)
        return PackedConv(weight, bias, 1, s)


def _bias(bias: Tensor | None, channels: int, like: Tensor) -> Tensor:
    if bias is None:
        return torch.zeros(channels, dtype=like.dtype, device=like.device)
    return bias.detach().clone()


NUM_STAGES = 3  # software-pipelining depth: tiles of x and W in flight per program
# Shared memory per program, bytes: under the per-block opt-in limit of sm86/sm89 GPUs (99 KiB;
# sm80 has 163 KiB, sm90 227 KiB; CUDA C Programming Guide, "Compute Capabilities").
SMEM_LIMIT = 96 * 1024
MAX_ELEMENTS_PER_ITEM = 2**31  # offsets within one batch item are 32-bit
SKIP_CACHE_SIZE = 4096  # skip-row columns kept (`TritonHead.skip_rows`; ~1 KB each)


def _blocks(c_in: int, c_out: int, elem_bytes: int) -> tuple[int, int, int, int]:
    """(BLOCK_T, BLOCK_N, BLOCK_K, num_warps) for a conv shape (dot sides are at least 16).

    Measured on an H200 (bf16, docs/benchmarks.md §2): within a few % of the best of 10-20
    configurations per shape of the released head; 256 output channels per tile for layers
    that wide (the first stage's ResBlocks: 0.07 instead of 0.11 ms per call of 16 chunks in
    a sweep of 48 configurations, §6.11; conv_pre and the packed upsampling convs, 4% of the
    head's time, get them too, unmeasured alone). Tiles shrink (K, then N, then T) until
    `NUM_STAGES` stages of the x and W tiles fit in `SMEM_LIMIT` (float32 needs it).
    """
    block_n = max(16, min(256 if c_out >= 256 else 128, triton.next_power_of_2(c_out)))
    block_k = max(16, min(64, triton.next_power_of_2(c_in)))
    block_t = 128 if block_n <= 64 else 64
    while NUM_STAGES * (block_t + block_n) * block_k * elem_bytes > SMEM_LIMIT:
        if block_k > 16:
            block_k //= 2
        elif block_n > 16:
            block_n //= 2
        elif block_t > 16:
            block_t //= 2
        else:
            break
    return block_t, block_n, block_k, 4


def _check_io(x: Tensor, conv: PackedConv, out_len: int, extra: dict[str, Tensor | None]) -> None:
    """Raise ValueError unless every tensor is what the kernel assumes (module docstring)."""
    if x.ndim != 3 or x.shape[2] != conv.weight.shape[1] or not x.is_contiguous():
        raise ValueError(
            f"x: expected a contiguous (B, T, {conv.weight.shape[1]}) tensor, got "
            f"{tuple(x.shape)}{'' if x.is_contiguous() else ' (not contiguous)'}"
        )
    if x.dtype != conv.weight.dtype or x.device != conv.weight.device:
        raise ValueError(
            f"x is {x.dtype} on {x.device}, the weights {conv.weight.dtype} on "
            f"{conv.weight.device}: they must match"
        )
    if x.shape[1] * max(x.shape[2], conv.weight.shape[2]) >= MAX_ELEMENTS_PER_ITEM:
        raise ValueError(f"x: {x.shape[1]} steps per item is too long for 32-bit offsets")
    if not 0 <= out_len <= x.shape[1]:
        raise ValueError(f"out_len must lie in [0, {x.shape[1]}] (input steps), got {out_len}")
    want = (x.shape[0], out_len, conv.weight.shape[2])
    for name, t in extra.items():
        if t is None:
            continue
        # the residual may be longer than the output: its last out_len steps are added
        longer = name == "residual" and t.ndim == 3 and t.shape[1] >= out_len
        shape_ok = tuple(t.shape) == want or (longer and (t.shape[0], t.shape[2]) == want[::2])
        if not shape_ok or not t.is_contiguous() or t.dtype != x.dtype:
            raise ValueError(f"{name}: expected a contiguous {x.dtype} tensor of shape {want}")
        shares_x = t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        if t.device != x.device or (name != "residual" and shares_x):
            raise ValueError(f"{name}: must be on {x.device} and must not share memory with x")


def _check_act(
    act_out: Tensor | None, silu_out: bool, tanh_out: bool, others: tuple[Tensor | None, ...]
) -> None:
    """Raise ValueError for output options that contradict each other (`causal_conv_cl`)."""
    if silu_out and (act_out is not None or tanh_out):
        raise ValueError("silu_out excludes act_out and tanh_out")
    if act_out is None:
        return
    ptr = act_out.untyped_storage().data_ptr()
    if any(t is not None and t.untyped_storage().data_ptr() == ptr for t in others):
        raise ValueError("act_out must not share memory with out, accumulate or residual")


def causal_conv_cl(
    x: Tensor,
    conv: PackedConv,
    *,
    silu_in: bool,
    residual: Tensor | None = None,
    scale: float = 1.0,
    accumulate: Tensor | None = None,
    tanh_out: bool = False,
    silu_out: bool = False,
    act_out: Tensor | None = None,
    out: Tensor | None = None,
    out_len: int | None = None,
    valid: Tensor | None = None,
    rate: int = 1,
    skip: Tensor | None = None,
) -> Tensor:
    """One fused causal convolution on channels-last activations (module docstring).

    Args:
        x: ``(B, T, C_in)`` contiguous, in the weights' dtype.
        conv: packed weights (``C_out`` output channels, see :class:`PackedConv`).
        silu_in: apply SiLU to the input as it is loaded.
        residual: ``(B, T_r, C_out)`` with ``T_r >= T_out``, its last ``T_out`` steps added
            before ``scale``; accumulate: ``(B, T_out, C_out)``, added after it.
        scale: multiplies ``conv + residual``. tanh_out: ``tanh`` of ``conv`` (before residual).
        silu_out: write ``silu`` of the result (after ``accumulate``) instead of the result:
            for an output that the next conv reads only through SiLU, which then loads it
            with ``silu_in=False``. SiLU on load is recomputed for every tap, and costs
            2.0-2.6x the conv's time at 7-11 taps and <= 128 channels (H200,
            docs/benchmarks.md §6.19); applied once here it costs one pass of the epilogue.
        act_out: ``(B, T_out, C_out)``: also write ``silu`` of the result there (the result
            itself goes to `out`), for an output read both as it is (a residual) and
            through SiLU (the next conv's input).
        out: where to write (may be ``accumulate`` itself); a new tensor by default.
        out_len: ``T_out``, compute only the last ``T_out`` of the ``T`` output steps (default
            ``T``): output step ``t`` is the full convolution's step ``t + T - T_out``. This is
            how a chunk's decode skips what its new samples do not depend on.
        valid: ``(B,)`` int64, item b's signal is its last ``valid[b] * rate`` input steps (the
            data is right-aligned); steps before them read as zeros, exactly the causal zero
            padding of a signal that starts there. Default: every step is signal.
        rate: input steps per unit of ``valid``.
        skip: ``(B,)`` int64, item b needs only its output steps from ``skip[b]`` on: tiles of
            output steps lying wholly before it (all of them when ``skip[b] >= T_out``) are
            not computed, and their steps are left as they were (unwritten: garbage in a new
            tensor). Default: every step is computed.

    Returns:
        ``(B, T_out, C_out)`` in ``x.dtype``.

    Raises:
        ValueError: ``x`` is not a contiguous ``(B, T, C_in)`` tensor in the weights' dtype and
            device, an item is too long for 32-bit offsets (``T * C >= 2**31``), ``out_len`` is
            outside ``[0, T]``, ``residual``/``accumulate``/``out``/``act_out`` is not a
            contiguous tensor like ``x`` of the shapes above (``out``, ``accumulate`` and
            ``act_out`` must not be ``x``; ``act_out`` must not share memory with ``out``,
            ``accumulate`` or ``residual``), ``silu_out`` is asked with ``act_out`` or
            ``tanh_out``, or ``valid`` or ``skip`` is not a ``(B,)`` int64 tensor on ``x``'s
            device.
    """
    out_len = x.shape[1] if out_len is None else out_len
    tensors = {"residual": residual, "accumulate": accumulate, "out": out, "act_out": act_out}
    _check_io(x, conv, out_len, tensors)
    _check_act(act_out, silu_out, tanh_out, (residual, accumulate, out))
    for name, rows in (("valid", valid), ("skip", skip)):
        if rows is not None and (
            rows.shape != (x.shape[0],) or rows.dtype != torch.int64 or rows.device != x.device
        ):
            raise ValueError(f"{name}: expected a ({x.shape[0]},) int64 tensor on {x.device}")
    batch, seq_len, c_in = x.shape
    c_out = conv.weight.shape[2]
    if out is None:
        out = torch.empty((batch, out_len, c_out), dtype=x.dtype, device=x.device)
    block_t, block_n, block_k, warps = _blocks(c_in, c_out, x.element_size())
    if out_len == 0 or batch == 0:
        return out
    grid = (triton.cdiv(out_len, block_t), triton.cdiv(c_out, block_n), batch)
    _causal_conv_kernel[grid](
        x,
        conv.weight,
        conv.bias,
        residual if residual is not None else x,
        accumulate if accumulate is not None else x,
        out,
        act_out if act_out is not None else out,
        valid if valid is not None else x,
        skip if skip is not None else x,
        seq_len,
        out_len,
        residual.shape[1] if residual is not None else out_len,
        rate,
        scale,
        C_IN=c_in,
        C_OUT=c_out,
        KSIZE=conv.kernel_size,
        DIL=conv.dilation,
        SILU_IN=silu_in,
        HAS_RES=residual is not None,
        HAS_ACC=accumulate is not None,
        HAS_VALID=valid is not None,
        HAS_SKIP=skip is not None,
        TANH_OUT=tanh_out,
        SILU_OUT=silu_out,
        ACT_OUT=act_out is not None,
        IEEE=x.dtype == torch.float32,
        BLOCK_T=block_t,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=warps,
        num_stages=NUM_STAGES,
    )
    return out


@dataclass(frozen=True)
class _Stage:
    up: PackedConv
    resblocks: tuple[tuple[tuple[PackedConv, PackedConv], ...], ...]  # [block][dilation](c1, c2)


class TritonHead:
    """A :class:`HiFiGANHead`'s weights packed for :func:`causal_conv_cl`; same function.

    Args:
        head: the PyTorch head (weights already folded, in the compute dtype, on the device the
            kernels run on). Its weights are copied once; later changes to it are not seen.

    Raises:
        RuntimeError: Triton is not installed.
        ValueError: the head is not on a CUDA device (and ``TRITON_INTERPRET=1`` is not set).
    """

    def __init__(self, head: HiFiGANHead) -> None:
        if triton is None:
            raise RuntimeError("the Triton head needs Triton (pip install triton)")
        device = head.conv_pre.conv.weight.device
        if device.type != "cuda" and not triton_interpreted():
            raise ValueError(f"the Triton head runs on CUDA devices, not {device}")
        self.pre = PackedConv.from_conv(head.conv_pre)
        self.stages = tuple(
            _Stage(PackedConv.from_transposed(up), _pack_block(block))
            for up, block in zip(head.ups, head.resblocks, strict=True)
        )
        self.post = PackedConv.from_conv(head.conv_post)
        self._skip_cache: dict[tuple[int, int, int], np.ndarray] = {}

    def __call__(self, z: Tensor) -> Tensor:
        """``(B, num_mels, T)`` latent -> ``(B, 1, T * hop)`` waveform (as ``HiFiGANHead``).

        The output is in the weights' dtype; values in (-1, 1).
        """
        if z.shape[0] == 0 or z.shape[2] == 0:  # nothing to launch
            hop = math.prod(stage.up.upsample for stage in self.stages)
            return z.new_zeros((z.shape[0], 1, z.shape[2] * hop))
        wav = self._run(z.transpose(1, 2).contiguous(), _FullCalls())
        return wav.view(wav.shape[0], 1, wav.shape[1])  # (B, T, 1) and (B, 1, T) share memory

    def _run(self, x: Tensor, calls: _FullCalls | _TailCalls) -> Tensor:
        """The head on ``(B, T, num_mels)`` channels-last `x` -> ``(B, T_out, 1)``.

        Every activation that the next convolution reads through SiLU is written already
        passed through it by the convolution that produces it (``silu_out``, or ``act_out``
        beside the plain result where that is also a residual), so no convolution applies
        SiLU to its input: on load that SiLU was recomputed once per tap.
        """
        x = calls.conv(x, self.pre, silu_in=False, silu_out=True)
        for stage in self.stages:
            raw, act = _conv_act(calls, x, stage.up)
            calls.rate *= stage.up.upsample
            shape = (x.shape[0], raw.shape[1] * stage.up.upsample, -1)
            x = _parallel_block(raw.view(shape), act.view(shape), stage, calls)
        return calls.conv(x, self.post, silu_in=False, tanh_out=True)

    @property
    def hop(self) -> int:
        """Output samples per input step (the product of the upsampling rates)."""
        return math.prod(stage.up.upsample for stage in self.stages)

    def tail_lengths(self, out_samples: int) -> list[int]:
        """Steps each layer must produce for the last `out_samples` output samples.

        Walking back from the output, each convolution needs its own left reach
        (``(K-1) * dilation`` steps) more input than output, a ParallelBlock the reach of its
        longest ResBlock, and an upsampling ``s`` needs ``ceil(n / s)`` rows plus its taps.

        Returns:
            ``[pre_in, pre_out, block_0_in, block_0_out, ..., block_n_out]``: input steps of
            ``conv_pre`` (latent steps), its output (= the first upsampling's input rows), then
            per stage the ParallelBlock's input and output steps; ``conv_post`` reads
            ``block_n_out`` steps and writes ``out_samples``.
        """
        need = out_samples + _reach(self.post)
        blocks: list[int] = []
        for stage in reversed(self.stages):
            blocks = [need + _block_reach(stage.resblocks), need, *blocks]
            need = -(-blocks[0] // stage.up.upsample) + _reach(stage.up)
        return [need + _reach(self.pre), need, *blocks]

    def tail_plan(self, out_samples: int, steps: int) -> list[int]:
        """Output steps of every convolution of :meth:`decode_tail`, in call order.

        Args:
            out_samples: waveform samples wanted (the call's last ones).
            steps: latent steps of the call's input.

        Returns:
            One length per convolution: ``conv_pre``, then per stage the upsampling and, per
            ResBlock and dilation, ``c1`` and ``c2``; ``conv_post`` (= `out_samples`) last.
        """
        return self._plan(out_samples, steps)[0]

    def _plan(self, out_samples: int, steps: int) -> tuple[list[int], list[int]]:
        """(`tail_plan`, each stage's ParallelBlock output steps)."""
        lengths = self.tail_lengths(out_samples)
        plan, blocks = [min(lengths[1], steps)], []
        have = plan[0]
        for i, stage in enumerate(self.stages):
            rows = min(-(-lengths[2 + 2 * i] // stage.up.upsample), have)
            available = rows * stage.up.upsample
            have = min(lengths[3 + 2 * i], available)
            plan.append(rows)
            plan += _block_plan(stage.resblocks, available, have)
            blocks.append(have)
        plan.append(out_samples)
        return plan, blocks

    def skip_rows(self, out_samples: int, steps: int, wanted: Sequence[int]) -> np.ndarray:
        """Per convolution and item, the first output step the item needs (``skip``).

        An item that wants only its last ``wanted[b] <= out_samples`` samples needs, at each
        convolution, only the last steps of :meth:`tail_plan` for ``wanted[b]`` (the same
        reach argument as for the call); an item wanting 0 samples (a padded batch row) needs
        none.

        Columns are cached per (`out_samples`, `steps`, wanted samples): a server's calls
        repeat a few dozen shapes, and planning each item anew cost ~1 ms of host time (and
        of the GIL) per call of 16 items.

        Returns:
            int64 ``(num_convs, B)``: for :func:`causal_conv_cl`'s ``skip`` of each convolution.
        """
        columns = [self._skip_column(out_samples, steps, n) for n in wanted]
        return np.stack(columns, axis=1)

    def _skip_column(self, out_samples: int, steps: int, wanted: int) -> np.ndarray:
        key = (out_samples, steps, wanted)
        column = self._skip_cache.get(key)
        if column is None:
            call = np.asarray(self.tail_plan(out_samples, steps), dtype=np.int64)
            need = self.tail_plan(wanted, steps) if wanted > 0 else np.zeros_like(call)
            column = call - np.minimum(need, call)
            if len(self._skip_cache) >= SKIP_CACHE_SIZE:
                self._skip_cache.clear()
            self._skip_cache[key] = column
        return column

    def decode_tail(
        self, x: Tensor, valid: Tensor, out_samples: int, skip: Tensor | None = None
    ) -> Tensor:
        """The last `out_samples` waveform samples of right-aligned latents, skipping the work
        they do not depend on (what :meth:`__call__` computes, trimmed at every layer).

        Args:
            x: ``(B, T, num_mels)`` channels-last latent, contiguous, in the weights' dtype;
                item b's latent is its last ``valid[b]`` steps (steps before them are treated
                as zeros, i.e. item b's signal starts there, as in a one-shot decode).
            valid: ``(B,)`` int64 latent steps of each item, ``<= T``.
            out_samples: samples wanted, at most ``T * hop``.
            skip: int64 ``(num_convs, B)`` from :meth:`skip_rows` for this same
                `out_samples` and ``T`` (on the device; only its shape can be checked), so that
                each item is computed only as far back as its own wanted samples reach; the
                samples before those are then garbage. Default: every item gets all
                `out_samples`.

        Returns:
            ``(B, out_samples)`` in the weights' dtype: for items with ``valid[b] * hop >=
            out_samples``, equal (up to rounding) to the last `out_samples` samples of
            ``self(z)`` on the item's latent alone. Work per layer is the samples wanted plus the
            layers' left reach, not the whole ``T``.

        Raises:
            ValueError: see :func:`causal_conv_cl`; `out_samples` outside ``[0, T * hop]``.
        """
        if not 0 <= out_samples <= x.shape[1] * self.hop:
            raise ValueError(f"out_samples must lie in [0, {x.shape[1] * self.hop}]")
        plan, blocks = self._plan(out_samples, x.shape[1])
        if skip is not None and tuple(skip.shape) != (len(plan), x.shape[0]):
            raise ValueError(
                f"skip: expected ({len(plan)}, {x.shape[0]}) rows, got {tuple(skip.shape)}"
            )
        wav = self._run(x, _TailCalls(plan, blocks, skip, valid))
        return wav.view(wav.shape[0], wav.shape[1])


class _FullCalls:
    """The convolutions of a whole decode: every output step of every convolution."""

    rate = 1

    def peek(self, x: Tensor) -> int:
        """Output steps of the next convolution, whose input is `x`."""
        return x.shape[1]

    def block_len(self, x: Tensor) -> int:
        """Output steps of the ParallelBlock whose input is `x`."""
        return x.shape[1]

    def conv(self, x: Tensor, conv: PackedConv, **kw: Any) -> Tensor:
        """`causal_conv_cl` on every step."""
        return causal_conv_cl(x, conv, **kw)


class _TailCalls:
    """The convolutions of one trimmed decode, each with its planned length and skip rows."""

    def __init__(
        self, plan: list[int], blocks: list[int], skip: Tensor | None, valid: Tensor | None
    ) -> None:
        self.plan, self.skip, self.valid = plan, skip, valid
        self.blocks = iter(blocks)  # each ParallelBlock's output steps, in order
        self.index, self.rate = 0, 1

    def peek(self, x: Tensor | None = None) -> int:
        """Output steps of the next convolution (as planned, whatever its input)."""
        return self.plan[self.index]

    def block_len(self, x: Tensor) -> int:
        """Output steps of the next ParallelBlock (as planned)."""
        return next(self.blocks)

    def conv(self, x: Tensor, conv: PackedConv, **kw: Any) -> Tensor:
        """`causal_conv_cl` with the next planned length, skip rows, `valid` and rate."""
        i = self.index
        self.index += 1
        skip = None if self.skip is None else self.skip[i]
        return causal_conv_cl(
            x, conv, out_len=self.plan[i], valid=self.valid, rate=self.rate, skip=skip, **kw
        )


def _reach(conv: PackedConv) -> int:
    """Input steps before an output step that the conv reads: ``(K - 1) * dilation``."""
    return (conv.kernel_size - 1) * conv.dilation


def _resblock_reach(pairs: tuple[tuple[PackedConv, PackedConv], ...]) -> int:
    """Left reach of a ResBlock: both convs of every dilation."""
    return sum(_reach(c1) + _reach(c2) for c1, c2 in pairs)


def _block_reach(resblocks: tuple[tuple[tuple[PackedConv, PackedConv], ...], ...]) -> int:
    """Left reach of a ParallelBlock: that of its longest ResBlock."""
    return max(_resblock_reach(pairs) for pairs in resblocks)


def _pack_block(block: ParallelBlock) -> tuple[tuple[tuple[PackedConv, PackedConv], ...], ...]:
    return tuple(
        tuple(
            (PackedConv.from_conv(c1), PackedConv.from_conv(c2))
            for c1, c2 in zip(rb.convs1, rb.convs2, strict=True)
        )
        for rb in block.blocks
    )


def _block_plan(
    resblocks: tuple[tuple[tuple[PackedConv, PackedConv], ...], ...], steps: int, out_len: int
) -> list[int]:
    """Output steps of a ParallelBlock's convolutions (call order) for its last `out_len` of
    `steps` steps: each conv produces just what the rest of its ResBlock reads."""
    plan: list[int] = []
    for pairs in resblocks:
        have, left = steps, _resblock_reach(pairs)  # reach still ahead
        for i, (c1, c2) in enumerate(pairs):
            left -= _reach(c1) + _reach(c2)
            y_len = min(out_len + left + _reach(c2), have)
            have = out_len if i == len(pairs) - 1 else min(out_len + left, y_len)
            plan += [y_len, have]
    return plan


def _conv_act(
    calls: _FullCalls | _TailCalls, x: Tensor, conv: PackedConv, **kw: Any
) -> tuple[Tensor, Tensor]:
    """The next convolution of `calls` on `x` (no SiLU on load) -> (result, SiLU of it), both
    ``(B, T_out, C_out)`` with ``T_out`` the convolution's output steps (`calls.peek`)."""
    act = x.new_empty((x.shape[0], calls.peek(x), conv.weight.shape[2]))
    return calls.conv(x, conv, silu_in=False, act_out=act, **kw), act


def _parallel_block(
    x: Tensor, x_act: Tensor, stage: _Stage, calls: _FullCalls | _TailCalls
) -> Tensor:
    """SiLU of the mean over ResBlocks of ``h = h + c2(silu(c1(silu(h))))`` per dilation, all
    from ``x`` (`x_act` is ``silu(x)``, the same shape).

    Each ``c1`` writes ``silu`` of its output (``c2`` reads nothing else), each ``c2`` but a
    ResBlock's last writes ``h`` (the next residual) and ``silu(h)`` (the next ``c1``'s
    input). The last conv of each ResBlock adds ``(h + c2(...)) / n`` into the running mean in
    its epilogue, so the mean costs no extra pass over memory, and the very last one applies
    the SiLU that the next convolution (an upsampling or ``conv_post``) reads through. With
    `calls` a trimmed decode, each conv produces only its planned steps (`_block_plan`).
    """
    resblocks = stage.resblocks
    out_len = calls.block_len(x)
    total: Tensor | None = None
    scale = 1.0 / len(resblocks)
    fused = bool(resblocks[-1])  # the last ResBlock has convs: its last one applies the SiLU
    for r, pairs in enumerate(resblocks):
        if not pairs:  # a ResBlock without dilations is the identity
            tail = x[:, x.shape[1] - out_len :]
            total = tail * scale if total is None else total + tail * scale
            continue
        h, h_act = x, x_act
        for i, (c1, c2) in enumerate(pairs):
            y_act = calls.conv(h_act, c1, silu_in=False, silu_out=True)
            if i < len(pairs) - 1:
                h, h_act = _conv_act(calls, y_act, c2, residual=h)
                continue
            last = r == len(resblocks) - 1  # then `fused`: this ResBlock has convs
            total = calls.conv(
                y_act,
                c2,
                silu_in=False,
                residual=h,
                scale=scale,
                accumulate=total,
                out=total,
                silu_out=last,
            )
    assert total is not None
    return total if fused else F.silu(total)
