"""CUDA graphs of the decode step and of the frame head, one set per batch-size bucket.

`CudaGraphDecoder` captures, once per bucket (1, 2, 4, 8, ... up to the engine's
`max_num_seqs`) at start-up:

* the token graph: the first half of a decode step (`decode_step_token`: embed the last frames,
  slow transformer over one position per sequence, token sampling over the top-k candidates);
* the head graph: token sampling from hidden states given by the caller (the last positions of
  prefill chunks, computed on the general path);
* the codes graph: the second half (`decode_step_codes`: fast transformer over the codebooks).

A decode step replays token + codes; the rows finishing a prefill replay head + codes, so a
step that admits a new prompt runs only the prompt's slow pass eagerly. Between the halves, the
rows the top-k prefilter could not decide are resampled over the full vocabulary, for those
rows only: from a fallback graph per bucket of row counts (1, 2, 4, ... up to
`FALLBACK_MAX_ROWS`; the rows padded with copies of the first), else eagerly
(`resample_rows_of_` either way). One replay instead of ~30 eager operations, each of which
releases and re-acquires the GIL (docs/benchmarks.md §6.15). A batch is padded to the next
bucket with neutral rows (null block, context 1); nothing is captured while serving.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fishserve.engine.decode_step import (
    DecodeInputs,
    SamplingInputs,
    TokenStep,
    carry_frames_,
    decode_step_codes,
    decode_step_token,
    resample_rows_of_,
    sampling_of,
)
from fishserve.engine.frame import inexact_rows_host, sample_token
from fishserve.engine.host_copy import to_device
from fishserve.engine.kv_cache import PagedKVCache
from fishserve.engine.staging import StagedInputs
from fishserve.models.dual_ar import DualARTransformer

log = logging.getLogger(__name__)


# Most rows per captured full-vocabulary fallback; a step with more inexact rows resamples them
# eagerly. With the peaked dummy logits ~10% of rows miss the prefilter (`full_sort_share`).
FALLBACK_MAX_ROWS = 128


def graph_buckets(max_batch: int) -> list[int]:
    """Captured batch sizes: powers of two below `max_batch`, then `max_batch`."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return [*sizes, max_batch]


@dataclass
class _Fallback:
    """A captured full-vocabulary resampling of `rows.numel()` rows of one bucket's step."""

    graph: torch.cuda.CUDAGraph
    rows: Tensor  # int64 (R,) on the device: the rows to resample (repeats allowed)
    host: Tensor  # int64 (R,) pinned: staging for `rows`

    def __post_init__(self) -> None:
        self._host_np = self.host.numpy()  # no PyTorch call per replay to reach it

    def replay(self, rows: np.ndarray) -> None:
        """Resample `rows` (int64, 1 to R host indices), padded with copies of the first.

        The pinned staging buffer is rewritten here only after the caller has waited for the
        stream (`_resample` reads the prefilter's mask first), so the previous replay's copy
        from it has run.
        """
        self._host_np[: rows.size] = rows
        self._host_np[rows.size :] = rows[0]
        self.rows.copy_(self.host, non_blocking=True)
        self.graph.replay()


@dataclass
class _Captured:
    """The graphs of one bucket and their static inputs and outputs."""

    token_graph: torch.cuda.CUDAGraph
    head_graph: torch.cuda.CUDAGraph
    codes_graph: torch.cuda.CUDAGraph
    staged: StagedInputs
    step: TokenStep
    frames: Tensor
    fallback: dict[int, _Fallback]

    @property
    def inputs(self) -> DecodeInputs:
        """The static device inputs the graphs read."""
        return self.staged.inputs


@dataclass
class DecodeLaunch:
    """A decode step whose first half is queued on the device (see `CudaGraphDecoder.launch`).

    Attributes:
        step: the first half's outputs (device tensors; static ones when captured).
        inputs: the step's device inputs.
        live: rows whose frames are wanted (the first `live` of `step` and `inputs`; the
            rest are prompt positions without a sample, or padding).
        captured: the bucket's graphs when replayed from them, else None (eager).
    """

    step: TokenStep
    inputs: DecodeInputs
    live: int
    captured: _Captured | None = None


