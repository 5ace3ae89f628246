"""Turns a scheduled batch into tensors, runs both transformers, and samples frames.

One step: the new positions of every scheduled sequence are flattened into a single row,
the slow transformer runs once over them with paged attention, the last position of each
sequence that completes its pending positions gives logits and a hidden state, and
`sample_frame` runs the fast transformer for all of those sequences together.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fishserve.engine.busy_timer import BusyTimer
from fishserve.engine.decode_step import (
    FrameCarry,
    build_row_inputs,
    build_sampling_inputs,
    carry_frames_,
    carry_plan,
    decode_step_codes,
    decode_step_token,
    resample_inexact_,
)
from fishserve.engine.frame import sample_frame
from fishserve.engine.graph_decoder import CudaGraphDecoder, DecodeLaunch
from fishserve.engine.host_copy import PinnedDownload, to_device
from fishserve.engine.kv_cache import PagedKVCache
from fishserve.engine.paged_attention import AttentionMetadata, TorchPagedAttention
from fishserve.engine.persistent_batch import PersistentBatch
from fishserve.engine.scheduler import ScheduledBatch
from fishserve.engine.sequence import Sequence
from fishserve.engine.triton_attention import triton_available
from fishserve.models.dual_ar import DualARTransformer

# CUDA stream priority of the engine's steps (lower is higher; PyTorch maps values outside the
# device's range to its nearest end). The decoder runs at the default, 0.
STEP_STREAM_PRIORITY = -1
# ... with asynchronous scheduling: the decoder's. Steps queued back to back at the higher
# priority starved the decoder (docs/benchmarks.md §6.12: 455 of 745 streams stalled at 384
# against 10 of 979 at equal priority).
ASYNC_STEP_STREAM_PRIORITY = 0


@dataclass
class PrefillOutput:
    """The general path's queued slow pass: sampling sequences and their hidden states.

    Attributes:
        samplers: the S sequences that sample a frame this step.
        hidden: (S, D) slow pre-norm hidden state of each one's last position (device).
    """

    samplers: list[Sequence]
    hidden: Tensor


@dataclass
class RowsLaunch:
    """A static step whose first half is queued: its samplers (rows 0..S-1) and the launch."""

    samplers: list[Sequence]
    launched: DecodeLaunch


@dataclass
class StepFrames:
    """A step's sampled frames: row i of `frames` (int64 NumPy (S, 1 + nc)) is `seqs[i]`'s."""

    seqs: list[Sequence]
    frames: np.ndarray


@dataclass
class PendingStep:
    """A step whose frames are on their way to the host (asynchronous scheduling).

    Attributes:
        samplers: the S sequences that sampled a frame, in row order.
        carry: their frames on the device, for the next step's input columns.
        download: the queued copy of the frames to the host.
    """

    samplers: list[Sequence]
    carry: FrameCarry
    download: PinnedDownload


@dataclass
class StepInputs:
    """Host-built tensors of one step (see `build_inputs`).

    Attributes:
        columns: int64 (1, 1 + nc, N) input columns of all new positions.
        positions: int64 (N,) absolute positions.
        meta: paged-attention layout.
        sample_rows: int64 (S,) index into N of the last position of each sampling sequence.
        samplers: the S sequences that sample a frame this step, in order.
    """

    columns: Tensor
    positions: Tensor
    meta: AttentionMetadata
    sample_rows: Tensor
    samplers: list[Sequence]


def build_inputs(batch: ScheduledBatch, block_size: int, device: torch.device) -> StepInputs:
    """Flatten the scheduled positions and build slot mapping and block tables.

    Everything is computed on the host and copied without synchronising, so building the
    inputs does not wait for the device to finish earlier work (a replayed decode graph).
    """
    columns, positions, slots, starts, contexts, tables = [], [], [], [0], [], []
    sample_rows, samplers = [], []
    for seq, n in batch.items:
        start = seq.num_computed
        pos = np.arange(start, start + n)
        table = np.asarray(seq.block_table, dtype=np.int64)
        columns.append(seq.columns(start, start + n))
        positions.append(pos)
        slots.append(table[pos // block_size] * block_size + pos % block_size)
        starts.append(starts[-1] + n)
        contexts.append(start + n)
        tables.append(table)
        if start + n == seq.num_positions:
            sample_rows.append(starts[-1] - 1)
            samplers.append(seq)
    padded = np.zeros((len(tables), max(len(t) for t in tables)), dtype=np.int64)
    for i, t in enumerate(tables):
        padded[i, : len(t)] = t
    meta = AttentionMetadata(
        slot_mapping=to_device(torch.from_numpy(np.concatenate(slots)), device),
        query_start=to_device(torch.tensor(starts), device),
        context_lens=to_device(torch.tensor(contexts), device),
        block_tables=to_device(torch.from_numpy(padded), device),
        block_size=block_size,
        max_query=max(b - a for a, b in itertools.pairwise(starts)),
        max_context=max(contexts),
    )
    return StepInputs(
        columns=to_device(torch.cat(columns, dim=1)[None], device),
        positions=to_device(torch.from_numpy(np.concatenate(positions)), device),
        meta=meta,
        sample_rows=to_device(torch.tensor(sample_rows, dtype=torch.int64), device),
        samplers=samplers,
    )


def is_decode_item(seq: Sequence, n: int) -> bool:
    """Whether the sequence computes exactly its last generated frame this step."""
    return n == 1 and bool(seq.frames) and seq.num_pending == 1


def split_decode(batch: ScheduledBatch) -> tuple[list[Sequence], ScheduledBatch]:
    """The batch's decode sequences, and a batch of the rest (prefill chunks, recomputes).

    Mixed steps run the decode rows on the static (CUDA-graph) path and only the prefill rows
    on the general path, so a prompt arriving does not send a thousand decoding sequences
    through eager kernels.
    """
    decode: list[Sequence] = []
    rest = ScheduledBatch()
    for seq, n in batch.items:
        if is_decode_item(seq, n):
            decode.append(seq)
        else:
            rest.items.append((seq, n))
    return decode, rest


class ModelRunner:
    """Runs scheduled batches on the DualAR model with a paged KV cache.

    Steps take the static-shape path (`decode_step_token`, `decode_step_codes`): on CUDA
    through the fused Triton attention, replayed from CUDA graphs unless `enforce_eager`. A
    step whose positions fit `max_rows` runs every position, prompt ones included, as one row
    of that path. A larger step runs its decoding sequences there and its prefill chunks on
    the general path (`TorchPagedAttention`); those finishing their prompt sample their first
    frame through the captured frame head (`CudaGraphDecoder.run_head`).

    Attributes:
        busy_seconds: time the device spent on this runner's steps (see `execute`).
        rows: the scheduler's persistent rows of the running sequences (`PersistentBatch`),
            which static steps gather their inputs from; None: read from each sequence.
        full_sort_rows: slow-token draws of the static path (captured or not) that the top-k
            prefilter could not decide and a full sort redid (exact either way).

    Args:
        max_batch: largest decode batch (the engine's `max_num_seqs`).
        static_prefill_tokens: prompt positions a step may add to its decode rows and still run
            every position as a row of one static step (captured up to max_batch + this); a
            step with more runs its prefill chunks on the general path.
        static_decode: use the static decode path on CPU too (tests); always on for CUDA.
        top_k_prefilter: candidates for the slow token's top-p (`sample_prefiltered`); 0: a
            full sort. Rows it cannot decide are resampled exactly.
        stream_priority: CUDA stream priority of the steps (`STEP_STREAM_PRIORITY`).
        stream: the CUDA stream the steps run on (e.g. an SM partition's,
            `fishserve.engine.sm_partition`); None: a new one of `stream_priority`.
        compile_fast_transformer: run each step's second half (fast transformer and codebook
            sampling) as one torch.compile graph on CUDA (`sample_codebooks_compiled`);
            ignored with `enforce_eager`.
        graphs_on_stream: capture the CUDA graphs on `stream` (`CudaGraphDecoder`'s
            `capture_stream`: an SM partition's graphs then run on its SMs only).
    """

    def __init__(
        self,
        model: DualARTransformer,
        cache: PagedKVCache,
        max_batch: int = 1,
        enforce_eager: bool = False,
        static_decode: bool = False,
        top_k_prefilter: int = 0,
        static_prefill_tokens: int = 0,
        stream_priority: int = STEP_STREAM_PRIORITY,
        compile_fast_transformer: bool = False,
        stream: torch.cuda.Stream | None = None,
        graphs_on_stream: bool = False,
    ) -> None:
        self.model = model
        self.compile_codes = compile_fast_transformer and not enforce_eager
        self.cache = cache
        self.device = model.embeddings.weight.device
        on_gpu = self.device.type == "cuda"
        self.use_triton = on_gpu and triton_available()
        self.static_decode = static_decode or on_gpu
        self.max_blocks = -(-model.config.max_seq_len // cache.layout.block_size)
        self.top_k_prefilter = top_k_prefilter
        self.busy = BusyTimer(self.device)
        self.max_rows = max_batch + static_prefill_tokens
        self._eager_full_sort_rows = 0
        self.rows: PersistentBatch | None = None  # the scheduler's, set by the engine
        # Steps run on a high-priority stream: the decoder's long convolution kernels (on its
        # own default-priority stream) would otherwise hold the SMs while each of a step's
        # ~1,000 short kernels waits its turn. A graph replays at its stream's priority.
        if stream is not None and not on_gpu:
            raise ValueError(f"a CUDA stream for the steps needs a CUDA model, not {self.device}")
        if on_gpu and stream is None:
            stream = torch.cuda.Stream(self.device, priority=stream_priority)
        self.stream = stream
        self.graphs: CudaGraphDecoder | None = None
        if on_gpu and not enforce_eager:
            self.graphs = CudaGraphDecoder(
                model,
                cache,
                self.max_rows,
                self.max_blocks,
                self.use_triton,
                top_k_prefilter,
                self.compile_codes,
                capture_stream=self.stream if graphs_on_stream else None,
            )
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))  # start-up work
        # Frames reach the host through pinned memory: a pageable copy blocked the decoder
        # thread's CUDA calls while it waited for the step (`fishserve.engine.host_copy`).
        # Asynchronous steps use it too: a step's frames are read before the next step's
        # copy is queued (`LLMEngine` collects, then finishes).
        self._frames_down = PinnedDownload(self.device)

    @property
    def num_captures(self) -> int:
        """CUDA graphs captured (all at start-up; 0 when eager)."""
        return 0 if self.graphs is None else self.graphs.num_captures

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> StepFrames:
        """Compute the batch; return the samplers' frames.

        Advances `num_computed` of every scheduled sequence and adds the step's device time to
        `busy_seconds` (`BusyTimer`: CUDA events, no extra synchronisation).
        """
        with self._on_stream(), self.busy.measure():
            return self._execute(batch)

    def can_overlap(self, batch: ScheduledBatch) -> bool:
        """Whether `batch` can be launched before the previous step's frames reach the
        host (`launch`): it runs as rows of one static step."""
        return self.static_decode and batch.num_tokens <= self.max_rows

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch, carry: FrameCarry | None) -> RowsLaunch:
        """Queue the first half of `batch` (see `can_overlap`); no host sync.

        Sequences whose next column is their frame in flight take it from `carry` (the
        previous step's device frames). Advances `num_computed` like `execute`.

        Raises:
            RuntimeError: a frame in flight is not in `carry`.
        """
        with self._on_stream(), self.busy.measure():
            return self._launch_rows(batch.items, carry)

    @torch.inference_mode()
    def finish(self, rows: RowsLaunch) -> PendingStep:
        """Run the second half of a `launch` (one host sync, for the prefilter's misses) and
        queue its frames' copy to the host; `collect` waits for it."""
        with self._on_stream(), self.busy.measure():
            samplers, frames = self._finish_rows(rows)
            self._frames_down.start(frames)
        index = {id(seq): row for row, seq in enumerate(samplers)}
        return PendingStep(samplers, FrameCarry(frames, index), self._frames_down)

    def collect(self, pending: PendingStep) -> StepFrames:
        """The frames of a `finish`ed step, once copied."""
        return StepFrames(pending.samplers, pending.download.wait())

    def _on_stream(self) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext() if self.stream is None else torch.cuda.stream(self.stream)

    def synchronize(self) -> None:
        """Wait for the queued device work of the steps (no-op on CPU)."""
        if self.stream is not None:
            self.stream.synchronize()

    @property
    def full_sort_rows(self) -> int:
        """See the class docstring."""
        eager, captured, _ = self.counter_state()
        return eager + captured

    def counter_state(self) -> tuple[int, int, float]:
        """(full-sort rows eager, full-sort rows captured, busy seconds), for
        `restore_counters`."""
        captured = 0 if self.graphs is None else self.graphs.resampled_rows
        return self._eager_full_sort_rows, captured, self.busy.seconds

    def restore_counters(self, state: tuple[int, int, float]) -> None:
        """Set the counters back to `state` from `counter_state` (call after `synchronize`:
        the work since is forgotten)."""
        self._eager_full_sort_rows, captured, seconds = state
        if self.graphs is not None:
            self.graphs.resampled_rows = captured
        self.busy.restore(seconds)

    @property
    def busy_seconds(self) -> float:
        """Device time of the completed steps (CUDA events; wall time on CPU)."""
        return self.busy.seconds

    def _execute(self, batch: ScheduledBatch) -> StepFrames:
        if not self.static_decode:
            return self._finish(self._sample_general(self._prefill(batch)))
        if batch.num_tokens <= self.max_rows:  # every position a row of one static step
            return self._finish([self._finish_rows(self._launch_rows(batch.items))])
        decode, other = split_decode(batch)
        # Launch order: the decode rows' first half (a graph replay: the device is busy) before
        # the prefill rows' eager kernels are queued, and no host sync in between, so the
        # host's kernel launches for the prefill overlap the decode work on the device.
        launched = self._launch_rows([(seq, 1) for seq in decode]) if decode else None
        prefill = self._prefill(other) if other.items else None
        outputs: list[tuple[list[Sequence], Tensor]] = []
        if launched is not None:
            outputs.append(self._finish_rows(launched))
        if prefill is not None and prefill.samplers:
            outputs.append(self._sample_prefill(prefill))
        return self._finish(outputs)

    def _finish(self, outputs: list[tuple[list[Sequence], Tensor]]) -> StepFrames:
        """One device-to-host copy of every sampled frame.

        Frames are one int64 NumPy array: no PyTorch call per row (see `Sequence`).
        """
        if not outputs:
            rows = 1 + self.model.config.num_codebooks
            return StepFrames([], np.zeros((0, rows), dtype=np.int64))
        # one output (the usual step) needs no concatenation: one PyTorch call less per step
        parts = [f for _, f in outputs]
        frames = self._frames_down.download(parts[0] if len(parts) == 1 else torch.cat(parts))
        seqs = [seq for group, _ in outputs for seq in group]
        if len(seqs) != len(frames):
            raise RuntimeError(f"{len(frames)} frames for {len(seqs)} samplers")
        return StepFrames(seqs, frames)

    def _prefill(self, batch: ScheduledBatch) -> PrefillOutput:
        """Queue the slow transformer over the batch's new positions (general path)."""
        inputs = build_inputs(batch, self.cache.layout.block_size, self.device)
        attn = TorchPagedAttention(self.cache, inputs.meta)
        model = self.model
        hidden = model.forward_slow(model.embed(inputs.columns), inputs.positions, attn)
        for seq, n in batch.items:
            seq.num_computed += n
        last = hidden[0, inputs.sample_rows] if inputs.samplers else hidden[0, :0]
        return PrefillOutput(inputs.samplers, last)

    def _sample_general(self, prefill: PrefillOutput) -> list[tuple[list[Sequence], Tensor]]:
        """Frames of the sampling rows, eagerly."""
        if not prefill.samplers:
            return []
        sampling, windows = build_sampling_inputs(prefill.samplers).to(self.device)
        model, last = self.model, prefill.hidden
        logits = model.slow_logits(last)
        frames, redone = sample_frame(model, last, logits, sampling, windows, self.top_k_prefilter)
        self._eager_full_sort_rows += redone
        return [(prefill.samplers, frames)]

    def _sample_prefill(self, prefill: PrefillOutput) -> tuple[list[Sequence], Tensor]:
        """Frames of the prefill rows: the captured frame head when it fits, else eagerly."""
        graphs, seqs = self.graphs, prefill.samplers
        if graphs is None or len(seqs) > graphs.max_batch:
            return self._sample_general(prefill)[0]
        host = build_sampling_inputs(seqs)
        return seqs, graphs.run_head(prefill.hidden, host)

    def _launch_rows(
        self, items: list[tuple[Sequence, int]], carry: FrameCarry | None = None
    ) -> RowsLaunch:
        """Queue the first half of a static step with one row per scheduled position."""
        block_size = self.cache.layout.block_size
        host, samplers = build_row_inputs(items, block_size, self.max_blocks, self.rows)
        rows, live = host.columns.shape[0], len(samplers)
        plan = carry_plan(samplers, carry)
        carried = None
        if plan is not None and carry is not None:
            carried = (carry.frames, to_device(torch.from_numpy(plan), self.device))
        if self.graphs is not None and rows <= self.graphs.max_batch:
            launched = self.graphs.launch(host, live, carried)
        else:
            inputs = host.to(self.device)
            if carried is not None:
                carry_frames_(inputs, *carried)
            k = self.top_k_prefilter
            step = decode_step_token(self.model, self.cache, inputs, self.use_triton, k)
            launched = DecodeLaunch(step, inputs, live)
        for seq, n in items:
            seq.num_computed += n
        return RowsLaunch(samplers, launched)

    def _finish_rows(self, rows: RowsLaunch) -> tuple[list[Sequence], Tensor]:
        """Resample the inexact rows (host sync), run the second half; the samplers' frames."""
        launched = rows.launched
        if launched.captured is not None and self.graphs is not None:
            return rows.samplers, self.graphs.finish(launched)
        redone = resample_inexact_(self.model, launched.step, launched.inputs, launched.live)
        self._eager_full_sort_rows += redone
        frames = decode_step_codes(self.model, launched.step, launched.inputs, self.compile_codes)
        return rows.samplers, frames[: launched.live]
