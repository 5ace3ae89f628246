"""Firefly GAN VQ generator: codes <-> 44.1 kHz waveform (spec §4.5, §4.6).

State-dict keys equal the official checkpoint keys, except that weight-normed convs (all of
``head``) hold one folded ``...conv.weight`` instead of ``parametrizations.weight.original0/1``;
see :func:`fishserve.models.firefly.loading.expected_checkpoint_shapes` for the mapping.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from .config import FireflyConfig
from .fsq import DownsampleFSQ
from .layers import ConvNeXtEncoder, HiFiGANHead
from .spectrogram import LogMelSpectrogram

if TYPE_CHECKING:
    from .triton_head import TritonHead

__all__ = ["EncodeOutput", "FireflyGenerator", "sequence_mask"]


def sequence_mask(lengths: Tensor, max_length: int) -> Tensor:
    """``(B,)`` lengths -> ``(B, max_length)`` bool mask, True where ``t < length``."""
    steps = torch.arange(max_length, device=lengths.device)
    return steps[None, :] < lengths[:, None]


@dataclass
class EncodeOutput:
    """Every stage of :meth:`FireflyGenerator.encode_intermediates` (T = N // hop mel frames).

    Attributes:
        log_mel: ``(B, n_mels, T)`` float32, frames past ``mel_lengths`` zeroed.
        mel_lengths: ``(B,)`` int64, ``audio_lengths // hop``.
        backbone_features: ``(B, C, T)`` ConvNeXt output times the frame mask (model dtype).
        quantizer_downsampled: ``(B, C, L)`` after the downsample stack, ``L = ceil(T / 4)``.
        fsq_bounded_pre_round: ``(B, G, L, D)`` float32 value that gets rounded.
        codes: ``(B, G, L)`` int64 codes in ``[0, prod(levels))``.
        feature_lengths: ``(B,)`` int64, ``mel_lengths // 4`` (may be ``L - 1``; spec gotcha 13).
    """

    log_mel: Tensor
    mel_lengths: Tensor
    backbone_features: Tensor
    quantizer_downsampled: Tensor
    fsq_bounded_pre_round: Tensor
    codes: Tensor
    feature_lengths: Tensor


class FireflyGenerator(nn.Module):
    """Firefly VQ-GAN generator (``FireflyArchitecture`` of the reference, inference only).

    Submodules (checkpoint prefixes): ``backbone`` (encoder), ``quantizer``, ``head`` (vocoder);
    ``spec_transform`` is parameter-free. Works with any float parameter dtype on any device; the
    log-mel and FSQ arithmetic stays in float32.
    """

    def __init__(self, config: FireflyConfig | None = None) -> None:
        super().__init__()
        self.config = config or FireflyConfig.released()
        self.spec_transform = LogMelSpectrogram(self.config.spec_transform)
        self.backbone = ConvNeXtEncoder(self.config.backbone)
        self.head = HiFiGANHead(self.config.head)
        self.quantizer = DownsampleFSQ(self.config.quantizer)

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the convolution weights (the compute dtype of the conv stacks)."""
        return self.head.conv_pre.conv.weight.dtype

    @property
    def device(self) -> torch.device:
        """Device of the parameters."""
        return self.head.conv_pre.conv.weight.device

    # ------------------------------------------------------------------ decode path
    def decode_latent(self, codes: Tensor) -> Tensor:
        """FSQ lookup + project_out + upsample stack, before masking (spec §4.5 steps 1-2).

        Args:
            codes: ``(B, G, L)`` integer codes (any int dtype; ids wrap modulo the FSQ digits).

        Returns:
            ``(B, input_dim, L * 4)`` latent in the model dtype.
        """
        codes = self._check_codes(codes)
        z = self.quantizer.decode_codes(codes).to(self.dtype)
        return self.quantizer.upsample_latent(z)

    @torch.inference_mode()
    def decode(self, codes: Tensor, feature_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Codes -> waveform (spec §4.5).

        Args:
            codes: ``(B, G, L)`` integer codes, G = ``config.n_groups``.
            feature_lengths: ``(B,)`` valid code frames per item, each in ``[0, L]``.

        Returns:
            ``(waveform, audio_lengths)``: ``(B, 1, L * frame_samples)`` float32 in (-1, 1) at
            ``config.sample_rate`` Hz, samples at or past ``audio_lengths`` exactly 0; and ``(B,)``
            int64 ``feature_lengths * frame_samples``.

        Raises:
            ValueError: wrong shapes/dtypes or lengths outside ``[0, L]``.
        """
        codes = self._check_codes(codes)
        lengths = self._check_lengths(feature_lengths, codes.shape[0], codes.shape[2], "codes")
        factor, hop = self.config.downsample_factor, self.config.hop_length
        if codes.shape[-1] == 0:
            return torch.zeros(codes.shape[0], 1, 0, device=self.device), lengths * factor * hop
        return self.decode_unchecked(codes, lengths), lengths * factor * hop

    def decode_unchecked(
        self,
        codes: Tensor,
        lengths: Tensor,
        channels_last: bool = False,
        head: Callable[[Tensor], Tensor] | None = None,
    ) -> Tensor:
        """The body of :meth:`decode` with no validation and no host synchronisation.

        Pure tensor code with static shapes, so it can be compiled and captured in a CUDA graph
        (:class:`fishserve.audio.decoder_runner.DecoderRunner`).

        Args:
            codes: ``(B, G, L)`` int64 codes on the decoder's device, ``L >= 1``.
            lengths: ``(B,)`` int64 valid frames per item, each in ``[0, L]`` (not checked).
            channels_last: run the HiFi-GAN head on ``(B, C, 1, T)`` tensors in
                ``torch.channels_last`` format (the fast layout for cuDNN; same function).
            head: a replacement for ``self.head`` computing the same function, e.g. a
                :class:`~fishserve.models.firefly.triton_head.TritonHead` (then
                ``channels_last`` is ignored).

        Returns:
            ``(B, 1, L * frame_samples)`` float32 waveform, zero past ``lengths * frame_samples``.
        """
        factor, hop = self.config.downsample_factor, self.config.hop_length
        z = self.quantizer.upsample_latent(self.quantizer.decode_codes(codes).to(self.dtype))
        z = z * sequence_mask(lengths * factor, z.shape[-1])[:, None].to(z.dtype)
        if head is not None:
            wav = head(z).float()
        elif channels_last:
            z = z[:, :, None].contiguous(memory_format=torch.channels_last)
            wav = self.head(z)[:, :, 0].float()
        else:
            wav = self.head(z).float()
        mask = sequence_mask(lengths * factor * hop, wav.shape[-1])[:, None]
        return wav * mask.float()

    def decode_tail_unchecked(
        self,
        codes: Tensor,
        lengths: Tensor,
        new_frames: int,
        head: TritonHead,
        skip: Tensor | None = None,
    ) -> Tensor:
        """The samples of each item's last `new_frames` frames, computing only what they need.

        The chunk decode of a stream: item b is ``codes[b, :, :lengths[b]]`` (left-aligned,
        oldest frame first, as for :meth:`decode_unchecked`), decoded as if it were a whole clip
        (causal zero padding before its first frame), and only the samples of its frames
        ``[lengths[b] - new_frames, lengths[b])`` are returned. The latent (cheap, ~3% of the
        work) is computed for every frame; the HiFi-GAN head (:meth:`TritonHead.decode_tail`)
        skips, at each layer, the steps that those samples do not depend on, so a chunk with
        ``C`` frames of left context costs about ``new_frames`` plus the *remaining* reach of
        each layer instead of ``C + new_frames`` frames everywhere (issue 8).

        Args:
            codes: ``(B, G, W)`` int64 codes on the decoder's device, ``W >= 1``.
            lengths: ``(B,)`` int64 valid frames per item, each in ``[0, W]`` (not checked);
                ``lengths[b] < new_frames`` gives leading samples before the item's start
                (meaningless: drop them).
            new_frames: frames of output per item, ``<= W``.
            head: the decoder's head as a :class:`TritonHead`.
            skip: int64 ``(num_convs, B)`` (:meth:`TritonHead.skip_rows` for
                ``new_frames * frame_samples`` samples of ``W * downsample_factor`` latent
                steps): items that want fewer samples (a shorter chunk, a padded row) are
                computed only that far back; the samples before those are garbage.

        Returns:
            ``(B, new_frames * frame_samples)`` float32 at ``config.sample_rate`` Hz.
        """
        factor = self.config.downsample_factor
        z = self.quantizer.upsample_latent(self.quantizer.decode_codes(codes).to(self.dtype))
        steps, channels = z.shape[-1], z.shape[1]
        valid = lengths * factor
        # right-align each item: step t of the result is step t - (steps - valid) of z (the
        # wrapped-around steps land before the item's start, where the head reads zeros)
        index = torch.arange(steps, device=z.device)[None, :] - (steps - valid)[:, None]
        index = torch.remainder(index, steps)[:, :, None].expand(-1, -1, channels)
        x = z.transpose(1, 2).gather(1, index)
        samples = new_frames * self.config.frame_samples
        return head.decode_tail(x, valid, samples, skip).float()

    def forward(self, codes: Tensor, feature_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Alias of :meth:`decode` (the generator's inference direction)."""
        return self.decode(codes, feature_lengths)

    # ------------------------------------------------------------------ encode path
    def log_mel(self, audio: Tensor) -> Tensor:
        """``(B, 1, N)`` float audio -> ``(B, n_mels, N // hop)`` float32 log-mel (spec §4.6)."""
        return self.spec_transform(audio.to(self.device))

    def encode_features(self, audio: Tensor, audio_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Masked log-mel -> ConvNeXt features (spec §4.6 steps 2-3).

        Returns:
            ``(features (B, C, N // hop) model dtype, mel_lengths (B,) int64)``.
        """
        out = self._mel_and_features(audio, audio_lengths)
        return out[2], out[1]

    @torch.inference_mode()
    def encode_intermediates(self, audio: Tensor, audio_lengths: Tensor) -> EncodeOutput:
        """Run the full encode path and keep every stage (see :class:`EncodeOutput`).

        Args:
            audio: ``(B, 1, N)`` float waveform at ``config.sample_rate`` Hz (N >= hop).
            audio_lengths: ``(B,)`` valid samples per item, each in ``[0, N]``.

        Raises:
            ValueError: wrong shapes, lengths out of range or audio too short.
        """
        mel, mel_lengths, feats = self._mel_and_features(audio, audio_lengths)
        down = self.quantizer.downsample_features(feats)
        bounded = self.quantizer.bounded_pre_round(down)
        codes = self.quantizer.codes_from_bounded(bounded)
        feature_lengths = mel_lengths // self.config.downsample_factor
        return EncodeOutput(mel, mel_lengths, feats, down, bounded, codes, feature_lengths)

    def encode(self, audio: Tensor, audio_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Waveform -> codes (spec §4.6).

        Args:
            audio: ``(B, 1, N)`` float waveform at ``config.sample_rate`` Hz.
            audio_lengths: ``(B,)`` valid samples per item.

        Returns:
            ``(codes, feature_lengths)``: ``(B, G, L)`` int64 with ``L = ceil(ceil(T/2)/2)``,
            ``T = N // hop``; ``(B,)`` int64 ``(audio_lengths // hop) // 4`` (can be L - 1).
        """
        out = self.encode_intermediates(audio, audio_lengths)
        return out.codes, out.feature_lengths

    # ------------------------------------------------------------------ helpers
    def _mel_and_features(self, audio: Tensor, audio_lengths: Tensor) -> tuple[Tensor, ...]:
        if audio.ndim != 3 or audio.shape[1] != 1 or not audio.is_floating_point():
            raise ValueError(f"audio must be a float (B, 1, N) tensor, got {tuple(audio.shape)}")
        lengths = self._check_lengths(audio_lengths, audio.shape[0], audio.shape[2], "audio")
        mel = self.log_mel(audio)
        mel_lengths = lengths // self.config.hop_length
        mask = sequence_mask(mel_lengths, mel.shape[-1])[:, None]
        mel = mel * mask.float()
        feats = self.backbone(mel.to(self.dtype)) * mask.to(self.dtype)
        return mel, mel_lengths, feats

    def _check_codes(self, codes: Tensor) -> Tensor:
        groups = self.config.n_groups
        if codes.ndim != 3 or codes.shape[1] != groups:
            raise ValueError(f"codes must have shape (B, {groups}, L), got {tuple(codes.shape)}")
        if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
            raise ValueError(f"codes must be an integer tensor, got {codes.dtype}")
        return codes.to(self.device, torch.int64)

    def _check_lengths(self, lengths: Tensor, batch: int, limit: int, what: str) -> Tensor:
        lengths = torch.as_tensor(lengths)
        if lengths.shape != (batch,) or lengths.is_floating_point():
            raise ValueError(
                f"{what} lengths must be an integer tensor of shape ({batch},), "
                f"got {lengths.dtype} {tuple(lengths.shape)}"
            )
        if batch and (int(lengths.min()) < 0 or int(lengths.max()) > limit):
            raise ValueError(f"{what} lengths must lie in [0, {limit}], got {lengths.tolist()}")
        return lengths.to(self.device, torch.int64)
