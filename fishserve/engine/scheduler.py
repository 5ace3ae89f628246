"""Who runs this step: admission, chunked prefill, decode, preemption (continuous batching).

Every step, running sequences are given their next positions first (one position for a
sequence in decode; a chunk of the prompt for one still in prefill), then waiting sequences
are admitted first-come-first-served while the caps allow:

* `max_num_seqs` running sequences;
* `max_num_batched_tokens` positions per step (long prompts are prefilled in chunks);
* free KV blocks: a waiting sequence is admitted only if the blocks for its whole prompt are
  free, so an admitted prefill never stalls for lack of blocks;
* with an `admission` check (the engine's real-time admission, `engine.admission`), a sequence
  that has never run waits while the check refuses it.

When a running sequence needs a new block and none is free, the newest running sequence is
preempted: its blocks are freed and it goes back to the head of the waiting queue, to be
recomputed (prompt + frames so far) when blocks free up. Nothing fails for lack of blocks.

With a `PersistentBatch`, a sequence holds a slot of it exactly while it is in the running list
(joins at admission, leaves in `release`), and its row's block table follows its growth.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter

import numpy as np

from fishserve.engine.block_manager import BlockManager
from fishserve.engine.persistent_batch import PersistentBatch
from fishserve.engine.sequence import Sequence, Status, pending_positions, seq_values


@dataclass(frozen=True)
class SchedulerConfig:
    """Caps of the scheduler.

    Attributes:
        max_num_seqs: running sequences at most.
        max_num_batched_tokens: positions computed per step at most (>= max_num_seqs).
    """

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")


@dataclass
class ScheduledBatch:
    """One step's work: (sequence, number of positions) in batch order.

    A sequence samples a frame this step when its chunk reaches its last pending position.
    """

    items: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Positions computed this step."""
        return sum(map(itemgetter(1), self.items))

    def __bool__(self) -> bool:
        return bool(self.items)


class Scheduler:
    """Waiting and running queues over a `BlockManager`.

    Args:
        rows: the running sequences' persistent rows (`PersistentBatch`, at least
            `max_num_seqs` slots), kept in step with the running list; None: none kept.
        admission: called with the number of running sequences before a sequence that has
            never run is admitted; False holds it (and, first come first served, those behind
            it) for this step. Sequences that ran before (preempted, or between segments) are
            not asked about. None: no such check.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        blocks: BlockManager,
        rows: PersistentBatch | None = None,
        admission: Callable[[int], bool] | None = None,
    ) -> None:
        if rows is not None and rows.capacity < config.max_num_seqs:
            raise ValueError(f"{rows.capacity} persistent rows for {config.max_num_seqs} seqs")
        self.config = config
        self.blocks = blocks
        self.rows = rows
        self.admission = admission
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence (FCFS)."""
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def requeue(self, seq: Sequence) -> None:
        """Put a sequence that is between segments back at the head of the waiting queue
        (once: a preempted sequence is already in it)."""
        self.release(seq)
        if seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)

    def release(self, seq: Sequence) -> None:
        """Free a sequence's blocks and drop it from the running list (finish, fail, cancel)."""
        self.blocks.release(seq.block_table)
        seq.num_computed = 0
        if seq in self.running:
            self.running.remove(seq)
        if self.rows is not None:
            self.rows.leave(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of the engine wherever it is, freeing its blocks."""
        self.release(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED

    def schedule(self, only: Callable[[Sequence], bool] | None = None) -> ScheduledBatch:
        """Decide this step's batch (see the module docstring).

        `only`: run just the running sequences it accepts (the engine's boost steps); waiting
        sequences are admitted as usual.
        """
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        planned = None if only is not None else self._plan_running(budget)
        if planned is None:
            budget = self._schedule_running(batch, budget, only)
        else:
            batch.items, budget = planned
        self._admit(batch, budget)
        return batch

    def _schedule_running(
        self, batch: ScheduledBatch, budget: int, only: Callable[[Sequence], bool] | None
    ) -> int:
        """Give the running sequences (those `only` accepts) their next positions in order,
        growing and preempting as needed; returns the budget left."""
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or budget == 0:
                continue
            if only is not None and not only(seq):
                continue
            n = min(seq.num_pending, budget)
            if n == 0:  # its frame in flight ends the segment (asynchronous scheduling)
                continue
            if not self._make_room(seq, seq.num_computed + n, batch):
                continue
            batch.items.append((seq, n))
            budget -= n
        return budget

    def _plan_running(self, budget: int) -> tuple[list[tuple[Sequence, int]], int] | None:
        """`_schedule_running` of every running sequence when no preemption is needed (the
        usual step), vectorised over the persistent rows: (items, budget left). None (nothing
        changed) without rows, or when the free blocks cannot cover every growth: the loop
        decides then."""
        rows, running = self.rows, self.running
        if rows is None or not running:
            return None
        statuses = list(map(attrgetter("status"), running))
        slots = seq_values(running, "slot")
        if statuses.count(Status.RUNNING) != len(running) or slots.min() < 0:
            return None
        computed = seq_values(running, "num_computed")
        pending = pending_positions(running, rows.prompt_lens[slots], computed)
        counts = np.clip(budget - (np.cumsum(pending) - pending), 0, pending)
        size = self.blocks.block_size
        need = np.maximum(-(-(computed + counts) // size) - rows.num_blocks[slots], 0)
        need[counts == 0] = 0
        if need.sum() > self.blocks.num_free:
            return None
        for i in np.flatnonzero(need).tolist():  # in order: the same blocks as the loop
            seq = running[i]
            self.blocks.grow(seq.block_table, int(computed[i] + counts[i]))
            rows.sync_blocks(seq)
        ns = counts.tolist()
        items = [(seq, n) for seq, n in zip(running, ns, strict=True) if n]
        return items, budget - sum(ns)

    def _make_room(self, seq: Sequence, positions: int, batch: ScheduledBatch) -> bool:
        """Grow `seq` to `positions`, preempting the newest running sequences if needed.

        Returns False when `seq` itself had to be preempted.
        """
        if len(seq.block_table) * self.blocks.block_size >= positions:
            return True  # the common decode step: the last block has room
        while not self.blocks.can_grow(seq.block_table, positions):
            victim = self.running[-1]
            self._preempt(victim, batch)
            if victim is seq:
                return False
        self.blocks.grow(seq.block_table, positions)
        if self.rows is not None:
            self.rows.sync_blocks(seq)
        return True

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        batch.items = [(s, n) for s, n in batch.items if s is not seq]
        self.requeue(seq)
        seq.num_preemptions += 1
        self.num_preemptions += 1
        batch.preempted.append(seq)

    def _admit(self, batch: ScheduledBatch, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if seq in batch.preempted:
                break  # do not re-admit what was just preempted in the same step
            if not self.blocks.can_grow(seq.block_table, seq.num_positions + 1):
                break  # FCFS: later requests do not overtake the head of the queue
            if seq.first_scheduled_time is None:
                if self.admission is not None and not self.admission(len(self.running)):
                    break
                seq.first_scheduled_time = time.monotonic()
            self.waiting.popleft()
            self.blocks.grow(seq.block_table, seq.num_positions)
            seq.status = Status.RUNNING
            self.running.append(seq)
            if self.rows is not None:
                self.rows.join(seq)
            n = min(seq.num_pending, budget)
            batch.items.append((seq, n))
            budget -= n
