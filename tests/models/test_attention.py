"""Tests for fishserve.models.attention: the one-position attention of the fast transformer."""

from __future__ import annotations

import pytest
import torch

from fishserve.models.attention import DenseKVCache, SlotKVCache, attend_one_position, sdpa_gqa


@pytest.mark.parametrize(("heads", "kv_heads", "keys"), [(16, 2, 1), (16, 2, 8), (4, 4, 5)])
def test_one_position_attention_equals_sdpa(heads: int, kv_heads: int, keys: int) -> None:
    gen = torch.Generator().manual_seed(heads + keys)
    q = torch.randn(3, heads, 1, 64, generator=gen)
    k, v = (torch.randn(3, kv_heads, keys, 64, generator=gen) for _ in range(2))
    expected = sdpa_gqa(q, k, v, None, causal=False)
    torch.testing.assert_close(attend_one_position(q, k, v), expected, rtol=1e-5, atol=1e-6)


def test_one_position_attention_keeps_the_query_dtype_and_reads_the_right_kv_head() -> None:
    q = torch.zeros(1, 4, 1, 8, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 3, 8, dtype=torch.bfloat16)
    v = torch.arange(2, dtype=torch.bfloat16).reshape(1, 2, 1, 1).expand(1, 2, 3, 8)
    out = attend_one_position(q, k, v)  # uniform weights: each head gets its KV head's value
    assert out.dtype == torch.bfloat16
    assert out[0, :, 0, 0].tolist() == [0.0, 0.0, 1.0, 1.0]


def test_slot_cache_equals_the_dense_cache_position_by_position() -> None:
    """Writing slot i of a `SlotKVCache` (the slot a tensor, no in-place writes) and attending
    over its masked capacity gives the dense cache's output for positions 0..7, and the
    tensors it was given are left unchanged."""
    gen = torch.Generator().manual_seed(1)
    dense = DenseKVCache(2, 3, 2, 8, 16, torch.float32, "cpu")
    k, v = [torch.zeros(3, 2, 8, 16)] * 2, [torch.zeros(3, 2, 8, 16)] * 2
    for slot in range(8):
        slot_cache = SlotKVCache(k, v, torch.tensor([slot]))
        for layer in range(2):
            q = torch.randn(3, 1, 4, 16, generator=gen)
            kk, vv = (torch.randn(3, 1, 2, 16, generator=gen) for _ in range(2))
            want = dense.at(slot).forward(layer, q, kk, vv)
            got = slot_cache.forward(layer, q, kk, vv)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert all(t.abs().sum() == 0 for t in k + v) if slot == 0 else True
        k, v = slot_cache.k, slot_cache.v
    torch.testing.assert_close(torch.stack(k), dense.k)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dense_cache_step_on_cuda_matches_the_cpu() -> None:
    gen = torch.Generator().manual_seed(0)
    outs = []
    for device in ("cpu", "cuda"):
        cache = DenseKVCache(1, 5, 2, 8, 64, torch.float32, device)
        out = None
        for slot in range(8):
            q = torch.randn(5, 1, 16, 64, generator=gen).to(device)
            k, v = (torch.randn(5, 1, 2, 64, generator=gen).to(device) for _ in range(2))
            out = cache.at(slot).forward(0, q, k, v)
        outs.append(out.cpu())
        gen.manual_seed(0)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5)
