"""Block accounting: allocation, release, and no leaks under random engine traffic."""

from __future__ import annotations

import pytest
from conftest import make_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fishserve.engine.block_manager import BlockManager, NoFreeBlocksError
from fishserve.engine.engine import GenerationRequest
from fishserve.engine.sampling import SamplingParams


def test_grow_and_release():
    blocks = BlockManager(4, 16)
    table: list[int] = []
    blocks.grow(table, 17)
    assert len(table) == 2 and blocks.num_free == 2
    blocks.grow(table, 32)  # still fits in two blocks
    assert len(table) == 2
    with pytest.raises(NoFreeBlocksError):
        blocks.grow(table, 80)
    assert len(table) == 2  # unchanged after a failed grow
    blocks.release(table)
    assert table == [] and blocks.num_free == 4


def test_double_free_is_detected():
    blocks = BlockManager(2, 4)
    table: list[int] = []
    blocks.grow(table, 4)
    stale = list(table)
    blocks.release(table)
    with pytest.raises(RuntimeError, match="twice"):
        blocks.release(stale)


def check_accounting(engine) -> None:
    owned = [b for seq in engine.sequences.values() for b in seq.block_table]
    assert len(owned) == len(set(owned)), "a block is owned twice"
    assert engine.blocks.num_free + len(owned) == engine.blocks.num_blocks
    for seq in engine.scheduler.waiting:
        assert seq.block_table == [], "a waiting sequence holds blocks"


EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(1, 60), st.integers(1, 20)),
        st.tuples(st.just("cancel"), st.integers(0, 40), st.just(0)),
        st.tuples(st.just("step"), st.integers(1, 4), st.just(0)),
    ),
    min_size=100,
    max_size=200,
)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=EVENTS)
def test_no_block_leaks_under_random_traffic(tiny_model, tiny_tokenizer, events):
    engine = make_engine(
        tiny_model,
        tiny_tokenizer,
        num_kv_blocks=20,
        block_size=8,
        max_num_seqs=4,
        max_num_batched_tokens=64,
    )
    submitted: list[str] = []
    for kind, a, b in events:
        if kind == "submit":
            rid = f"q{len(submitted)}"
            request = GenerationRequest(
                "x" * a + ".",
                [],
                SamplingParams(seed=a),
                chunk_length=24,
                max_new_tokens=b,
                request_id=rid,
            )
            engine.add_request(request)
            submitted.append(rid)
        elif kind == "cancel" and submitted:
            engine.abort(submitted[a % len(submitted)])
        else:
            for _ in range(a):
                engine.step()
        check_accounting(engine)
    for rid in list(engine.sequences):
        engine.abort(rid)
    assert engine.blocks.num_free == engine.blocks.num_blocks
