"""Staged static inputs: one upload fills every field, padding rows stay neutral."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from fishserve.engine.decode_step import DecodeInputs
from fishserve.engine.staging import ALIGN, StagedInputs


def random_inputs(rows: int, seed: int) -> DecodeInputs:
    g = torch.Generator().manual_seed(seed)
    empty = DecodeInputs.empty(rows, 5, 7, torch.device("cpu"))
    values = {}
    for f in fields(empty):
        t = getattr(empty, f.name)
        if t.dtype.is_floating_point:
            values[f.name] = torch.rand(t.shape, generator=g).to(t.dtype)
        else:
            values[f.name] = torch.randint(1, 1000, t.shape, generator=g).to(t.dtype)
    return DecodeInputs(**values)


def test_stage_and_upload_fill_rows_and_reset_the_rest():
    cpu = torch.device("cpu")
    neutral = DecodeInputs.empty(8, 5, 7, cpu)
    staged = StagedInputs(neutral, cpu)
    for rows, seed in [(6, 0), (3, 1), (8, 2), (1, 3)]:
        host = random_inputs(rows, seed)
        staged.stage(host)
        staged.upload()
        for f in fields(host):
            got = getattr(staged.inputs, f.name)
            assert torch.equal(got[:rows], getattr(host, f.name)), f.name
            assert torch.equal(got[rows:], getattr(neutral, f.name)[rows:]), f.name
    with pytest.raises(ValueError, match="do not fit"):
        staged.stage(random_inputs(9, 4))


def test_every_field_is_an_aligned_view_of_one_buffer():
    cpu = torch.device("cpu")
    staged = StagedInputs(DecodeInputs.empty(3, 5, 7, cpu), cpu)  # odd sizes: padding needed
    views = [getattr(staged.inputs, f.name) for f in fields(staged.inputs)]
    base = views[0].untyped_storage().data_ptr()
    assert len({v.dtype for v in views}) >= 3  # int64, int32 and float32 fields share it
    for v in views:
        assert v.untyped_storage().data_ptr() == base  # one buffer, so one copy uploads all
        assert (v.data_ptr() - base) % ALIGN == 0
    assert staged.nbytes % ALIGN == 0
    assert staged.nbytes >= sum(v.numel() * v.element_size() for v in views)
