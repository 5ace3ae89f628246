"""The persistent batch (`PersistentBatch`): the running sequences' rows stay equal to their own
values through joins, leaves, preemption, new blocks and frames, and the inputs, schedules and
events built from it are exactly those built from the sequences one by one."""

from __future__ import annotations

import copy
from dataclasses import fields

import numpy as np
import pytest
import torch

import fishserve.engine.runner as runner_module
from fishserve.engine.block_manager import BlockManager
from fishserve.engine.decode_step import (
    DecodeInputs,
    build_row_inputs,
    build_row_inputs_per_sequence,
)
from fishserve.engine.engine import GenerationRequest
from fishserve.engine.persistent_batch import PersistentBatch
from fishserve.engine.sampling import SamplingParams
from fishserve.engine.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from fishserve.engine.sequence import Sequence, Status, pending_positions
from tests.conftest import make_engine

ROWS, BLOCK, MAX_BLOCKS = 3, 4, 12


def _seq(rid: str, rng: np.random.Generator, prompt_len: int, frames: int) -> Sequence:
    """A sequence with a random prompt and `frames` random frames (nothing computed)."""
    params = SamplingParams(
        temperature=float(rng.uniform(0.3, 1.2)),
        top_p=float(rng.uniform(0.5, 1.0)),
        repetition_penalty=float(rng.uniform(1.0, 1.5)),
    )
    seq = Sequence(rid, None, params, int(rng.integers(0, 2**31)), 100)  # type: ignore[arg-type]
    seq.segment = int(rng.integers(0, 3))
    prompt = torch.from_numpy(rng.integers(0, 50, (ROWS, prompt_len)))
    seq.start_segment(prompt, budget=int(rng.integers(frames + 1, frames + 6)))
    for _ in range(frames):
        seq.add_frame(rng.integers(0, 50, ROWS))
    return seq


def _assert_same_inputs(a: DecodeInputs, b: DecodeInputs) -> None:
    for f in fields(DecodeInputs):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert x.dtype == y.dtype and torch.equal(x, y), f.name


# -- PersistentBatch itself ----------------------------------------------------------------------
def test_join_writes_the_rows_and_shares_the_window() -> None:
    rng = np.random.default_rng(0)
    rows = PersistentBatch(4, ROWS, MAX_BLOCKS)
    seq = _seq("a", rng, 5, 20)
    seq.block_table = [7, 3, 9]
    window = seq.window.copy()
    rows.join(seq)
    assert seq.slot == 0 and rows.owner(0) is seq and rows.num_free == 3
    assert rows.mismatches(seq) == []
    assert np.array_equal(rows.windows[0], window)
    seq.add_frame(np.array([1, 2, 3]))  # a frame written through the sequence's window ...
    assert np.array_equal(rows.windows[0], seq.window)  # ... is in the persistent row
    seq.block_table += [4, 5]
    assert rows.mismatches(seq) == ["block_tables", "num_blocks"]
    rows.sync_blocks(seq)
    assert rows.mismatches(seq) == [] and rows.block_tables[0, :6].tolist() == [7, 3, 9, 4, 5, 0]


def test_leave_frees_the_slot_and_gives_the_window_back() -> None:
    rng = np.random.default_rng(1)
    rows = PersistentBatch(2, ROWS, MAX_BLOCKS)
    a, b = _seq("a", rng, 5, 20), _seq("b", rng, 6, 3)
    a.block_table, b.block_table = [1, 2, 3, 4, 5, 6, 7], [8, 9, 10]
    rows.join(a)
    rows.join(b)
    with pytest.raises(RuntimeError):
        rows.join(_seq("c", rng, 2, 0))  # full
    with pytest.raises(ValueError):
        rows.join(a)  # twice
    window = a.window.copy()
    rows.leave(a)
    assert a.slot == -1 and rows.num_free == 1 and rows.owner(0) is None
    assert not np.shares_memory(a.window, rows.windows) and np.array_equal(a.window, window)
    rows.leave(a)  # no slot: nothing to do
    c = _seq("c", rng, 2, 0)
    c.block_table = [11]
    rows.join(c)  # takes the freed slot, and nothing of what `a` left there
    assert c.slot == 0 and rows.mismatches(c) == [] and rows.mismatches(b) == []
    assert rows.block_tables[0].tolist() == [11] + [0] * (MAX_BLOCKS - 1)
    with pytest.raises(RuntimeError):
        rows.leave(copy.copy(c))  # an impostor with c's slot


