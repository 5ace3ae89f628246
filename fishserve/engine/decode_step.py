"""The decode step with static shapes (captured in CUDA graphs by `graph_decoder`).

A decode step (every running sequence adds one frame) is a fixed sequence of kernels for a
given batch size, in two halves: (1) embed the last frames, run the slow transformer over one
position per sequence with paged attention and sample the token (over the top-k candidates,
`sample_prefiltered`); (2) run the fast transformer over the codebooks and sample them. Between
the halves, the rows whose nucleus is not inside the top-k candidates (rare with a trained model)
are resampled over the full vocabulary, for those rows only (`resample_rows_of_`; from a
captured graph in `graph_decoder`, else eagerly), so every token is the one the full computation
gives.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, fields
from operator import attrgetter, itemgetter

import numpy as np
import torch
from torch import Tensor

from fishserve.engine.decode_attention import DecodeAttention, DecodeMetadata
from fishserve.engine.frame import (
    BatchSampling,
    inexact_rows,
    resample_rows_,
    sample_codebooks,
    sample_codebooks_compiled,
    sample_token,
)
from fishserve.engine.host_copy import copy_to_device_, to_device
from fishserve.engine.kv_cache import PagedKVCache
from fishserve.engine.persistent_batch import PersistentBatch
from fishserve.engine.sampling import REPETITION_WINDOW
from fishserve.engine.sequence import Sequence, frame_counts, seq_values
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

    def copy_rows_(self, other: DecodeInputs, start: int = 0, stop: int | None = None) -> None:
        """Copy `other`'s rows [start, stop) (default: to its end) into the same rows of self."""
        n = other.columns.shape[0] if stop is None else stop
        for f in fields(self):
            dst, src = getattr(self, f.name), getattr(other, f.name)
            dst[start:n].copy_(src[start:n], non_blocking=True)

    def to(self, device: torch.device) -> DecodeInputs:
        """A copy on `device` (pinned host memory makes the copy asynchronous)."""
        return DecodeInputs(
            **{f.name: to_device(getattr(self, f.name), device) for f in fields(self)}
        )


def stack_rows(arrays: list[np.ndarray]) -> np.ndarray:
    """`np.stack(arrays)` of equal-shape arrays (at least one) as one concatenation:
    2-4x faster for hundreds of small arrays (per-step inputs of a large batch)."""
    return np.concatenate(arrays).reshape(len(arrays), *arrays[0].shape)


def _block_tables(items: list[tuple[Sequence, int]], max_blocks: int) -> np.ndarray:
    """int32 (len(items), max_blocks) block tables, zero-padded (one NumPy scatter)."""
    lengths = np.fromiter((len(q.block_table) for q, _ in items), np.int64, len(items))
    flat = np.fromiter(
        itertools.chain.from_iterable(q.block_table for q, _ in items), np.int32, int(lengths.sum())
    )
    tables = np.zeros((len(items), max_blocks), dtype=np.int32)
    tables[np.arange(max_blocks) < lengths[:, None]] = flat
    return tables


def _row_layout(items: list[tuple[Sequence, int]]) -> tuple[np.ndarray, list[Sequence]]:
    """Order of the flattened positions: each sampler's last position first, then the rest.

    Returns ``(order, samplers)``: int64 (R,) indices into the items' positions laid end to
    end, and the sequences that sample a frame this step (their rows are the first S).
    """
    seqs = [seq for seq, n in items if n == 1 and seq.num_computed + 1 == seq.num_positions]
    if len(seqs) == len(items):  # a pure decode step: every row samples, in order
        return np.arange(len(items)), seqs
    first, rest, samplers, r = [], [], [], 0
    for seq, n in items:
        if seq.num_computed + n == seq.num_positions:
            first.append(r + n - 1)
            rest.extend(range(r, r + n - 1))
            samplers.append(seq)
        else:
            rest.extend(range(r, r + n))
        r += n
    return np.asarray(first + rest, dtype=np.int64), samplers


