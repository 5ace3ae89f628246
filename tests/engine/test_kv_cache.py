"""Paged KV storage and attention: quantization error, parity with dense attention."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_T2S
from safetensors.torch import load_file

from fishserve.engine.kv_cache import KVCacheLayout, PagedKVCache, kv_bytes_per_token, quantize
from fishserve.engine.paged_attention import AttentionMetadata, TorchPagedAttention
from fishserve.models.attention import CausalAttention

# Max |logit difference| vs the reference on the prefill fixture (logits std ~2.2, max ~12).
# Measured: fp32 3e-6, bf16 0.064, fp16 0.0038, int8 0.10, fp8 0.41.
LOGIT_TOL = {"fp32": 1e-4, "bf16": 0.15, "fp16": 0.02, "int8": 0.2, "fp8": 0.6}


def test_int8_and_fp8_quantization_error_is_bounded():
    x = torch.randn(64, 2, 64) * 3
    for dtype, rel in (("int8", 0.5 / 127), ("fp8", 1 / 16)):
        q, scale = quantize(x, dtype)
        back = q.float() * scale[..., None]
        amax = x.abs().amax(-1, keepdim=True)
        assert ((back - x).abs() <= rel * amax + 1e-6).all(), dtype


def test_kv_bytes_per_token_of_the_release():
    # 24 layers x 2 KV heads x 64 dims x (K and V)
    assert kv_bytes_per_token(24, 2, 64, "bf16") == 12288
    assert kv_bytes_per_token(24, 2, 64, "int8") == 6144 + 2 * 24 * 2 * 4
    assert kv_bytes_per_token(24, 2, 64, "fp8") == kv_bytes_per_token(24, 2, 64, "int8")


def paged_prefill_logits(model, prompt: torch.Tensor, dtype: str, block_size: int = 16):
    c = model.config
    t = prompt.shape[1]
    num_blocks = -(-t // block_size) + 2
    layout = KVCacheLayout(c.n_layer, c.n_local_heads, c.head_dim, block_size, num_blocks, dtype)
    cache = PagedKVCache(layout, "cpu")
    table = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0))
    pos = torch.arange(t)
    meta = AttentionMetadata(
        table[pos // block_size] * block_size + pos % block_size,
        torch.tensor([0, t]),
        torch.tensor([t]),
        table[None],
        block_size,
    )
    hidden = model.forward_slow(model.embed(prompt[None]), pos, TorchPagedAttention(cache, meta))
    return model.slow_logits(hidden[:, -1])[0]


@pytest.mark.parametrize("dtype", list(LOGIT_TOL))
def test_paged_prefill_logits_within_tolerance(tiny_model, dtype):
    case = load_file(TINY_T2S / "prefill_case.safetensors")
    logits = paged_prefill_logits(tiny_model, case["prompt"].long(), dtype)
    expected = case["prefill_logits_last"][0, 0]
    assert (logits - expected).abs().max() < LOGIT_TOL[dtype]
    assert logits.argmax() == expected.argmax()


def test_ragged_paged_attention_equals_dense_per_sequence(tiny_model):
    """Three sequences with different cached and new lengths in one flattened batch."""
    torch.manual_seed(0)
    c = tiny_model.config
    bs = 4
    layout = KVCacheLayout(1, c.n_local_heads, c.head_dim, bs, 32, "fp32")
    cache = PagedKVCache(layout, "cpu")
    lens, new = [9, 3, 14], [2, 3, 1]  # total context, new positions (2nd is a fresh prefill)
    tables = [torch.tensor(t) for t in ([5, 1, 30], [7], [2, 3, 4, 6])]
    qs, ks, vs = (
        [torch.randn(1, n, h, c.head_dim) for n in lens]
        for h in (c.n_head, c.n_local_heads, c.n_local_heads)
    )
    # cache the old positions of every sequence
    for table, L, n, k, v in zip(tables, lens, new, ks, vs, strict=True):
        pos = torch.arange(L - n)
        cache.write(0, table[pos // bs] * bs + pos % bs, k[0, : L - n], v[0, : L - n])
    slot_mapping = torch.cat(
        [
            t[torch.arange(L - n, L) // bs] * bs + torch.arange(L - n, L) % bs
            for t, L, n in zip(tables, lens, new, strict=True)
        ]
    )
    padded = torch.zeros(3, 4, dtype=torch.long)
    for i, t in enumerate(tables):
        padded[i, : len(t)] = t
    meta = AttentionMetadata(
        slot_mapping, torch.tensor([0, 2, 5, 6]), torch.tensor(lens), padded, bs
    )
    q = torch.cat([qq[:, L - n :] for qq, L, n in zip(qs, lens, new, strict=True)], dim=1)
    k = torch.cat([kk[:, L - n :] for kk, L, n in zip(ks, lens, new, strict=True)], dim=1)
    v = torch.cat([vv[:, L - n :] for vv, L, n in zip(vs, lens, new, strict=True)], dim=1)
    out = TorchPagedAttention(cache, meta).forward(0, q, k, v)[0]
    expected = torch.cat(
        [
            CausalAttention().forward(0, qq, kk, vv)[0, L - n :]
            for qq, kk, vv, L, n in zip(qs, ks, vs, lens, new, strict=True)
        ]
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
