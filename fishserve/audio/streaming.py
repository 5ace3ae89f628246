"""Streaming decode: codes arrive one frame at a time, audio leaves in chunks (issue 4, part 1).

Why the stream equals the one-shot decode: every decoder op is causal (spec §4.3), so the samples
of code frame ``t`` depend only on frames ``<= t`` (no right context or lookahead is needed) and
on at most :func:`receptive_field_frames` frames before ``t`` (15 for the released decoder, 25 for
the tiny test fixture). Each chunk is decoded together with ``left_context`` already-emitted
frames (default: the receptive field) and only the chunk's own samples are kept, so the
concatenated chunks equal the one-shot decode of the same codes up to floating-point rounding.
Measured on the tiny fixture decoder (CPU fp32, 200 random frames): max abs difference ~5e-8 and
SNR ~131 dB for chunk sizes 1 to 64; tests/audio/test_streaming.py asserts max abs <= 1e-6 and
SNR >= 100 dB. With too little context the error grows: 16 frames give 4e-6 (SNR 108 dB), 8
frames 3e-3 (52 dB), none 0.06 (20 dB) on the tiny decoder.

Memory: each decode call sees at most ``left_context + max(first_chunk_frames, chunk_frames)``
frames whatever the clip length, and a stream keeps only ``left_context`` emitted frames plus the
frames not yet decoded.

Chunk schedule (:class:`ChunkPolicy`): the first chunk is decoded as soon as
``first_chunk_frames`` frames exist (default 10 = 0.46 s of audio at the released 21.53 frames/s,
so first audio needs <= 0.5 s of generated speech); each later chunk is ``growth`` times the
previous one (default 2) up to ``chunk_frames`` (default 64 = 2.97 s): 10, 20, 40, 64, 64, ...
Growing chunks keep the first audio early while amortising the left-context overhead later.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np
import torch

from fishserve.models.firefly import FireflyConfig, FireflyGenerator
from fishserve.models.firefly.streaming import StreamState

from .batching import DecodeJob, decode_batch

__all__ = ["ChunkPolicy", "StreamingDecoder", "receptive_field_frames"]

# ConvNeXt depthwise kernel of the quantizer's upsample stages (ConvNeXtBlock default, spec §4.3).
_QUANTIZER_CONVNEXT_KERNEL = 7


def receptive_field_frames(config: FireflyConfig) -> int:
    """Left receptive field of the decode path, in code frames (spec §4.3).

    Walks the decode path backwards from the first sample of a frame ``s`` and returns
    ``s - e`` where ``e`` is the earliest code frame that sample depends on: conv_post, then per
    HiFi-GAN stage (last first) its ParallelBlock and causal transposed conv, conv_pre, then the
    quantizer's upsample stages (ConvNeXt, transposed conv). Decoding a chunk with at least this
    many frames of left context therefore reproduces the one-shot samples of the chunk. Returns
    15 for the released config and 25 for the tiny fixture. It is an upper bound: on the tiny
    decoder a code change at frame ``j`` visibly (in float32) alters samples up to frame
    ``j + 24`` and nothing from ``j + 25`` on; the farthest-reaching taps fall below float32
    resolution, so 20 frames of context already match to ~5e-8.
    """
    head, quantizer = config.head, config.quantizer
    t = 1_000_000 * config.frame_samples  # first sample of a frame far from the clip start
    t -= head.post_conv_kernel_size - 1
    resblock_reach = max(
        sum(2 * (k - 1) * d for d in dilations)  # two causal convs per dilation
        for k, dilations in zip(
            head.resblock_kernel_sizes, head.resblock_dilation_sizes, strict=True
        )
    )
    stages = zip(head.upsample_rates, head.upsample_kernel_sizes, strict=True)
    for rate, kernel in reversed(list(stages)):
        t -= resblock_reach
        t = math.ceil((t - kernel + 1) / rate)  # earliest input of a causal transposed conv
    t -= head.pre_conv_kernel_size - 1
    for factor in quantizer.downsample_factor:  # upsample kernel = stride = factor
        t -= _QUANTIZER_CONVNEXT_KERNEL - 1
        t = math.ceil((t - factor + 1) / factor)
    return 1_000_000 - t


@dataclass(frozen=True)
class ChunkPolicy:
    """When a stream decodes, and with how much context (all sizes in code frames).

    Attributes:
        first_chunk_frames: frames of the first chunk (default 10 ≈ 0.46 s at 21.53 frames/s).
        chunk_frames: largest later chunk (default 64 ≈ 2.97 s).
        growth: each later chunk is ``ceil(previous * growth)`` frames, capped at
            ``chunk_frames`` (default 2.0). 1.0 keeps every chunk at ``first_chunk_frames``; a
            huge value (e.g. 1e9) jumps to ``chunk_frames`` right after the first chunk.
        left_context: frames of already-emitted context decoded with each chunk; ``None`` (the
            default) uses :func:`receptive_field_frames` of the decoder, which is exact.
        rebuffer_frames: the least frames of an early chunk while the audio sent so far is
            behind a client playing the stream in real time since its first chunk (it has run
            out: a player rebuffering; the server's pipeline applies it,
            `server.pipeline.Playback`, which does not model a client's pauses, so a stream
            that fell behind stays so until it catches up); 0 (the default): no such floor.

    Raises:
        ValueError: a size below 1 (``left_context`` or ``rebuffer_frames`` below 0) or
            ``growth < 1``.
    """

    first_chunk_frames: int = 10
    chunk_frames: int = 64
    growth: float = 2.0
    left_context: int | None = None
    rebuffer_frames: int = 0

    def __post_init__(self) -> None:
        if self.first_chunk_frames < 1 or self.chunk_frames < 1:
            raise ValueError(
                f"chunk sizes must be >= 1 frame, got first_chunk_frames="
                f"{self.first_chunk_frames}, chunk_frames={self.chunk_frames}"
            )
        if not self.growth >= 1.0:
            raise ValueError(f"growth must be >= 1, got {self.growth}")
        if self.left_context is not None and self.left_context < 0:
            raise ValueError(f"left_context must be >= 0, got {self.left_context}")
        if self.rebuffer_frames < 0:
            raise ValueError(f"rebuffer_frames must be >= 0, got {self.rebuffer_frames}")

    def next_chunk_frames(self, previous: int) -> int:
        """Size of the chunk after one of ``previous`` frames: ``min(chunk, ceil(prev*growth))``."""
        return min(self.chunk_frames, math.ceil(previous * self.growth))

    def context_frames(self, config: FireflyConfig) -> int:
        """Left context used with ``config``'s decoder (frames)."""
        if self.left_context is not None:
            return self.left_context
        return receptive_field_frames(config)

    def max_decode_frames(self, config: FireflyConfig) -> int:
        """Upper bound on the frames of any one decode call of a stream (the memory bound)."""
        return self.context_frames(config) + max(self.first_chunk_frames, self.chunk_frames)