def _column(seq: Sequence) -> np.ndarray:
    """The input column int64 (1 + nc,) of `seq`'s next position; zeros when it is the frame
    in flight, which `carry_frames_` writes on the device."""
    if seq.column_in_flight:
        return np.zeros(seq.prompt_np.shape[0], dtype=np.int64)
    return seq.column_np(seq.num_computed)


def _columns(seq: Sequence, n: int) -> np.ndarray:
    """Input columns int64 (1 + nc, n) of `seq`'s next n positions (see `_column`)."""
    if n == 1:
        return _column(seq)[:, None]
    return seq.columns_np(seq.num_computed, seq.num_computed + n)


def build_row_inputs(
    items: list[tuple[Sequence, int]],
    block_size: int,
    max_blocks: int,
    rows: PersistentBatch | None = None,
) -> tuple[DecodeInputs, list[Sequence]]:
    """Host inputs of a step that runs every scheduled position as one row of a decode step.

    A prefill chunk of n positions becomes n rows, each attending its own prefix through the
    sequence's block table (the K/V of every row is written before any row attends), so new
    prompts join the decoding batch's static path. Rows are ordered samplers first: the S
    sequences that complete their pending positions sample from rows 0..S-1; the other rows
    carry neutral sampling settings and their outputs are discarded. A sequence whose next
    column is its frame in flight (asynchronous scheduling) gets zeros in that column and
    its window; `carry_frames_` fills them on the device.

    With `rows` (the scheduler's `PersistentBatch`) and every sequence holding a slot, the
    slowly changing values are gathered from it (`gather_row_inputs`); otherwise they are read
    from each sequence. Both give the same inputs.

    Returns:
        ``(inputs, samplers)``: DecodeInputs of R = sum(n) rows, and the S samplers in order.
    """
    if rows is not None and items and rows.block_tables.shape[1] == max_blocks:
        slots = seq_values(list(map(itemgetter(0), items)), "slot")
        if slots.min() >= 0:
            return gather_row_inputs(items, slots, block_size, rows)
    return build_row_inputs_per_sequence(items, block_size, max_blocks)


def build_row_inputs_per_sequence(
    items: list[tuple[Sequence, int]], block_size: int, max_blocks: int
) -> tuple[DecodeInputs, list[Sequence]]:
    """`build_row_inputs` reading every value from the sequences (no persistent rows)."""
    order, samplers = _row_layout(items)
    tables = _block_tables(items, max_blocks)
    if all(n == 1 for _, n in items):  # one column per sequence
        columns = stack_rows([_column(q) for q, _ in items])
        positions = np.fromiter((q.num_computed for q, _ in items), np.int64, len(items))
    else:
        parts = [_columns(q, n) for q, n in items]
        columns = np.ascontiguousarray(np.concatenate(parts, 1).T)
        spans = [np.arange(q.num_computed, q.num_computed + n) for q, n in items]
        positions = np.concatenate(spans)
        tables = np.repeat(tables, [n for _, n in items], axis=0)
    if not len(samplers) == len(order) == len(items):  # else every item is one sampling row
        columns, positions, tables = columns[order], positions[order], tables[order]
    pad, shape = len(order) - len(samplers), tuple(items[0][0].window.shape)
    sampling = build_sampling_inputs(samplers, pad, shape)
    return _decode_inputs(columns, positions, tables, block_size, sampling), samplers


