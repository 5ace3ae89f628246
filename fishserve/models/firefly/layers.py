"""Building blocks of the Firefly decoder/encoder (spec §4.3).

Tensors are channels-first ``(B, C, T)``; every convolution is causal in time. The HiFi-GAN head
also accepts ``(B, C, 1, T)`` tensors, for which its convolutions run as ``conv2d`` with a height
of one: in ``torch.channels_last`` memory format that keeps cuDNN in its native NHWC layout on
the GPU, instead of transposing every activation in and out of each ``conv1d`` (measured on an
H200 to be ~40% of the decoder's time; docs/benchmarks.md §2). Both layouts compute the same
function. Weight norm is
not a runtime parametrization here: checkpoints are folded into plain ``weight`` tensors at load
time (see :mod:`.loading`); convs that carry weight norm in the checkpoint are flagged with
``weight_norm=True`` so the loader knows which keys to fold.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import BackboneConfig, HeadConfig

__all__ = [
    "CausalConv1d",
    "CausalConvTranspose1d",
    "ConvNeXtBlock",
    "ConvNeXtEncoder",
    "HiFiGANHead",
    "LayerNormChannelsFirst",
    "ParallelBlock",
    "ResBlock",
]

LN_EPS = 1e-6  # spec §4.3: both LayerNorm flavours use eps 1e-6


class CausalConv1d(nn.Module):
    """Causal ``Conv1d`` ("FishConvNet", spec §4.3); parameters live in ``self.conv``.

    With effective kernel ``K = (k-1)*dilation + 1`` the input is left-padded with ``K - stride``
    zeros and right-padded with the fewest zeros that complete the last window, so a stride-1 conv
    keeps the length and a stride-s conv gives ``ceil(T / s)`` frames.

    Shapes: ``(B, C_in, T) -> (B, C_out, T_out)``, or ``(B, C_in, 1, T) -> (B, C_out, 1, T_out)``
    (run as ``conv2d``; the memory format of the input is kept).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        weight_norm: bool = False,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv1d(
            in_channels, out_channels, kernel_size, stride=stride, dilation=dilation, groups=groups
        )
        self.stride = stride
        self.effective_kernel = (kernel_size - 1) * dilation + 1
        self.weight_norm = weight_norm

    def forward(self, x: Tensor) -> Tensor:
        """Apply the conv with causal padding (see class docstring)."""
        k, s = self.effective_kernel, self.stride
        pad_left = k - s
        length = x.shape[-1]
        n_frames = math.ceil((length - k + pad_left) / s + 1)
        extra = (n_frames - 1) * s + k - pad_left - length
        x = F.pad(x, (pad_left, extra))
        if x.ndim == 4:
            conv = self.conv
            return F.conv2d(
                x,
                conv.weight[:, :, None],
                conv.bias,
                stride=(1, s),
                dilation=(1, conv.dilation[0]),
                groups=conv.groups,
            )
        return self.conv(x)


