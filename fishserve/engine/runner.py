"""Turns a scheduled batch into tensors, runs both transformers, and samples frames.

One step: the new positions of every scheduled sequence are flattened into a single row,
the slow transformer runs once over them with paged attention, the last position of each
sequence that completes its pending positions gives logits and a hidden state, and
`sample_frame` runs the fast transformer for all of those sequences together.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fishserve.engine.busy_timer import BusyTimer
from fishserve.engine.decode_step import CudaGraphDecoder, build_decode_inputs, decode_step
from fishserve.engine.frame import BatchSampling, sample_frame
from fishserve.engine.kv_cache import PagedKVCache
from fishserve.engine.paged_attention import AttentionMetadata, TorchPagedAttention
from fishserve.engine.scheduler import ScheduledBatch
from fishserve.engine.sequence import Sequence
from fishserve.engine.triton_attention import triton_available
from fishserve.models.dual_ar import DualARTransformer


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
    """Flatten the scheduled positions and build slot mapping and block tables."""
    columns, positions, slots, starts, contexts, tables = [], [], [], [0], [], []
    sample_rows, samplers = [], []
    for seq, n in batch.items:
        start = seq.num_computed
        pos = torch.arange(start, start + n)
        table = torch.tensor(seq.block_table, dtype=torch.int64)
        columns.append(seq.columns(start, start + n))
        positions.append(pos)
        slots.append(table[pos // block_size] * block_size + pos % block_size)
        starts.append(starts[-1] + n)
        contexts.append(start + n)
        tables.append(table)
        if start + n == seq.num_positions:
            sample_rows.append(starts[-1] - 1)
            samplers.append(seq)
    width = max(len(t) for t in tables)
    padded = torch.zeros(len(tables), width, dtype=torch.int64)
    for i, t in enumerate(tables):
        padded[i, : len(t)] = t
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slots).to(device),
        query_start=torch.tensor(starts, device=device),
        context_lens=torch.tensor(contexts, device=device),
        block_tables=padded.to(device),
        block_size=block_size,
    )
    return StepInputs(
        columns=torch.cat(columns, dim=1)[None].to(device),
        positions=torch.cat(positions).to(device),
        meta=meta,
        sample_rows=torch.tensor(sample_rows, dtype=torch.int64, device=device),
        samplers=samplers,
    )


def batch_sampling(seqs: list[Sequence], device: torch.device) -> tuple[BatchSampling, Tensor]:
    """Per-row sampling tensors and repetition windows (S, 1 + nc, 16) for `seqs`.

    A sequence sampling its first frame of a segment (the prefill frame) uses no penalty
    (spec §5): its penalty is set to 1.0, which leaves logits unchanged.
    """

    def col(values: list, dtype: torch.dtype) -> Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    first = [len(s.frames) == 0 for s in seqs]
    sampling = BatchSampling(
        temperature=col([s.params.temperature for s in seqs], torch.float32),
        top_p=col([s.params.top_p for s in seqs], torch.float32),
        penalty=col(
            [1.0 if f else s.params.repetition_penalty for s, f in zip(seqs, first, strict=True)],
            torch.float32,
        ),
        seeds=col([s.seed for s in seqs], torch.int64),
        segments=col([s.segment for s in seqs], torch.int64),
        frames=col([len(s.frames) for s in seqs], torch.int64),
    )
    windows = torch.stack([s.window for s in seqs]).to(device)
    return sampling, windows


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

    Decoding sequences take the static-shape path (`decode_step`): on CUDA through the fused
    Triton attention, replayed from CUDA graphs unless `enforce_eager`. Sequences with prefill
    positions in the same step take the general path (`TorchPagedAttention`) in a second pass.

    Attributes:
        busy_seconds: time the device spent on this runner's steps (see `execute`).

    Args:
        max_batch: largest decode batch (the engine's `max_num_seqs`).
        static_decode: use the static decode path on CPU too (tests); always on for CUDA.
        top_k_prefilter: candidates for the slow token's top-p (`sample_prefiltered`); 0: a
            full sort. Rows it cannot decide are resampled exactly.
    """

    def __init__(
        self,
        model: DualARTransformer,
        cache: PagedKVCache,
        max_batch: int = 1,
        enforce_eager: bool = False,
        static_decode: bool = False,
        top_k_prefilter: int = 0,
    ) -> None:
        self.model = model
        self.cache = cache
        self.device = model.embeddings.weight.device
        on_gpu = self.device.type == "cuda"
        self.use_triton = on_gpu and triton_available()
        self.static_decode = static_decode or on_gpu
        self.max_blocks = -(-model.config.max_seq_len // cache.layout.block_size)
        self.top_k_prefilter = top_k_prefilter
        self.busy = BusyTimer(self.device)
        self.graphs: CudaGraphDecoder | None = None
        if on_gpu and not enforce_eager:
            self.graphs = CudaGraphDecoder(
                model, cache, max_batch, self.max_blocks, self.use_triton, top_k_prefilter
            )

    @property
    def num_captures(self) -> int:
        """CUDA graphs captured (all at start-up; 0 when eager)."""
        return 0 if self.graphs is None else self.graphs.num_captures

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> list[tuple[Sequence, Tensor]]:
        """Compute the batch; return (sequence, frame int64 (1 + nc,) on CPU) for samplers.

        Advances `num_computed` of every scheduled sequence and adds the step's device time to
        `busy_seconds` (`BusyTimer`: CUDA events, no extra synchronisation).
        """
        with self.busy.measure():
            return self._execute(batch)

    @property
    def busy_seconds(self) -> float:
        """Device time of the completed steps (CUDA events; wall time on CPU)."""
        return self.busy.seconds

    def _execute(self, batch: ScheduledBatch) -> list[tuple[Sequence, Tensor]]:
        if not self.static_decode:
            return self._execute_general(batch)
        decode, other = split_decode(batch)
        results = self._execute_decode(decode) if decode else []
        if other.items:  # prefill chunks: the general path, for those sequences only
            results += self._execute_general(other)
        return results

    def _execute_general(self, batch: ScheduledBatch) -> list[tuple[Sequence, Tensor]]:
        inputs = build_inputs(batch, self.cache.layout.block_size, self.device)
        attn = TorchPagedAttention(self.cache, inputs.meta)
        model = self.model
        hidden = model.forward_slow(model.embed(inputs.columns), inputs.positions, attn)
        for seq, n in batch.items:
            seq.num_computed += n
        if not inputs.samplers:
            return []
        last = hidden[0, inputs.sample_rows]  # (S, D)
        sampling, windows = batch_sampling(inputs.samplers, self.device)
        logits = model.slow_logits(last)
        frames = sample_frame(model, last, logits, sampling, windows, self.top_k_prefilter)
        return list(zip(inputs.samplers, frames.cpu(), strict=True))

    def _execute_decode(self, seqs: list[Sequence]) -> list[tuple[Sequence, Tensor]]:
        host = build_decode_inputs(seqs, self.cache.layout.block_size, self.max_blocks)
        if self.graphs is not None and len(seqs) <= self.graphs.max_batch:
            frames = self.graphs.run(host)
        else:
            inputs = host.to(self.device)
            k = self.top_k_prefilter
            frames = decode_step(self.model, self.cache, inputs, self.use_triton, k)
        for seq in seqs:
            seq.num_computed += 1
        return list(zip(seqs, frames.cpu(), strict=True))
