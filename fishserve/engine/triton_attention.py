"""Fused paged decode attention in Triton: one query per sequence over its block table.

One program per (sequence, KV head) computes the attention of the KV head's query-head group
(8 heads for the release) over the sequence's context with an online softmax, reading K/V
straight from the paged pool through the block table and dequantizing int8/fp8 entries with
their per-token-per-head scales in registers (the pool is never copied or dequantized in
memory). The group is padded to 16 rows so both products run on tensor cores.

`paged_decode_attention` needs Triton and a CUDA device; with `TRITON_INTERPRET=1` it also runs
on the CPU (slowly), which is how the tests check it where there is no GPU.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the torch path is used instead
    triton = None
    tl = None

TILE_TOKENS = 64  # context positions per loop iteration (several KV blocks)
_DOT_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def triton_available() -> bool:
    """Whether the Triton kernel can be used at all (Triton importable)."""
    return triton is not None


if triton is not None:

    @triton.jit
    def _paged_decode_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        ks_ptr,
        vs_ptr,
        tables_ptr,
        lens_ptr,
        out_ptr,
        sm_scale,
        stride_qb,
        stride_qh,
        stride_ks,
        stride_kh,
        stride_ss,
        stride_sh,
        stride_tb,
        stride_ob,
        stride_oh,
        BLOCK_SIZE: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        TILE: tl.constexpr,
        QUANT: tl.constexpr,
        DOT: tl.constexpr,
    ):
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
        context = tl.load(lens_ptr + seq)
        rows = tl.arange(0, GROUP_PAD)
        dims = tl.arange(0, HEAD_DIM)
        toks = tl.arange(0, TILE)
        row_ok = rows < GROUP
        heads = kv_head * GROUP + rows
        q = (
            tl.load(
                q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None],
                other=0.0,
            ).to(tl.float32)
            * sm_scale
        )
        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        start = 0
        while start < context:  # a while loop: Triton's CPU interpreter rejects range(tensor)
            pos = start + toks
            tok_ok = pos < context
            block = tl.load(tables_ptr + seq * stride_tb + pos // BLOCK_SIZE, mask=tok_ok, other=0)
            slot = block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
            kv_off = slot[:, None] * stride_ks + kv_head * stride_kh + dims[None, :]
            k = tl.load(k_ptr + kv_off, mask=tok_ok[:, None], other=0.0).to(tl.float32)
            v = tl.load(v_ptr + kv_off, mask=tok_ok[:, None], other=0.0).to(tl.float32)
            if QUANT:
                s_off = slot * stride_ss + kv_head * stride_sh
                k = k * tl.load(ks_ptr + s_off, mask=tok_ok, other=0.0)[:, None]
                v = v * tl.load(vs_ptr + s_off, mask=tok_ok, other=0.0)[:, None]
            if DOT == 0:
                scores = tl.dot(q, tl.trans(k), input_precision="ieee")
            elif DOT == 1:
                scores = tl.dot(q.to(tl.bfloat16), tl.trans(k.to(tl.bfloat16)))
            else:
                scores = tl.dot(q.to(tl.float16), tl.trans(k.to(tl.float16)))
            scores = tl.where(tok_ok[None, :], scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if DOT == 0:
                pv = tl.dot(p, v, input_precision="ieee")
            elif DOT == 1:
                pv = tl.dot(p.to(tl.bfloat16), v.to(tl.bfloat16))
            else:
                pv = tl.dot(p.to(tl.float16), v.to(tl.float16))
            acc = acc * alpha[:, None] + pv
            m_i = m_new
            start += TILE
        out = acc / l_i[:, None]
        tl.store(
            out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None],
        )


def paged_decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k_scale: Tensor | None,
    v_scale: Tensor | None,
    block_tables: Tensor,
    context_lens: Tensor,
    block_size: int,
) -> Tensor:
    """Attention of one new query per sequence over its paged context.

    Args:
        q: (B, H, Dh) queries (RoPE applied): fp32 runs exact fp32 products, bf16/fp16 run
            tensor-core products in that dtype with fp32 accumulation.
        k_cache, v_cache: (num_slots, KV, Dh) one layer's pool in its storage dtype.
        k_scale, v_scale: (num_slots, KV) float32 scales for int8/fp8 pools, else None.
        block_tables: int32/int64 (B, max_blocks) block ids.
        context_lens: int32/int64 (B,) positions to attend (>= 1), the new one included.
        block_size: positions per block.

    Returns:
        (B, H, Dh) in q's dtype; scale 1/sqrt(Dh); query head h reads KV head h // (H / KV).
    """
    b, h, d = q.shape
    kv = k_cache.shape[1]
    group = h // kv
    out = torch.empty_like(q)
    quant = k_scale is not None
    ks = k_scale if quant else k_cache  # placeholders are never read when QUANT is False
    vs = v_scale if quant else v_cache
    _paged_decode_kernel[(b, kv)](
        q,
        k_cache,
        v_cache,
        ks,
        vs,
        block_tables,
        context_lens,
        out,
        d**-0.5,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        ks.stride(0),
        ks.stride(1),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        BLOCK_SIZE=block_size,
        HEAD_DIM=d,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        TILE=TILE_TOKENS,
        QUANT=quant,
        DOT=_DOT_KIND[q.dtype],
        num_warps=4,
    )
    return out