def _decode_inputs(
    columns: np.ndarray,
    positions: np.ndarray,
    tables: np.ndarray,
    block_size: int,
    sampling: SamplingInputs,
) -> DecodeInputs:
    """DecodeInputs of R rows from int64 columns (R, 1 + nc), int64 positions (R,), int32
    block tables (R, max_blocks) and the sampling rows (slot mapping and context lengths
    follow from the positions)."""
    rows = np.arange(len(positions))
    slots = tables[rows, positions // block_size].astype(np.int64) * block_size
    slots += positions % block_size
    return DecodeInputs(
        columns=torch.from_numpy(columns),
        positions=torch.from_numpy(positions),
        slot_mapping=torch.from_numpy(slots),
        block_tables=torch.from_numpy(tables),
        context_lens=torch.from_numpy((positions + 1).astype(np.int32)),
        **{f.name: getattr(sampling, f.name) for f in fields(sampling)},
    )


def gather_row_inputs(
    items: list[tuple[Sequence, int]], slots: np.ndarray, block_size: int, rows: PersistentBatch
) -> tuple[DecodeInputs, list[Sequence]]:
    """`build_row_inputs` for sequences holding the slots int64 (len(items),) of `rows`.

    Per sequence only its counters are read (positions computed, frames, frame in flight) and
    its last column; the rest is gathered from `rows` with one index per field.
    """
    seqs = list(map(itemgetter(0), items))
    counts = np.fromiter(map(itemgetter(1), items), np.int64, len(items))
    computed = seq_values(seqs, "num_computed")
    num_frames = frame_counts(seqs)
    inflight = seq_values(seqs, "inflight")
    samples = computed + counts == rows.prompt_lens[slots] + num_frames + inflight
    tables = rows.block_tables[slots]
    if counts.max() == 1 and samples.all():  # a pure decode step: every row samples, in order
        columns, positions, samplers = _sampler_columns(seqs, inflight > 0), computed, seqs
    else:
        columns, positions, tables, samplers = _mixed_rows(
            seqs, counts, computed, samples, inflight, tables
        )
    pad = len(positions) - len(samplers)
    sampling = gather_sampling_inputs(rows, slots[samples], (num_frames + inflight)[samples], pad)
    return _decode_inputs(columns, positions, tables, block_size, sampling), samplers


def _sampler_columns(seqs: list[Sequence], in_flight: np.ndarray) -> np.ndarray:
    """int64 (len(seqs), 1 + nc) input columns of sequences that compute one position, their
    last (`_column`): the last frame, or the last prompt column before the first frame; zeros
    where the column is in flight (bool (len(seqs),))."""
    columns = stack_rows([q.frames[-1] if q.frames else q.prompt_np[:, -1] for q in seqs])
    columns[in_flight] = 0
    return columns


def _mixed_rows(
    seqs: list[Sequence],
    counts: np.ndarray,
    computed: np.ndarray,
    samples: np.ndarray,
    inflight: np.ndarray,
    tables: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Sequence]]:
    """Columns, positions and block tables of a step with prefill chunks, samplers first.

    Args:
        counts, computed, inflight: int64 (N,) positions scheduled, computed, frames in flight.
        samples: bool (N,) which items sample; tables: int32 (N, max_blocks) per item.

    Returns:
        int64 columns (R, 1 + nc), int64 positions (R,), int32 tables (R, max_blocks) in row
        order (`_row_layout`), and the samplers in item order.
    """
    ends = np.cumsum(counts)
    starts = ends - counts
    total = int(ends[-1])
    positions = np.repeat(computed - starts, counts) + np.arange(total)
    columns = np.empty((total, seqs[0].prompt_np.shape[0]), dtype=np.int64)
    single = np.flatnonzero((counts == 1) & samples)
    if len(single):
        picked = [seqs[i] for i in single]
        columns[starts[single]] = _sampler_columns(picked, inflight[single] > 0)
    for i in np.flatnonzero((counts > 1) | ~samples).tolist():
        columns[starts[i] : ends[i]] = _columns(seqs[i], int(counts[i])).T
    last = (ends - 1)[samples]
    order = np.concatenate([last, np.delete(np.arange(total), last)])
    samplers = [seqs[i] for i in np.flatnonzero(samples)]
    tables = np.repeat(tables, counts, axis=0)
    return columns[order], positions[order], tables[order], samplers