class StreamingDecoder:
    """Per-request streaming decode state.

    Thread-safe for one producer and one consumer: the engine thread may ``push``/``close``
    while the decoder thread takes jobs. Use a single consumer per stream, so chunks come out in
    order.

    Typical use: ``push`` each frame the engine emits, send ``ready_chunks()`` to the client after
    each push (or let a decoder thread batch streams with
    :func:`fishserve.audio.batching.decode_streams`), and call ``flush()`` at the end of the
    request. The concatenated chunks equal the one-shot decode of all pushed codes (see module
    docstring for the tolerance); each chunk is ``n * frame_samples`` float32 samples at
    ``decoder.config.sample_rate`` Hz.
    """

    def __init__(
        self,
        decoder: FireflyGenerator | FireflyConfig,
        policy: ChunkPolicy | None = None,
        stateful: bool = False,
    ) -> None:
        """`decoder`: the decoder, or only its config where jobs are decoded elsewhere (e.g.
        in the engine's process; `ready_chunks` then raises RuntimeError). `stateful`: decode
        each chunk continuing the stream's decoder state (`fishserve.models.firefly.streaming`)
        instead of with left-context frames: no frame is decoded twice; the stream's jobs must
        then be decoded in order, one at a time."""
        config = decoder if isinstance(decoder, FireflyConfig) else decoder.config
        self.decoder = None if isinstance(decoder, FireflyConfig) else decoder
        self.policy = policy or ChunkPolicy()
        self.state = StreamState() if stateful else None
        self.context_frames = 0 if stateful else self.policy.context_frames(config)
        self._groups = config.n_groups
        self._history = np.zeros((self._groups, 0), dtype=np.int64)  # last emitted frames
        self._pending: list[np.ndarray] = []  # (G, n_i) frames not yet handed out
        self._pending_frames = 0
        self._next_size = self.policy.first_chunk_frames
        self._closed = False
        self._lock = threading.Lock()
        self.frames_pushed = 0
        self.frames_emitted = 0  # frames handed out in jobs

    # ------------------------------------------------------------------ input side
    def push(self, codes: np.ndarray | torch.Tensor) -> None:
        """Append frames.

        Args:
            codes: ``(G,)`` one frame or ``(G, n)`` frames of integer codes ``>= 0`` (ids up to
                1023 from the LLM are fine: the decoder wraps them, spec §4.4).

        Raises:
            ValueError: wrong shape, non-integer dtype or negative codes.
            RuntimeError: the stream was closed.
        """
        frames = self._as_frames(codes)
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot push codes to a closed stream")
            if frames.shape[1]:
                self._pending.append(frames)
                self._pending_frames += frames.shape[1]
                self.frames_pushed += frames.shape[1]

    def close(self) -> None:
        """Mark the end of the input: the remaining frames become decodable as a last chunk."""
        with self._lock:
            self._closed = True

    def frames_wanted(self, early_frames: int | None = None) -> int:
        """Frames still to push before the next chunk is ready (>= 1; 1 once it is ready);
        with `early_frames`, before a short chunk is (see `next_job`)."""
        with self._lock:
            size = self._next_size if early_frames is None else min(self._next_size, early_frames)
            return max(1, size - self._pending_frames)

    # ------------------------------------------------------------------ output side
    def next_job(self, early_frames: int | None = None) -> DecodeJob | None:
        """Hand out the next chunk to decode, or ``None`` if not enough frames are pending.

        A chunk is ready when the pending frames reach the next chunk size, or when the stream is
        closed and any frames are pending (the last chunk may be shorter). Handing a job out
        advances the stream: decode it (e.g. with :func:`decode_batch`) and emit the audio in the
        order jobs were handed out.

        Args:
            early_frames: also hand out a short chunk once this many frames are pending (a
                client is about to run out of audio); the chunk schedule then does not grow.
        """
        with self._lock:
            size, pending = self._next_size, self._pending_frames
            early = early_frames is not None and pending >= max(1, early_frames)
            if pending == 0 or (pending < size and not self._closed and not early):
                return None
            new = self._take(min(size, pending))
            codes = np.concatenate([self._history, new], axis=1)
            self._history = codes[:, max(0, codes.shape[1] - self.context_frames) :].copy()
            if new.shape[1] == size:
                self._next_size = self.policy.next_chunk_frames(size)
            self.frames_emitted += new.shape[1]
            context = codes.shape[1] - new.shape[1]
            return DecodeJob(codes, context_frames=context, state=self.state)

    def ready_chunks(self) -> list[np.ndarray]:
        """Decode every ready chunk, one decode call per chunk (memory stays per-chunk).

        Returns:
            float32 arrays of ``new_frames * frame_samples`` samples each, in stream order.
        """
        if self.decoder is None:
            raise RuntimeError("this stream has the decoder's config only; decode its jobs")
        chunks = []
        while (job := self.next_job()) is not None:
            chunks.extend(decode_batch(self.decoder, [job]))
        return chunks

    def flush(self) -> list[np.ndarray]:
        """Close the stream and decode everything still pending (see :meth:`ready_chunks`)."""
        self.close()
        return self.ready_chunks()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` or :meth:`flush` was called."""
        return self._closed

    @property
    def finished(self) -> bool:
        """True when the stream is closed and every frame has been handed out."""
        with self._lock:
            return self._closed and self._pending_frames == 0

    # ------------------------------------------------------------------ helpers
    def _take(self, n: int) -> np.ndarray:
        """Remove and return the oldest ``n`` pending frames as ``(G, n)`` (lock held)."""
        pending = np.concatenate(self._pending, axis=1)
        self._pending = [pending[:, n:]] if pending.shape[1] > n else []
        self._pending_frames -= n
        return pending[:, :n]

    def _as_frames(self, codes: np.ndarray | torch.Tensor) -> np.ndarray:
        """Validate pushed codes and return them as ``(G, n)`` int64."""
        if isinstance(codes, torch.Tensor):
            codes = codes.detach().cpu().numpy()
        codes = np.asarray(codes)
        if codes.ndim == 1:
            codes = codes[:, None]
        if codes.ndim != 2 or codes.shape[0] != self._groups:
            raise ValueError(
                f"codes must have shape ({self._groups},) or ({self._groups}, n), got {codes.shape}"
            )
        if not np.issubdtype(codes.dtype, np.integer):
            raise ValueError(f"codes must be integers, got {codes.dtype}")
        if codes.size and codes.min() < 0:
            raise ValueError(f"codes must be >= 0, got {int(codes.min())}")
        return codes.astype(np.int64)
