"""The memory-budget planner: the breakdown adds up and refuses impossible budgets."""

from __future__ import annotations

import pytest
from conftest import make_engine

from fishserve.engine.memory import (
    InsufficientMemoryError,
    plan_memory,
)
from fishserve.engine.sizes import parse_memory_size

GiB, MiB = 2**30, 2**20


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4GiB", 4 * GiB),
        ("512MiB", 512 * MiB),
        ("6GB", 6 * 10**9),
        ("0.9", 0.9),
        ("123456", 123456),
        (1.0, 1.0),
    ],
)
def test_parse_memory_size(text, value):
    assert parse_memory_size(text) == value


@pytest.mark.parametrize("text", ["lots", "4 parsecs", "-1", "0", "1e400", "1e400GiB"])
def test_parse_memory_size_rejects(text):
    with pytest.raises(ValueError):
        parse_memory_size(text)


def test_plan_adds_up():
    plan = plan_memory(
        4 * GiB,
        weights=1276 * MiB,
        activations=300 * MiB,
        decoder_workspace=512 * MiB,
        kv_bytes_per_token=12288,
        block_size=16,
    )
    parts = plan.weights + plan.activations + plan.decoder_workspace + plan.kv_pool
    assert parts <= plan.budget < parts + 12288 * 16  # less than one block left unused
    assert plan.num_blocks == (4 * GiB - (1276 + 300 + 512) * MiB) // (12288 * 16)
    assert plan.sequences_of(1000) == plan.num_blocks // 63  # ceil(1000 / 16) blocks each
    assert "KV pool" in plan.summary()
    assert plan.summary(256).endswith(f"{plan.sequences_of(256)} sequences of 256 positions fit")


def test_plan_refuses_a_budget_without_room_for_kv():
    with pytest.raises(InsufficientMemoryError, match="too small"):
        plan_memory(
            GiB,
            weights=900 * MiB,
            activations=100 * MiB,
            decoder_workspace=100 * MiB,
            kv_bytes_per_token=12288,
            block_size=16,
        )


def test_engine_sizes_its_pool_from_a_cpu_budget(tiny_model, tiny_tokenizer):
    engine = make_engine(
        tiny_model,
        tiny_tokenizer,
        num_kv_blocks=None,
        memory_budget=600 * MiB,
        decoder_workspace_bytes=64 * MiB,
    )
    plan = engine.memory
    assert plan.budget == 600 * MiB
    expected = (plan.budget - plan.weights - plan.activations - plan.decoder_workspace) // (
        plan.kv_bytes_per_token * plan.block_size
    )
    assert engine.blocks.num_blocks == plan.num_blocks == expected
    pool = engine.cache.k.numel() * engine.cache.k.element_size() * 2
    assert pool == plan.kv_pool + plan.kv_bytes_per_token * plan.block_size  # + the null block