@dataclass
class SamplingInputs:
    """Host tensors of the sampling half of a step for S rows (see `DecodeInputs`).

    Shapes: temperature, top_p, penalty (S,) float32; seeds, segments, frames (S,) int64;
    windows (S, 1 + nc, 16) int64.
    """

    temperature: Tensor
    top_p: Tensor
    penalty: Tensor
    seeds: Tensor
    segments: Tensor
    frames: Tensor
    windows: Tensor

    def copy_into_(self, inputs: DecodeInputs) -> None:
        """Write these rows into the first S rows of `inputs`' sampling fields."""
        n = self.seeds.shape[0]
        for f in fields(self):
            copy_to_device_(getattr(inputs, f.name)[:n], getattr(self, f.name))

    def to(self, device: torch.device) -> tuple[BatchSampling, Tensor]:
        """The device `BatchSampling` and windows (copied without synchronising)."""

        def dev(t: Tensor) -> Tensor:
            return to_device(t, device)

        sampling = BatchSampling(
            dev(self.temperature),
            dev(self.top_p),
            dev(self.penalty),
            dev(self.seeds),
            dev(self.segments),
            dev(self.frames),
        )
        return sampling, dev(self.windows)


def build_sampling_inputs(
    seqs: list[Sequence], pad: int = 0, window_shape: tuple[int, ...] = ()
) -> SamplingInputs:
    """Host sampling tensors of `seqs`, each about to sample its next frame.

    A sequence sampling the first frame of a segment (the prefill frame) uses no repetition
    penalty (spec §5): its penalty is 1.0, which leaves the logits unchanged. `pad` more rows
    get neutral settings (temperature, top_p and penalty 1, seed 0, an empty window of
    `window_shape` (1 + nc, 16)): rows whose samples nobody reads.
    """

    n = len(seqs)
    floats = np.ones((n + pad, 3), dtype=np.float32)  # temperature, top_p, penalty
    ints = np.zeros((n + pad, 3), dtype=np.int64)  # seed, segment, frames
    if n:
        floats[:n] = [
            (
                s.params.temperature,
                s.params.top_p,
                s.params.repetition_penalty if s.num_frames else 1.0,
            )
            for s in seqs
        ]
        ints[:n] = [(s.seed, s.segment, s.num_frames) for s in seqs]
    windows = [seq.window for seq in seqs]
    if pad:
        windows.extend([np.zeros(window_shape, dtype=np.int64)] * pad)
    return _sampling_inputs(floats.T.copy(), ints.T.copy(), stack_rows(windows))


def _sampling_inputs(floats: np.ndarray, ints: np.ndarray, windows: np.ndarray) -> SamplingInputs:
    """`SamplingInputs` of float32 (3, S) rows (temperature, top_p, penalty), int64 (3, S)
    rows (seed, segment, frames) and int64 windows (S, 1 + nc, 16), sharing their memory."""
    f, i = torch.from_numpy(floats), torch.from_numpy(ints)
    return SamplingInputs(
        temperature=f[0],
        top_p=f[1],
        penalty=f[2],
        seeds=i[0],
        segments=i[1],
        frames=i[2],
        windows=torch.from_numpy(windows),
    )


def gather_sampling_inputs(
    rows: PersistentBatch, slots: np.ndarray, num_frames: np.ndarray, pad: int = 0
) -> SamplingInputs:
    """`build_sampling_inputs` of the sequences holding `slots` int64 (S,) of `rows`, whose
    frame counts (`Sequence.num_frames`) are `num_frames` int64 (S,); `pad` neutral rows."""
    n = len(slots)
    floats = np.ones((3, n + pad), dtype=np.float32)  # temperature, top_p, penalty
    ints = np.zeros((3, n + pad), dtype=np.int64)  # seed, segment, frames
    floats[0, :n] = rows.temperature[slots]
    floats[1, :n] = rows.top_p[slots]
    floats[2, :n] = np.where(num_frames > 0, rows.repetition_penalty[slots], np.float32(1.0))
    ints[0, :n] = rows.seeds[slots]
    ints[1, :n] = rows.segments[slots]
    ints[2, :n] = num_frames
    windows = rows.windows[slots]
    if pad:
        windows = np.concatenate([windows, np.zeros((pad, *windows.shape[1:]), np.int64)])
    return _sampling_inputs(floats, ints, windows)