def _head(model: DualARTransformer, step: TokenStep, inputs: DecodeInputs, k: int) -> None:
    """Token sampling from `step.hidden`, written into `step.token` and `step.exact`."""
    logits = model.slow_logits(step.hidden)
    token, exact = sample_token(logits, sampling_of(inputs), inputs.windows[:, 0], k)
    step.token.copy_(token)
    if exact is not None and step.exact is not None:
        step.exact.copy_(exact)


class CudaGraphDecoder:
    """Decode steps and frame heads replayed from CUDA graphs captured at start-up.

    `capture_stream` (an SM partition's stream, `fishserve.engine.sm_partition`): the graphs
    are captured on it, since a replayed kernel runs in the context it was captured in
    whatever the replaying stream's (measured on an H200, docs/benchmarks.md §6.21); None:
    PyTorch's capture stream.

    Attributes:
        resampled_rows: rows resampled over the full vocabulary so far (prefilter misses).
        num_captures: buckets captured (three graphs each, and with the prefilter a fallback
            graph per bucket of row counts up to ``min(bucket, FALLBACK_MAX_ROWS)``).
    """

    def __init__(
        self,
        model: DualARTransformer,
        cache: PagedKVCache,
        max_batch: int,
        max_blocks: int,
        use_triton: bool,
        top_k_prefilter: int = 0,
        compile_codes: bool = False,
        capture_stream: torch.cuda.Stream | None = None,
    ) -> None:
        self.model, self.cache, self.use_triton = model, cache, use_triton
        # A graph's kernels run in the context of the stream they were captured on, not the
        # one it is replayed on: graphs for an SM partition are captured on its stream.
        self.capture_stream = capture_stream
        self.top_k_prefilter = top_k_prefilter
        self.compile_codes = compile_codes
        self.device = model.embeddings.weight.device
        self.buckets = graph_buckets(max_batch)
        rows = model.config.num_codebooks + 1
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[int, _Captured] = {}
        self.resampled_rows = 0
        self._filled: dict[int, int] = {}  # bucket -> rows holding live (non-neutral) values
        self.neutral = {
            b: DecodeInputs.empty(b, rows, max_blocks, self.device) for b in self.buckets
        }
        start = time.perf_counter()
        for b in reversed(self.buckets):  # largest first: smaller graphs reuse its pool
            staged = StagedInputs(DecodeInputs.empty(b, rows, max_blocks, self.device), self.device)
            self.graphs[b] = self._capture(staged)
        self.num_captures = len(self.graphs)
        log.info(
            "captured %d decode CUDA graph sets (batch %s) in %.1f s",
            self.num_captures,
            self.buckets,
            time.perf_counter() - start,
        )

    def _token(self, inputs: DecodeInputs) -> TokenStep:
        k = self.top_k_prefilter
        return decode_step_token(self.model, self.cache, inputs, self.use_triton, k)

    def _capture(self, staged: StagedInputs) -> _Captured:
        model, k, inputs = self.model, self.top_k_prefilter, staged.inputs
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):  # warm-up: Triton compilation, cuBLAS workspaces
                step = self._token(inputs)
                _head(model, step, inputs, k)
                decode_step_codes(model, step, inputs, self.compile_codes)
        torch.cuda.current_stream().wait_stream(stream)
        graphs = [torch.cuda.CUDAGraph() for _ in range(3)]
        with torch.inference_mode():
            with torch.cuda.graph(graphs[0], pool=self.pool, stream=self.capture_stream):
                step = self._token(inputs)
            with torch.cuda.graph(graphs[1], pool=self.pool, stream=self.capture_stream):
                _head(model, step, inputs, k)
            with torch.cuda.graph(graphs[2], pool=self.pool, stream=self.capture_stream):
                frames = decode_step_codes(model, step, inputs, self.compile_codes)
        fallback = self._capture_fallback(step, inputs) if step.exact is not None else {}
        return _Captured(*graphs, staged, step, frames, fallback)

    def _capture_fallback(self, step: TokenStep, inputs: DecodeInputs) -> dict[int, _Fallback]:
        """A full-vocabulary resampling graph per bucket of row counts (`FALLBACK_MAX_ROWS`)."""
        out: dict[int, _Fallback] = {}
        for r in graph_buckets(min(step.token.shape[0], FALLBACK_MAX_ROWS)):
            rows = torch.zeros(r, dtype=torch.int64, device=self.device)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.inference_mode():
                resample_rows_of_(self.model, step, inputs, rows)  # warm-up
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with (
                torch.inference_mode(),
                torch.cuda.graph(graph, pool=self.pool, stream=self.capture_stream),
            ):
                resample_rows_of_(self.model, step, inputs, rows)
            host = torch.zeros(r, dtype=torch.int64, pin_memory=True)
            out[r] = _Fallback(graph, rows, host)
        return out

    @property
    def max_batch(self) -> int:
        """Largest captured batch."""
        return self.buckets[-1]

    def _bucket(self, b: int) -> _Captured:
        """The smallest bucket holding b rows, its padded rows reset to neutral values.

        Only rows a previous call filled are reset (`_filled`): fewer copies, each of which
        releases the GIL.
        """
        bucket = next(size for size in self.buckets if size >= b)
        captured = self.graphs[bucket]
        filled = self._filled.get(bucket, bucket)
        if filled > b:
            captured.inputs.copy_rows_(self.neutral[bucket], start=b, stop=filled)
        self._filled[bucket] = b
        return captured

    def launch(
        self,
        host: DecodeInputs,
        live: int | None = None,
        carry: tuple[Tensor, Tensor] | None = None,
    ) -> DecodeLaunch:
        """Queue the token graph for `host`'s R rows (no host sync); finish with `finish`.

        `live`: the first rows whose frames are wanted (default all R). `carry`: (frames,
        plan) of `carry_frames_`, applied to the uploaded inputs before the replay.
        """
        b = host.columns.shape[0]
        bucket = next(size for size in self.buckets if size >= b)
        captured = self.graphs[bucket]
        captured.staged.stage(host)  # NumPy writes, then one upload
        captured.staged.upload()
        self._filled[bucket] = b  # the upload left rows b.. neutral on the device
        if carry is not None:
            carry_frames_(captured.inputs, *carry)
        captured.token_graph.replay()
        return DecodeLaunch(captured.step, captured.inputs, b if live is None else live, captured)

    def finish(self, launched: DecodeLaunch) -> Tensor:
        """Resample inexact rows (host sync), replay the codes graph; frames (live, 1 + nc).

        Returns a copy, so the bucket's graphs can be replayed again at once.
        """
        captured = launched.captured
        if captured is None:
            raise ValueError("finish() takes a launch from this decoder's graphs")
        with torch.inference_mode():
            self.resampled_rows += self._resample(captured, launched.live)
        captured.codes_graph.replay()
        return captured.frames[: launched.live].clone()

    def _resample(self, captured: _Captured, live: int) -> int:
        """Resample the first `live` rows the prefilter could not decide (host sync): from
        the smallest fallback graph that holds them, else eagerly. Returns how many."""
        step = captured.step
        rows = inexact_rows_host(None if step.exact is None else step.exact[:live])
        if rows is None:
            return 0
        bucket = next((r for r in captured.fallback if r >= rows.size), None)
        if bucket is None:
            rows_t = to_device(torch.from_numpy(rows), self.device)
            resample_rows_of_(self.model, step, captured.inputs, rows_t)
        else:
            captured.fallback[bucket].replay(rows)
        return int(rows.size)

    def run_head(self, hidden: Tensor, sampling: SamplingInputs) -> Tensor:
        """Frames of S rows from their slow hidden states (the rows finishing a prefill).

        Args:
            hidden: (S, D) slow pre-norm hidden states, on the device, in the model's dtype.
            sampling: the rows' host sampling settings and repetition windows.

        Returns:
            int64 (S, 1 + nc) frames on the device (a copy); S must be <= `max_batch`.
        """
        s = hidden.shape[0]
        captured = self._bucket(s)
        sampling.copy_into_(captured.inputs)
        captured.step.hidden[:s].copy_(hidden)
        captured.head_graph.replay()
        return self.finish(DecodeLaunch(captured.step, captured.inputs, s, captured))
