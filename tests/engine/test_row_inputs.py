"""Host inputs of the static step (`build_row_inputs`): the decode fast path and the general
layout give the same rows for the same positions."""

from __future__ import annotations

import numpy as np
import torch

from fishserve.engine.decode_step import build_row_inputs
from fishserve.engine.sampling import SamplingParams
from fishserve.engine.sequence import Sequence

ROWS, BLOCK, MAX_BLOCKS = 3, 4, 6


def make_seq(rid: str, prompt_len: int, frames: int, seed: int) -> Sequence:
    """A sequence with a random prompt, `frames` generated frames, all but the last cached."""
    rng = np.random.default_rng(seed)
    seq = Sequence(rid, None, SamplingParams(temperature=0.5 + seed / 10), seed, 100)  # type: ignore[arg-type]
    seq.start_segment(torch.from_numpy(rng.integers(0, 50, (ROWS, prompt_len))), budget=100)
    for _ in range(frames):
        seq.add_frame(rng.integers(0, 50, ROWS))
    seq.num_computed = seq.num_positions - 1
    seq.block_table = list(range(10 * seed, 10 * seed + -(-seq.num_positions // BLOCK)))
    return seq


def expected_row(seq: Sequence, position: int) -> dict[str, object]:
    block = seq.block_table[position // BLOCK]
    return {
        "column": seq.columns_np(position, position + 1)[:, 0],
        "slot": block * BLOCK + position % BLOCK,
        "table": seq.block_table + [0] * (MAX_BLOCKS - len(seq.block_table)),
    }


def check_rows(inputs, rows: list[tuple[Sequence, int]]) -> None:
    for r, (seq, position) in enumerate(rows):
        want = expected_row(seq, position)
        assert inputs.positions[r].item() == position
        assert inputs.context_lens[r].item() == position + 1
        assert np.array_equal(inputs.columns[r].numpy(), want["column"])
        assert inputs.slot_mapping[r].item() == want["slot"]
        assert inputs.block_tables[r].tolist() == want["table"]


def test_decode_rows() -> None:
    seqs = [make_seq("a", 5, 3, 1), make_seq("b", 9, 0, 2), make_seq("c", 2, 14, 3)]
    inputs, samplers = build_row_inputs([(s, 1) for s in seqs], BLOCK, MAX_BLOCKS)
    assert samplers == seqs
    check_rows(inputs, [(s, s.num_computed) for s in seqs])
    assert inputs.temperature.tolist() == [np.float32(s.params.temperature) for s in seqs]
    assert inputs.penalty.tolist()[1] == 1.0  # no frames yet: no repetition penalty (spec §5)
    assert inputs.frames.tolist() == [3, 0, 14] and inputs.seeds.tolist() == [1, 2, 3]
    assert torch.equal(inputs.windows[2], torch.from_numpy(seqs[2].window))


def test_mixed_rows_put_samplers_first() -> None:
    decode, prompt = make_seq("a", 5, 3, 1), make_seq("b", 9, 0, 2)
    prompt.num_computed = 4  # 5 prompt positions still to compute, the last one samples
    inputs, samplers = build_row_inputs([(decode, 1), (prompt, 5)], BLOCK, MAX_BLOCKS)
    assert samplers == [decode, prompt]
    order = [(decode, 7), (prompt, 8), (prompt, 4), (prompt, 5), (prompt, 6), (prompt, 7)]
    check_rows(inputs, order)
    assert inputs.temperature.tolist()[2:] == [1.0] * 4  # neutral rows nobody samples from
