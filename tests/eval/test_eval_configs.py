"""Configuration names: parsing, the default grid, errors."""

from __future__ import annotations

import pytest
import torch

from fishserve.eval.configs import EvalConfig, default_configs, parse_config, parse_configs


def test_parse_round_trips_names():
    for text in ("fp32/fp32", "bf16/int8", "int8wo/fp8", "fp16/bf16+noise=0.05"):
        assert parse_config(text).name == text
    assert parse_config("fp32/fp32+noise=0.5") == EvalConfig("fp32", "fp32", 0.5)


@pytest.mark.parametrize("bad", ["fp32", "fp64/fp32", "bf16/int4", "bf16/int8+noise=x"])
def test_parse_rejects_bad_configs(bad):
    with pytest.raises(ValueError):
        parse_config(bad)


def test_default_grid_is_weights_times_kv_plus_int8_weight_only():
    names = [c.name for c in default_configs()]
    assert len(names) == 14 and names[0] == "fp32/fp32"
    assert {"fp16/fp8", "bf16/int8", "int8wo/bf16", "int8wo/int8"} <= set(names)
    assert parse_configs("all") == default_configs()
    assert [c.name for c in parse_configs("bf16/int8, bf16/int8,fp32/fp32")] == [
        "bf16/int8",
        "fp32/fp32",
    ]


def test_compute_dtype_of_int8_weight_only_depends_on_the_device():
    config = parse_config("int8wo/int8")
    assert config.compute_dtype(torch.device("cpu")) == torch.float32
    assert config.compute_dtype(torch.device("cuda")) == torch.bfloat16
    assert parse_config("fp16/fp32").compute_dtype(torch.device("cpu")) == torch.float16
