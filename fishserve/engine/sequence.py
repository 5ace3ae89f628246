"""A request's generation state inside the engine.

One `Sequence` follows a request through all of its text segments. For the segment being
generated it holds the prompt columns, the frames generated so far, how many positions are
already in the KV cache, its block table, and the repetition-penalty window.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np
import torch
from torch import Tensor

from fishserve.engine.long_text import LongTextPlan
from fishserve.engine.sampling import REPETITION_WINDOW, SamplingParams


class Status(enum.Enum):
    """Where a sequence is: waiting for admission, running, or done."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    """Engine-side state of one request.

    Attributes:
        request_id: caller's id.
        plan: the request's segments and prompt history (`LongTextPlan`).
        params: sampling settings; `seed` the resolved 32-bit noise seed.
        max_new_tokens: frame budget per segment (0 = until the context ends).
        ignore_eos: keep generating past `<|im_end|>` until the budget (benchmarks).
        segment: index of the segment being generated.
        prompt: int64 (1 + nc, P) prompt of the current segment (CPU).
        prompt_np: the same prompt as a NumPy array (shares its memory; set by
            `start_segment`), so per-step bookkeeping makes no PyTorch call.
        frames: frames generated in the current segment, each an int64 NumPy array (1 + nc,).
        budget: frames this segment may generate (prompt + budget <= context).
        cut_at_budget: some segment ended at its budget rather than with the end token (the
            request finishes with reason "length").
        num_computed: positions of prompt + frames whose K/V are in the cache.
        block_table: KV blocks owned, in position order.
        window: int64 NumPy (1 + nc, 16) ring of the last 16 decode-loop frames (zeros at
            first).
        inflight: frames sampled by a launched step that the host has not read yet (0 or 1;
            only with the engine's asynchronous scheduling). They count as positions, so the
            next step can be scheduled before the frame's values are known.
        slot: its row of the scheduler's `PersistentBatch` while it runs, else -1 (while it
            holds one, `window` is a view of that row).
        first_scheduled_time: monotonic seconds of its first admission (None while it has
            never run: the requests real-time admission may hold, `engine.admission`).

    Per-step state is kept in NumPy: a NumPy operation on a small array keeps the GIL, while
    a PyTorch call releases and re-acquires it, which under a busy event loop costs up to a
    switch interval per call (hundreds of calls per step at large batch).
    """

    request_id: str
    plan: LongTextPlan
    params: SamplingParams
    seed: int
    max_new_tokens: int
    ignore_eos: bool = False
    arrival_time: float = field(default_factory=time.monotonic)
    segment: int = 0
    prompt: Tensor = field(default_factory=lambda: torch.empty(0))
    frames: list[np.ndarray] = field(default_factory=list)
    budget: int = 0
    cut_at_budget: bool = False
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    window: np.ndarray = field(default_factory=lambda: np.zeros((0, REPETITION_WINDOW), np.int64))
    inflight: int = 0
    prompt_np: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    status: Status = Status.WAITING
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    slot: int = -1

    def start_segment(self, prompt: Tensor, budget: int) -> None:
        """Reset the per-segment state for a new prompt (1 + nc, P)."""
        self.prompt = prompt
        self.prompt_np = prompt.numpy()
        self.budget = budget
        self.frames = []
        self.num_computed = 0
        self.inflight = 0
        self.window = np.zeros((prompt.shape[0], REPETITION_WINDOW), dtype=np.int64)

    @property
    def num_positions(self) -> int:
        """Prompt positions plus generated frames of the current segment (in flight too)."""
        return self.prompt_np.shape[1] + len(self.frames) + self.inflight

    @property
    def num_frames(self) -> int:
        """Frames sampled in the current segment, the one in flight included."""
        return len(self.frames) + self.inflight

    @property
    def num_pending(self) -> int:
        """Positions not yet in the KV cache (1 for a decode step); 0 once the frame in
        flight is the segment's last by its budget (nothing more may be computed)."""
        if self.inflight and self.num_frames >= self.budget:
            return 0
        return self.num_positions - self.num_computed

    @property
    def column_in_flight(self) -> bool:
        """Whether the next position's input column is the frame in flight (its values are
        on the device only: an asynchronous step copies them there)."""
        return self.inflight > 0 and self.num_computed >= self.num_positions - self.inflight

    @property
    def inflight_window_slot(self) -> int:
        """The penalty-window column the frame in flight will take (`add_frame`'s ring), or
        -1 when it is the segment's first (prefill) frame, which takes none."""
        decode_index = len(self.frames) - 1
        return decode_index % REPETITION_WINDOW if decode_index >= 0 else -1

    def columns(self, start: int, end: int) -> Tensor:
        """Input columns int64 (1 + nc, end - start) of positions [start, end)."""
        return torch.from_numpy(self.columns_np(start, end))

    def columns_np(self, start: int, end: int) -> np.ndarray:
        """`columns` as a NumPy array (no PyTorch operation; see the class docstring)."""
        p = self.prompt_np.shape[1]
        parts = []
        if start < p:
            parts.append(self.prompt_np[:, start : min(end, p)])
        if end > p:
            frames = self.frames[max(start - p, 0) : end - p]
            parts.append(np.stack(frames, axis=1))
        return np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]

    def column_np(self, index: int) -> np.ndarray:
        """The input column int64 (1 + nc,) of position `index` (a view; no copy)."""
        p = self.prompt_np.shape[1]
        return self.prompt_np[:, index] if index < p else self.frames[index - p]

    def add_frame(self, frame: np.ndarray | Tensor) -> None:
        """Record a sampled frame (1 + nc,); decode-loop frames enter the penalty window.

        The window is a ring: decode iteration j writes column j % 16, so before iteration i
        it holds frames [0, i) padded with zeros while i < 16, else [i - 16, i) (spec §5; the
        penalty does not depend on the order of the window).
        """
        row = np.asarray(frame, dtype=np.int64)
        decode_index = len(self.frames) - 1  # the first (prefill) frame is index -1
        if decode_index >= 0:
            self.window[:, decode_index % REPETITION_WINDOW] = row
        self.frames.append(row)


def seq_values(seqs: list[Sequence], name: str, dtype: type = np.int64) -> np.ndarray:
    """(len(seqs),) array of `dtype` (default int64) of attribute `name` of each sequence,
    read in one C-level pass (no Python loop per sequence)."""
    return np.fromiter(map(attrgetter(name), seqs), dtype, len(seqs))


def frame_counts(seqs: list[Sequence]) -> np.ndarray:
    """int64 (len(seqs),) `len(seq.frames)` of each sequence (frames read, not in flight)."""
    return np.fromiter(map(len, map(attrgetter("frames"), seqs)), np.int64, len(seqs))


def pending_positions(
    seqs: list[Sequence], prompt_lens: np.ndarray, computed: np.ndarray
) -> np.ndarray:
    """`Sequence.num_pending` of each of `seqs`, int64 (len(seqs),), given their prompt
    lengths and `num_computed`, int64 (len(seqs),) each (one C-level pass per attribute
    read, the rest vectorised)."""
    frames, inflight = frame_counts(seqs), seq_values(seqs, "inflight")
    budget = seq_values(seqs, "budget")
    pending = prompt_lens + frames + inflight - computed
    pending[(inflight > 0) & (frames + inflight >= budget)] = 0  # the segment's last frame
    return pending