class CausalConvTranspose1d(nn.Module):
    """Causal ``ConvTranspose1d`` ("FishTransConvNet", spec §4.3): drop the last ``k - s`` samples.

    Shapes: ``(B, C_in, T) -> (B, C_out, T * stride)`` (or with a height-1 axis, see
    :class:`CausalConv1d`). The weight layout is ``[C_in, C_out, k]``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int,
        weight_norm: bool = False,
    ) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.trim = kernel_size - stride
        self.weight_norm = weight_norm

    def forward(self, x: Tensor) -> Tensor:
        """Upsample by ``stride`` keeping causality."""
        if x.ndim == 4:
            conv = self.conv
            weight, stride = conv.weight[:, :, None], (1, conv.stride[0])
            y = F.conv_transpose2d(x, weight, conv.bias, stride=stride)
        else:
            y = self.conv(x)
        return y[..., : y.shape[-1] - self.trim] if self.trim > 0 else y


class LayerNormChannelsFirst(nn.Module):
    """LayerNorm over the channel axis of ``(B, C, T)`` (eps 1e-6, affine; spec §4.3).

    Statistics are computed in float32 whatever the input dtype; output has the input dtype.
    """

    def __init__(self, channels: int, eps: float = LN_EPS) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """Normalize each time step over channels."""
        xf = x.float()
        mean = xf.mean(1, keepdim=True)
        var = (xf - mean).pow(2).mean(1, keepdim=True)
        xf = (xf - mean) / torch.sqrt(var + self.eps)
        y = self.weight.float()[:, None] * xf + self.bias.float()[:, None]
        return y.to(x.dtype)


class ConvNeXtBlock(nn.Module):
    """ConvNeXt block (spec §4.3): ``x + gamma * pw2(gelu(pw1(LN(dwconv(x)))))``.

    ``dwconv`` is a depthwise causal conv; LN (eps 1e-6) and the two Linears act on the channel
    axis. Shapes: ``(B, C, T) -> (B, C, T)``.
    """

    def __init__(self, dim: int, kernel_size: int = 7, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, kernel_size, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=LN_EPS)
        self.pwconv1 = nn.Linear(dim, mlp_ratio * dim)
        self.pwconv2 = nn.Linear(mlp_ratio * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """Residual ConvNeXt update."""
        y = self.dwconv(x).transpose(1, 2)
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).transpose(1, 2)


class ConvNeXtEncoder(nn.Module):
    """Mel -> feature encoder (``backbone``, spec §4.6 step 3). Encode path only.

    Stem: causal conv ``n_mels -> dims[0]`` + channels-first LN; stage i > 0 starts with LN +
    1x1 conv ``dims[i-1] -> dims[i]``; each stage has ``depths[i]`` ConvNeXt blocks; final LN.
    Shapes: ``(B, n_mels, T) -> (B, dims[-1], T)``.
    """

    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        dims, k = cfg.dims, cfg.kernel_size
        stem = nn.Sequential(
            CausalConv1d(cfg.input_channels, dims[0], k), LayerNormChannelsFirst(dims[0])
        )
        mids = [
            nn.Sequential(LayerNormChannelsFirst(dims[i - 1]), nn.Conv1d(dims[i - 1], dims[i], 1))
            for i in range(1, len(dims))
        ]
        self.downsample_layers = nn.ModuleList([stem, *mids])
        self.stages = nn.ModuleList(
            nn.Sequential(*(ConvNeXtBlock(d, k) for _ in range(n)))
            for d, n in zip(dims, cfg.depths, strict=True)
        )
        self.norm = LayerNormChannelsFirst(dims[-1])

    def forward(self, x: Tensor) -> Tensor:
        """Encode a (masked) log-mel ``(B, n_mels, T)`` into ``(B, dims[-1], T)`` features."""
        for down, stage in zip(self.downsample_layers, self.stages, strict=True):
            x = stage(down(x))
        return self.norm(x)


class ResBlock(nn.Module):
    """HiFi-GAN ResBlock1 with causal convs (spec §4.3).

    For each dilation d: ``x = x + conv2_d(silu(conv1_d(silu(x))))``; **both** convs use
    dilation d. Shapes: ``(B, C, T) -> (B, C, T)``.
    """

    def __init__(self, channels: int, kernel_size: int, dilations: Sequence[int]) -> None:
        super().__init__()

        def conv(d: int) -> CausalConv1d:
            return CausalConv1d(channels, channels, kernel_size, dilation=d, weight_norm=True)

        self.convs1 = nn.ModuleList(conv(d) for d in dilations)
        self.convs2 = nn.ModuleList(conv(d) for d in dilations)

    def forward(self, x: Tensor) -> Tensor:
        """Apply the dilated residual stack."""
        for c1, c2 in zip(self.convs1, self.convs2, strict=True):
            x = x + c2(F.silu(c1(F.silu(x))))
        return x


class ParallelBlock(nn.Module):
    """Mean of several :class:`ResBlock` outputs on the same input (spec §4.3).

    Shapes: ``(B, C, T) -> (B, C, T)`` (or ``(B, C, 1, T)``).
    """

    def __init__(
        self,
        channels: int,
        kernel_sizes: Sequence[int],
        dilation_sizes: Sequence[Sequence[int]],
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            ResBlock(channels, k, d) for k, d in zip(kernel_sizes, dilation_sizes, strict=True)
        )

    def forward(self, x: Tensor) -> Tensor:
        """Average the parallel residual blocks (a running sum keeps the input's memory format)."""
        total = self.blocks[0](x)
        for block in self.blocks[1:]:
            total = total + block(x)
        return total / len(self.blocks)


class HiFiGANHead(nn.Module):
    """HiFi-GAN generator (``head``, spec §4.3). Decode path only.

    ``conv_pre`` -> per stage ``SiLU -> causal transposed conv (c -> c/2) -> ParallelBlock`` ->
    ``SiLU -> conv_post (-> 1 channel) -> tanh``. All convs are weight-normed in checkpoints.
    Shapes: ``(B, num_mels, T) -> (B, 1, T * prod(upsample_rates))``, values in (-1, 1); a
    ``(B, num_mels, 1, T)`` input gives ``(B, 1, 1, T * prod(upsample_rates))``.
    """

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        c0 = cfg.upsample_initial_channel
        self.conv_pre = CausalConv1d(cfg.num_mels, c0, cfg.pre_conv_kernel_size, weight_norm=True)
        ups, blocks = [], []
        for i, (rate, k) in enumerate(
            zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, strict=True)
        ):
            c_in, c_out = c0 >> i, c0 >> (i + 1)
            ups.append(CausalConvTranspose1d(c_in, c_out, k, stride=rate, weight_norm=True))
            blocks.append(
                ParallelBlock(c_out, cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes)
            )
        self.ups = nn.ModuleList(ups)
        self.resblocks = nn.ModuleList(blocks)
        c_last = c0 >> len(ups)
        self.conv_post = CausalConv1d(c_last, 1, cfg.post_conv_kernel_size, weight_norm=True)

    def forward(self, x: Tensor) -> Tensor:
        """Vocode ``(B, num_mels, T)`` features to a ``(B, 1, T * hop)`` waveform."""
        x = self.conv_pre(x)
        for up, block in zip(self.ups, self.resblocks, strict=True):
            x = block(up(F.silu(x)))
        return torch.tanh(self.conv_post(F.silu(x)))
