"""The decode step with static shapes, and its CUDA-graph capture per batch-size bucket.

A decode step (every running sequence adds one frame) is a fixed sequence of kernels for a
given batch size, in two halves: (1) embed the last frames, run the slow transformer over one
position per sequence with paged attention and sample the token (over the top-k candidates,
`sample_prefiltered`); (2) run the fast transformer over the codebooks and sample them. Between
the halves, the rows whose nucleus is not inside the top-k candidates (rare with a trained model)
are resampled over the full vocabulary, eagerly and for those rows only, so every token is the
one the full computation gives. `CudaGraphDecoder` captures each half once per bucket (1, 2, 4,
8, 16, 32, ... up to the engine's `max_num_seqs`) at start-up and replays them, padding a batch
to the next bucket; nothing is captured again while serving (`num_captures` counts buckets).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from fishserve.engine.decode_attention import DecodeAttention, DecodeMetadata
from fishserve.engine.frame import (
    BatchSampling,
    inexact_rows,
    resample_rows_,
    sample_codebooks,
    sample_token,
)
from fishserve.engine.kv_cache import PagedKVCache
from fishserve.engine.sampling import REPETITION_WINDOW
from fishserve.engine.sequence import Sequence
from fishserve.models.dual_ar import DualARTransformer

log = logging.getLogger(__name__)
NULL_BLOCK = 0  # never allocated: padded rows of a captured batch write and read it


@dataclass
class DecodeInputs:
    """All inputs of a decode step for B sequences (host or device tensors).

    Shapes: columns (B, 1 + nc) int64 last frame; positions, slot_mapping (B,) int64;
    block_tables (B, max_blocks) int32; context_lens (B,) int32; temperature, top_p, penalty
    (B,) float32; seeds, segments, frames (B,) int64; windows (B, 1 + nc, 16) int64.
    """

    columns: Tensor
    positions: Tensor
    slot_mapping: Tensor
    block_tables: Tensor
    context_lens: Tensor
    temperature: Tensor
    top_p: Tensor
    penalty: Tensor
    seeds: Tensor
    segments: Tensor
    frames: Tensor
    windows: Tensor

    @classmethod
    def empty(
        cls, batch: int, num_rows: int, max_blocks: int, device: torch.device
    ) -> DecodeInputs:
        """Neutral inputs of a padded row: null block, context 1, no penalty."""
        i64, i32, f32 = torch.int64, torch.int32, torch.float32

        def t(shape: tuple, dtype: torch.dtype, fill: float = 0) -> Tensor:
            return torch.full(shape, fill, dtype=dtype, device=device)

        return cls(
            columns=t((batch, num_rows), i64),
            positions=t((batch,), i64),
            slot_mapping=t((batch,), i64, NULL_BLOCK),
            block_tables=t((batch, max_blocks), i32),
            context_lens=t((batch,), i32, 1),
            temperature=t((batch,), f32, 1.0),
            top_p=t((batch,), f32, 1.0),
            penalty=t((batch,), f32, 1.0),
            seeds=t((batch,), i64),
            segments=t((batch,), i64),
            frames=t((batch,), i64),
            windows=t((batch, num_rows, REPETITION_WINDOW), i64),
        )

    def copy_rows_(self, other: DecodeInputs, start: int = 0) -> None:
        """Copy `other`'s rows from `start` on into the same rows of self."""
        n = other.columns.shape[0]
        for f in fields(self):
            dst, src = getattr(self, f.name), getattr(other, f.name)
            dst[start:n].copy_(src[start:], non_blocking=True)

    def to(self, device: torch.device) -> DecodeInputs:
        """A copy on `device` (pinned host memory makes the copy asynchronous)."""
        return DecodeInputs(
            **{f.name: getattr(self, f.name).to(device, non_blocking=True) for f in fields(self)}
        )


