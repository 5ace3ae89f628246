"""Persistent per-row state of the running sequences: a step's slowly changing inputs.

A step of B sequences needs, for each of them, values that rarely change: the sampling
settings, the seed, the segment and its prompt length, the KV block table, and the 16-wide
repetition-penalty window (one column per frame). Reading them from B `Sequence` objects is a
Python loop per step (about a millisecond of host time at B = 512, while the device waits).
`PersistentBatch` keeps them in preallocated NumPy arrays with one row, a slot, per running
sequence, written when the sequence joins the running set, when it gets a new block and (the
window) when it samples a frame; a step gathers its rows with one fancy index per field
(`fishserve.engine.decode_step.build_row_inputs`).

Lifecycle (kept by the `Scheduler`): a sequence joins at admission and leaves whenever it leaves
the running list (`Scheduler.release`: preemption, end of a segment, finish, cancel, failure);
`Sequence.slot` is its row, -1 outside. While it holds a slot, its `window` is a view of its row
of `windows`, so every write to the window (`Sequence.add_frame`, the engine's vectorised frame
bookkeeping) lands in the persistent array; on leaving it gets a copy of its own back. Its
sampling settings, seed, segment and prompt are fixed while it runs: a new segment starts only
just before the engine requeues the sequence (it leaves and joins again).
"""

from __future__ import annotations

import numpy as np

from fishserve.engine.sampling import REPETITION_WINDOW
from fishserve.engine.sequence import Sequence


class PersistentBatch:
    """Slot-indexed arrays of the running sequences (see the module docstring).

    Args:
        capacity: slots (the scheduler's `max_num_seqs`: running sequences at most).
        num_rows: rows of a frame (1 + nc).
        max_blocks: block-table width (the runner's `max_blocks`).

    Attributes:
        temperature, top_p, repetition_penalty: float32 (capacity,) sampling settings.
        seeds, segments: int64 (capacity,) noise seed and segment index.
        prompt_lens: int64 (capacity,) positions of the current segment's prompt.
        block_tables: int32 (capacity, max_blocks) block ids, zero-padded.
        num_blocks: int64 (capacity,) entries of each row of `block_tables` in use.
        windows: int64 (capacity, num_rows, 16) repetition-penalty windows (a running
            sequence's `window` is a view of its row).
    """

    def __init__(self, capacity: int, num_rows: int, max_blocks: int) -> None:
        if capacity < 1 or num_rows < 1 or max_blocks < 1:
            raise ValueError(f"bad persistent batch size {capacity}x{num_rows}x{max_blocks}")
        self.capacity = capacity
        self.temperature = np.ones(capacity, dtype=np.float32)
        self.top_p = np.ones(capacity, dtype=np.float32)
        self.repetition_penalty = np.ones(capacity, dtype=np.float32)
        self.seeds = np.zeros(capacity, dtype=np.int64)
        self.segments = np.zeros(capacity, dtype=np.int64)
        self.prompt_lens = np.zeros(capacity, dtype=np.int64)
        self.block_tables = np.zeros((capacity, max_blocks), dtype=np.int32)
        self.num_blocks = np.zeros(capacity, dtype=np.int64)
        self.windows = np.zeros((capacity, num_rows, REPETITION_WINDOW), dtype=np.int64)
        self._owners: list[Sequence | None] = [None] * capacity
        self._free = list(range(capacity - 1, -1, -1))  # pop() hands out the lowest slot

    @property
    def num_free(self) -> int:
        """Slots no sequence holds."""
        return len(self._free)

    def owner(self, slot: int) -> Sequence | None:
        """The sequence holding `slot`, or None."""
        return self._owners[slot]

    def join(self, seq: Sequence) -> None:
        """Give `seq` a slot and write its values there; its window becomes a view of it.

        Raises:
            ValueError: `seq` already holds a slot, or its window or block table does not fit.
            RuntimeError: every slot is taken.
        """
        if seq.slot >= 0:
            raise ValueError(f"sequence {seq.request_id!r} already holds slot {seq.slot}")
        if seq.window.shape != self.windows.shape[1:]:
            raise ValueError(f"window {seq.window.shape} does not fit {self.windows.shape[1:]}")
        if not self._free:
            raise RuntimeError("no free slot in the persistent batch")
        slot = self._free.pop()
        params = seq.params
        self.temperature[slot] = params.temperature
        self.top_p[slot] = params.top_p
        self.repetition_penalty[slot] = params.repetition_penalty
        self.seeds[slot] = seq.seed
        self.segments[slot] = seq.segment
        self.prompt_lens[slot] = seq.prompt_np.shape[1]
        self.windows[slot] = seq.window
        seq.window = self.windows[slot]
        self.block_tables[slot] = 0
        self.num_blocks[slot] = 0
        self._owners[slot] = seq
        seq.slot = slot
        self.sync_blocks(seq)

    def leave(self, seq: Sequence) -> None:
        """Free `seq`'s slot (no-op without one); its window becomes a copy of its own.

        Raises:
            RuntimeError: the slot is held by another sequence.
        """
        slot = seq.slot
        if slot < 0:
            return
        if self._owners[slot] is not seq:
            raise RuntimeError(f"slot {slot} is not held by {seq.request_id!r}")
        if np.shares_memory(seq.window, self.windows[slot]):
            seq.window = seq.window.copy()
        self._owners[slot] = None
        seq.slot = -1
        self._free.append(slot)

    def sync_blocks(self, seq: Sequence) -> None:
        """Write the blocks `seq`'s table gained since the last sync into its row.

        Raises:
            ValueError: the table is longer than a row.
        """
        slot, table = seq.slot, seq.block_table
        have, width = int(self.num_blocks[slot]), self.block_tables.shape[1]
        if len(table) > width:
            raise ValueError(f"block table of {len(table)} blocks exceeds {width}")
        if len(table) < have:  # never while running; rewrite the row rather than trust it
            self.block_tables[slot] = 0
            have = 0
        self.block_tables[slot, have : len(table)] = table[have:]
        self.num_blocks[slot] = len(table)

    def mismatches(self, seq: Sequence) -> list[str]:
        """Names of the fields whose persistent values differ from `seq`'s (empty when in
        sync; tests and debugging). A sequence without a slot has none."""
        slot = seq.slot
        if slot < 0:
            return []
        table = np.zeros(self.block_tables.shape[1], dtype=np.int32)
        table[: len(seq.block_table)] = seq.block_table
        params = seq.params
        want = {
            "owner": self._owners[slot] is seq,
            "temperature": self.temperature[slot] == np.float32(params.temperature),
            "top_p": self.top_p[slot] == np.float32(params.top_p),
            "repetition_penalty": self.repetition_penalty[slot]
            == np.float32(params.repetition_penalty),
            "seeds": self.seeds[slot] == seq.seed,
            "segments": self.segments[slot] == seq.segment,
            "prompt_lens": self.prompt_lens[slot] == seq.prompt_np.shape[1],
            "block_tables": np.array_equal(self.block_tables[slot], table),
            "num_blocks": self.num_blocks[slot] == len(seq.block_table),
            "windows": np.shares_memory(seq.window, self.windows[slot]),
        }
        return [name for name, ok in want.items() if not ok]