@dataclass
class FrameCarry:
    """The frames of a launched step, read on the device by the step after it
    (asynchronous scheduling: that step is launched before the host has the values).

    Attributes:
        frames: int64 (S, 1 + nc) frames of the launched step's samplers, on the device.
        rows: ``id(sequence)`` -> the sequence's row in `frames`.
    """

    frames: Tensor
    rows: dict[int, int]


def carry_plan(samplers: list[Sequence], carry: FrameCarry | None) -> np.ndarray | None:
    """Where the frames in flight go: int64 (3, K) rows of (destination row, row of
    `carry.frames`, penalty-window column or -1) for the K samplers whose next column is in
    flight, or None when there are none.

    Raises:
        RuntimeError: a sampler's column is in flight but `carry` does not hold its frame.
    """
    if not any(map(attrgetter("inflight"), samplers)):  # no frame in flight (sync steps)
        return None
    plan = [
        (row, seq, seq.inflight_window_slot)
        for row, seq in enumerate(samplers)
        if seq.column_in_flight
    ]
    if not plan:
        return None
    if carry is None or any(id(seq) not in carry.rows for _, seq, _ in plan):
        raise RuntimeError("a frame in flight is missing from the previous step's frames")
    return np.array([(row, carry.rows[id(seq)], slot) for row, seq, slot in plan]).T.copy()


def carry_frames_(inputs: DecodeInputs, frames: Tensor, plan: Tensor) -> None:
    """Write frames in flight into a step's device inputs (no host sync).

    Args:
        inputs: the step's device inputs; their `columns` rows and `windows` columns named by
            `plan` are overwritten.
        frames: int64 (S, 1 + nc) the previous step's frames (`FrameCarry.frames`).
        plan: int64 (3, K) on the device, from `carry_plan`.
    """
    dst, src, slot = plan[0], plan[1], plan[2]
    rows = frames[src]
    inputs.columns[dst] = rows
    column = slot.clamp(min=0)  # a first (prefill) frame enters no window: keep the column
    kept = inputs.windows[dst, :, column]
    inputs.windows[dst, :, column] = torch.where(slot[:, None] >= 0, rows, kept)


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
    resample_rows_of_(model, step, inputs, rows)
    return int(rows.numel())


def resample_rows_of_(
    model: DualARTransformer, step: TokenStep, inputs: DecodeInputs, rows: Tensor
) -> None:
    """Overwrite `step.token[rows]` with each row's full-vocabulary draw (no host sync).

    `rows`: int64 (R,) device indices; a row may repeat (a captured call pads its rows with
    copies of one of them): each copy draws the same token, from the same seed and counter.
    """
    # Same shape as the step's own logits (bit-identical GEMM), then the rows: logits of a
    # smaller matmul can round differently and change a token.
    logits = model.slow_logits(step.hidden)[rows]
    resample_rows_(step.token, rows, logits, sampling_of(inputs), inputs.windows[:, 0])


def decode_step_codes(
    model: DualARTransformer, step: TokenStep, inputs: DecodeInputs, compiled: bool = False
) -> Tensor:
    """Second half: fast transformer; frames int64 (B, 1 + nc) (no host sync).

    `compiled`: run it as one torch.compile graph on a GPU (`sample_codebooks_compiled`).
    """
    fn = sample_codebooks_compiled if compiled else sample_codebooks
    return fn(model, step.hidden, step.token, sampling_of(inputs), inputs.windows)