# -- inputs: gathered == built per sequence ------------------------------------------------------
def _random_items(
    rng: np.random.Generator, rows: PersistentBatch, count: int
) -> list[tuple[Sequence, int]]:
    """Sequences in every state a step meets (decode, frame in flight, prefill chunks, the
    last prompt position alone), joined to `rows`, with their scheduled positions."""
    items = []
    for i in range(count):
        kind = rng.choice(["decode", "in flight", "chunk end", "chunk mid", "first frame"])
        frames = 0 if kind == "first frame" else int(rng.integers(0, 24))
        seq = _seq(f"r{i}", rng, int(rng.integers(1, 9)), frames)
        total = seq.num_positions
        if kind == "in flight":
            seq.inflight = 1
            total += 1
        if kind in ("decode", "in flight", "first frame"):
            seq.num_computed, n = total - 1, 1
        elif kind == "chunk end":
            seq.num_computed = int(rng.integers(0, total))
            n = total - seq.num_computed
        else:
            seq.num_computed = int(rng.integers(0, total - 1)) if total > 1 else 0
            n = int(rng.integers(1, total - seq.num_computed)) if total > 1 else 1
        seq.block_table = [int(b) for b in rng.permutation(60)[: -(-total // BLOCK)] + 1]
        rows.join(seq)
        items.append((seq, n))
    return items


@pytest.mark.parametrize("seed", range(40))
def test_gathered_inputs_equal_the_per_sequence_ones(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = PersistentBatch(40, ROWS, MAX_BLOCKS)
    items = _random_items(rng, rows, int(rng.integers(1, 30)))
    if seed % 4 == 0:  # a pure decode step
        items = [(s, 1) for s, n in items if s.num_computed + 1 == s.num_positions]
        items = items or [(_decode_seq(rng, rows), 1)]
    gathered, samplers = build_row_inputs(items, BLOCK, MAX_BLOCKS, rows)
    built, expected = build_row_inputs_per_sequence(items, BLOCK, MAX_BLOCKS)
    assert samplers == expected
    _assert_same_inputs(gathered, built)


def _decode_seq(rng: np.random.Generator, rows: PersistentBatch) -> Sequence:
    seq = _seq("d", rng, 4, 6)
    seq.num_computed = seq.num_positions - 1
    seq.block_table = [1, 2, 3]
    rows.join(seq)
    return seq


def test_a_sequence_without_a_slot_uses_the_per_sequence_inputs() -> None:
    rng = np.random.default_rng(3)
    rows = PersistentBatch(8, ROWS, MAX_BLOCKS)
    items = _random_items(rng, rows, 5)
    rows.leave(items[2][0])
    rows.windows[:] = -1  # would show in the inputs if they were gathered
    inputs, _ = build_row_inputs(items, BLOCK, MAX_BLOCKS, rows)
    _assert_same_inputs(inputs, build_row_inputs_per_sequence(items, BLOCK, MAX_BLOCKS)[0])


# -- scheduling: the vectorised plan == the loop ------------------------------------------------
def _running_scheduler(rng: np.random.Generator, free: int) -> Scheduler:
    """A scheduler whose running sequences are in random decode and prefill states."""
    count = int(rng.integers(1, 12))
    blocks = BlockManager(200, BLOCK, reserved=1)
    rows = PersistentBatch(16, ROWS, 64)
    scheduler = Scheduler(SchedulerConfig(16, int(rng.integers(16, 80))), blocks, rows)
    for i in range(count):
        seq = _seq(f"r{i}", rng, int(rng.integers(1, 30)), int(rng.integers(0, 30)))
        seq.budget = seq.num_frames + int(rng.integers(0, 3))
        seq.inflight = int(rng.integers(0, 2))
        seq.num_computed = int(rng.integers(0, seq.num_positions + 1))
        blocks.grow(seq.block_table, max(seq.num_computed, 1))
        seq.status = Status.RUNNING
        scheduler.running.append(seq)
        rows.join(seq)
    while blocks.num_free > free:  # leave only `free` blocks to grow into
        blocks.grow([], BLOCK)
    return scheduler


@pytest.mark.parametrize("seed", range(60))
def test_the_planned_schedule_is_the_loops(seed: int) -> None:
    rng = np.random.default_rng(seed)
    planned = _running_scheduler(rng, free=int(rng.integers(0, 40)))
    looped = copy.deepcopy(planned)
    seqs = planned.running
    computed = np.array([s.num_computed for s in seqs])
    prompt_lens = planned.rows.prompt_lens[[s.slot for s in seqs]]
    assert pending_positions(seqs, prompt_lens, computed).tolist() == [s.num_pending for s in seqs]
    budget = planned.config.max_num_batched_tokens
    plan = planned._plan_running(budget)
    reference = ScheduledBatch()
    left = looped._schedule_running(reference, budget, None)  # the loop on an identical copy
    if plan is None:  # only when the free blocks cannot cover every growth: the loop preempts
        assert reference.preempted
        return
    items, rest = plan
    assert [(s.request_id, n) for s, n in items] == [(s.request_id, n) for s, n in reference.items]
    assert rest == left and not reference.preempted
    for a, b in zip(planned.running, looped.running, strict=True):
        assert a.block_table == b.block_table
        assert planned.rows.mismatches(a) == []
    assert list(planned.blocks._free) == list(looped.blocks._free)


# -- the engine: rows in step with the sequences, and the same events as without them -----------
def _request(i: int, rng: np.random.Generator) -> GenerationRequest:
    params = SamplingParams(
        temperature=float(rng.uniform(0.5, 1.2)),
        top_p=float(rng.uniform(0.7, 1.0)),
        repetition_penalty=float(rng.uniform(1.0, 1.4)),
        seed=i,
    )
    return GenerationRequest(
        "word " * int(rng.integers(2, 14)),
        params=params,
        max_new_tokens=int(rng.integers(3, 40)),
        chunk_length=int(rng.choice([0, 12])),
        ignore_eos=bool(rng.integers(0, 2)),
        request_id=f"r{i}",
    )


def _check_rows(engine) -> None:
    """Every running sequence holds a slot whose rows equal its values; no other does."""
    rows: PersistentBatch = engine.scheduler.rows
    running = engine.scheduler.running
    assert rows.num_free == rows.capacity - len(running)
    assert len({seq.slot for seq in running}) == len(running)
    for seq in running:
        assert seq.slot >= 0 and rows.mismatches(seq) == [], seq.request_id
    for seq in engine.scheduler.waiting:
        assert seq.slot == -1


def _drive(engine, seed: int, check: bool) -> list[tuple]:
    """Step `engine` through random arrivals and cancellations; every event, in order."""
    rng = np.random.default_rng(seed)
    arrivals = {int(rng.integers(0, 40)): i for i in range(14)}
    cancels = {int(rng.integers(5, 60)): f"r{int(rng.integers(0, 14))}" for _ in range(3)}
    out: list[tuple] = []
    step = 0
    while engine.has_work() or step <= max(arrivals):
        if step in arrivals:
            engine.add_request(_request(arrivals[step], rng))
        if step in cancels:
            event = engine.abort(cancels[step])
            out.append(("abort", cancels[step], event is not None))
        for e in engine.step():
            codes = None if e.codes is None else tuple(e.codes.tolist())
            out.append((e.request_id, e.segment, codes, e.finished, e.finish_reason))
        if check:
            _check_rows(engine)
        step += 1
        assert step < 3000, "engine did not finish"
    return out


SETTINGS = {
    "sync": {},
    "async": {"async_scheduling": True},
    "boost": {"boost_frames": 4, "boost_min_running": 1},
    "general path for prompts": {"static_prefill_tokens": 4, "max_num_batched_tokens": 40},
}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("settings", SETTINGS.values(), ids=SETTINGS.keys())
def test_engine_events_equal_those_without_persistent_rows(
    tiny_model, tiny_tokenizer, monkeypatch, settings, seed
):
    base = {"static_decode": True, "max_num_seqs": 6, "num_kv_blocks": 24, **settings}
    reference = make_engine(tiny_model, tiny_tokenizer, **base)
    reference.scheduler.rows = reference.runner.rows = None  # everything read per sequence
    want = _drive(reference, seed, check=False)

    gathered = [0]
    original = runner_module.build_row_inputs

    def both(items, block_size, max_blocks, rows=None):
        inputs, samplers = original(items, block_size, max_blocks, rows)
        built, expected = build_row_inputs_per_sequence(items, block_size, max_blocks)
        assert samplers == expected
        _assert_same_inputs(inputs, built)
        gathered[0] += rows is not None and all(s.slot >= 0 for s, _ in items)
        return inputs, samplers

    monkeypatch.setattr(runner_module, "build_row_inputs", both)
    engine = make_engine(tiny_model, tiny_tokenizer, **base)
    got = _drive(engine, seed, check=True)
    assert got == want
    assert gathered[0] > 0
    assert engine.scheduler.num_preemptions == reference.scheduler.num_preemptions
    if seed == 0:
        assert engine.scheduler.num_preemptions > 0  # the small pool preempts
    assert engine.blocks.num_free == engine.blocks.num_blocks
    assert engine.scheduler.rows.num_free == engine.scheduler.rows.capacity


def test_a_steps_frames_are_recorded_as_add_frame_would(tiny_model, tiny_tokenizer):
    """`_on_frames` (windows scattered into the persistent rows) against `Sequence.add_frame`
    per frame, for sequences holding a slot and one that does not (preempted with a frame in
    flight)."""
    engine = make_engine(tiny_model, tiny_tokenizer, static_decode=True, max_num_seqs=4)
    for i in range(5):  # one more than max_num_seqs: it waits without a slot
        request = GenerationRequest(f"word {i}", max_new_tokens=100, ignore_eos=True)
        engine.add_request(request)
    engine.scheduler.schedule()
    seqs = list(engine.sequences.values())
    assert [s.slot >= 0 for s in seqs] == [True] * 4 + [False]
    shadows = [copy.deepcopy(s) for s in seqs]
    rng = np.random.default_rng(0)
    nc = tiny_model.config.num_codebooks
    for _ in range(40):
        frames = rng.integers(0, 400, (len(seqs), 1 + nc))
        events: list = []
        engine._on_frames(seqs, frames, events)
        for shadow, row in zip(shadows, frames, strict=True):
            shadow.add_frame(row)
        pairs = zip(shadows, frames, strict=True)
        audio = [(s.request_id, tuple(r[1:])) for s, r in pairs if s.num_frames > 1]
        assert [(e.request_id, tuple(e.codes.tolist())) for e in events] == audio
        for seq, shadow in zip(seqs, shadows, strict=True):
            assert np.array_equal(seq.window, shadow.window)
            assert np.array_equal(np.stack(seq.frames), np.stack(shadow.frames))
    _check_rows(engine)