def build_decode_inputs(seqs: list[Sequence], block_size: int, max_blocks: int) -> DecodeInputs:
    """Host tensors of a decode step for `seqs` (each has its last frame pending)."""
    b = len(seqs)
    tables = np.zeros((b, max_blocks), dtype=np.int32)
    positions = np.empty(b, dtype=np.int64)
    for i, seq in enumerate(seqs):
        tables[i, : len(seq.block_table)] = seq.block_table
        positions[i] = seq.num_computed
    rows = np.arange(b)
    slots = tables[rows, positions // block_size].astype(np.int64) * block_size
    slots += positions % block_size

    def col(values: list, dtype: torch.dtype) -> Tensor:
        return torch.tensor(values, dtype=dtype)

    return DecodeInputs(
        columns=torch.stack([seq.frames[-1] for seq in seqs]),
        positions=torch.from_numpy(positions),
        slot_mapping=torch.from_numpy(slots),
        block_tables=torch.from_numpy(tables),
        context_lens=torch.from_numpy((positions + 1).astype(np.int32)),
        temperature=col([s.params.temperature for s in seqs], torch.float32),
        top_p=col([s.params.top_p for s in seqs], torch.float32),
        penalty=col([s.params.repetition_penalty for s in seqs], torch.float32),
        seeds=col([s.seed for s in seqs], torch.int64),
        segments=col([s.segment for s in seqs], torch.int64),
        frames=col([len(s.frames) for s in seqs], torch.int64),
        windows=torch.stack([seq.window for seq in seqs]),
    )


@dataclass
class TokenStep:
    """Output of the first half of a decode step (device tensors).

    Attributes:
        hidden: (B, D) slow hidden states of the new positions.
        token: int64 (B,) sampled slow tokens (valid where `exact`, or after resampling).
        exact: bool (B,) rows the top-k prefilter decided, or None without prefilter.
    """

    hidden: Tensor
    token: Tensor
    exact: Tensor | None


def sampling_of(inputs: DecodeInputs) -> BatchSampling:
    """The per-row sampling tensors of `inputs`."""
    return BatchSampling(
        inputs.temperature,
        inputs.top_p,
        inputs.penalty,
        inputs.seeds,
        inputs.segments,
        inputs.frames,
    )


def decode_step_token(
    model: DualARTransformer,
    cache: PagedKVCache,
    inputs: DecodeInputs,
    use_triton: bool,
    top_k_prefilter: int,
) -> TokenStep:
    """First half: slow transformer and token sampling (no host sync)."""
    meta = DecodeMetadata(inputs.slot_mapping, inputs.block_tables, inputs.context_lens)
    x = model.embed(inputs.columns[:, :, None])
    attn = DecodeAttention(cache, meta, use_triton)
    hidden = model.forward_slow(x, inputs.positions[:, None], attn)[:, -1]
    window = inputs.windows[:, 0]
    logits = model.slow_logits(hidden)
    token, exact = sample_token(logits, sampling_of(inputs), window, top_k_prefilter)
    return TokenStep(hidden, token, exact)


def resample_inexact_(
    model: DualARTransformer, step: TokenStep, inputs: DecodeInputs, live: int | None = None
) -> int:
    """Resample the rows the prefilter could not decide (host sync); returns how many.

    Only the first `live` rows are looked at (default all): the rest pad a captured batch.
    """
    rows = inexact_rows(None if step.exact is None else step.exact[:live])
    if rows is None:
        return 0
    # Same shape as the step's own logits (bit-identical GEMM), then the rows: logits of a
    # smaller matmul can round differently and change a token.
    logits = model.slow_logits(step.hidden)[rows]
    resample_rows_(step.token, rows, logits, sampling_of(inputs), inputs.windows[:, 0])
    return int(rows.numel())


def decode_step_codes(model: DualARTransformer, step: TokenStep, inputs: DecodeInputs) -> Tensor:
    """Second half: fast transformer; frames int64 (B, 1 + nc) (no host sync)."""
    return sample_codebooks(model, step.hidden, step.token, sampling_of(inputs), inputs.windows)


def decode_step(
    model: DualARTransformer,
    cache: PagedKVCache,
    inputs: DecodeInputs,
    use_triton: bool,
    top_k_prefilter: int = 0,
) -> Tensor:
    """One whole decode step on device tensors; returns frames int64 (B, 1 + nc).

    Synchronises with the device only when `top_k_prefilter` is on (to find inexact rows).
    """
    step = decode_step_token(model, cache, inputs, use_triton, top_k_prefilter)
    resample_inexact_(model, step, inputs)
    return decode_step_codes(model, step, inputs)


def graph_buckets(max_batch: int) -> list[int]:
    """Captured batch sizes: powers of two below `max_batch`, then `max_batch`."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return [*sizes, max_batch]


@dataclass
class _Captured:
    """The two graphs of one bucket and their static inputs and outputs."""

    token_graph: torch.cuda.CUDAGraph
    codes_graph: torch.cuda.CUDAGraph
    inputs: DecodeInputs
    step: TokenStep
    frames: Tensor


class CudaGraphDecoder:
    """Decode steps replayed from CUDA graphs captured at start-up, one pair per batch bucket.

    Attributes:
        resampled_rows: rows resampled over the full vocabulary so far (prefilter misses).
    """

    def __init__(
        self,
        model: DualARTransformer,
        cache: PagedKVCache,
        max_batch: int,
        max_blocks: int,
        use_triton: bool,
        top_k_prefilter: int = 0,
    ) -> None:
        self.model, self.cache, self.use_triton = model, cache, use_triton
        self.top_k_prefilter = top_k_prefilter
        self.device = model.embeddings.weight.device
        self.buckets = graph_buckets(max_batch)
        rows = model.config.num_codebooks + 1
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[int, _Captured] = {}
        self.resampled_rows = 0
        self.neutral = {
            b: DecodeInputs.empty(b, rows, max_blocks, self.device) for b in self.buckets
        }
        start = time.perf_counter()
        for b in reversed(self.buckets):  # largest first: smaller graphs reuse its pool
            inputs = DecodeInputs.empty(b, rows, max_blocks, self.device)
            self.graphs[b] = self._capture(inputs)
        self.num_captures = len(self.graphs)
        log.info(
            "captured %d decode CUDA graph pairs (batch %s) in %.1f s",
            self.num_captures,
            self.buckets,
            time.perf_counter() - start,
        )

    def _token(self, inputs: DecodeInputs) -> TokenStep:
        k = self.top_k_prefilter
        return decode_step_token(self.model, self.cache, inputs, self.use_triton, k)

    def _capture(self, inputs: DecodeInputs) -> _Captured:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):  # warm-up: Triton compilation, cuBLAS workspaces
                step = self._token(inputs)
                decode_step_codes(self.model, step, inputs)
        torch.cuda.current_stream().wait_stream(stream)
        token_graph, codes_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.inference_mode():
            with torch.cuda.graph(token_graph, pool=self.pool):
                step = self._token(inputs)
            with torch.cuda.graph(codes_graph, pool=self.pool):
                frames = decode_step_codes(self.model, step, inputs)
        return _Captured(token_graph, codes_graph, inputs, step, frames)

    @property
    def max_batch(self) -> int:
        """Largest captured batch."""
        return self.buckets[-1]

    def run(self, host: DecodeInputs) -> Tensor:
        """Replay the smallest graphs that hold `host`'s B rows; frames (B, 1 + nc) on device."""
        b = host.columns.shape[0]
        bucket = next(size for size in self.buckets if size >= b)
        captured = self.graphs[bucket]
        if bucket > b:  # padded rows: back to neutral values
            captured.inputs.copy_rows_(self.neutral[bucket], start=b)
        captured.inputs.copy_rows_(host)
        captured.token_graph.replay()
        with torch.inference_mode():
            step, inputs = captured.step, captured.inputs
            self.resampled_rows += resample_inexact_(self.model, step, inputs, live=b)
        captured.codes_graph.replay()
        return captured.frames[:b]
