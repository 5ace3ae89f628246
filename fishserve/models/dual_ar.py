"""The Fish Speech 1.5 text-to-semantic model: a dual-autoregressive LLaMA-style transformer.

Blocks in the order data flows (spec §2): embedding (token + masked codebook sum), the slow
transformer over the sequence, the slow head (logits over the full vocabulary), and the fast
transformer over the codebooks of one frame with its own head.

Notation: B batch, T positions, D model width, H query heads, KV key/value heads, Dh head size,
nc number of codebooks, C codebook size, V vocabulary size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fishserve.models.attention import AttentionBackend, CausalAttention
from fishserve.models.config import DualARConfig
from fishserve.models.fusion import gpu_fused


class RMSNorm(nn.Module):
    """RMSNorm (spec §2.4): normalise in fp32, cast back to the input dtype, then scale."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """(..., D) -> (..., D) in x's dtype (see `rms_norm`)."""
        return rms_norm(x, self.weight, self.eps)


@gpu_fused
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """(x_f32 * rsqrt(mean(x_f32^2) + eps)) cast to x's dtype, times weight (spec §2.4)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y.type_as(x) * weight


def rope_table(positions: int, head_dim: int, base: float) -> Tensor:
    """Interleaved-pair RoPE cos/sin table, rounded to bf16 as the reference does (spec §2.4).

    Returns:
        float32 tensor (positions, head_dim // 2, 2): [..., 0] = cos, [..., 1] = sin, whose
        values are exactly representable in bfloat16.
    """
    exponents = torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim
    inv_freq = 1.0 / (base**exponents)
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)
    table = torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1)
    return table.to(torch.bfloat16).float()


@gpu_fused
def apply_rope(x: Tensor, table: Tensor) -> Tensor:
    """Rotate each pair (x[2i], x[2i+1]) by the table's angle, computed in fp32.

    Args:
        x: (B, T, heads, Dh).
        table: (T, Dh/2, 2) or (B, T, Dh/2, 2) float32 rows of `rope_table` for x's positions.

    Returns:
        Tensor of x's shape and dtype.
    """
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    table = table.unsqueeze(-3)  # broadcast over heads
    cos, sin = table[..., 0], table[..., 1]
    even, odd = pairs[..., 0], pairs[..., 1]
    out = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    """Multi-head attention with grouped KV heads and a fused qkv projection (spec §2.4).

    `wqkv` rows: H*Dh query rows, then KV*Dh key rows, then KV*Dh value rows.
    """

    def __init__(self, dim: int, n_head: int, n_kv: int, bias: bool) -> None:
        super().__init__()
        self.n_head, self.n_kv, self.head_dim = n_head, n_kv, dim // n_head
        self.wqkv = nn.Linear(dim, (n_head + 2 * n_kv) * self.head_dim, bias=bias)
        self.wo = nn.Linear(n_head * self.head_dim, dim, bias=False)

    def forward(self, x: Tensor, rope: Tensor, attn: AttentionBackend, layer: int) -> Tensor:
        """x (B, T, D), rope rows of x's positions -> (B, T, D) through `attn` for `layer`."""
        b, t, _ = x.shape
        q_size, kv_size = self.n_head * self.head_dim, self.n_kv * self.head_dim
        q, k, v = self.wqkv(x).split([q_size, kv_size, kv_size], dim=-1)
        q = apply_rope(q.view(b, t, self.n_head, self.head_dim), rope)
        k = apply_rope(k.view(b, t, self.n_kv, self.head_dim), rope)
        v = v.view(b, t, self.n_kv, self.head_dim)
        out = attn.forward(layer, q, k, v)
        return self.wo(out.reshape(b, t, q_size))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), no biases (spec §2.4)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """(..., D) -> (..., D)."""
        return self.w2(swiglu(self.w1(x), self.w3(x)))


@gpu_fused
def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up."""
    return F.silu(gate) * up


class TransformerBlock(nn.Module):
    """Pre-norm block: h = x + attn(norm(x)); out = h + ffn(norm(h))."""

    def __init__(self, dim: int, n_head: int, n_kv: int, hidden: int, eps: float, bias: bool):
        super().__init__()
        self.attention = Attention(dim, n_head, n_kv, bias)
        self.feed_forward = FeedForward(dim, hidden)
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)

    def forward(self, x: Tensor, rope: Tensor, attn: AttentionBackend, layer: int) -> Tensor:
        """(B, T, D) -> (B, T, D): one pre-norm block (spec §2.4)."""
        h = x + self.attention(self.attention_norm(x), rope, attn, layer)
        return h + self.feed_forward(self.ffn_norm(h))


class DualARTransformer(nn.Module):
    """The DualAR text-to-semantic model with the released checkpoint's module names.

    Args:
        config: hyper-parameters (`DualARConfig`).
        semantic_begin_id, semantic_end_id: ids of `<|semantic:0|>` and the last semantic
            token (from the tokenizer; spec §3.1). Positions whose token lies in this range
            get the codebook embedding sum added (spec §2.3).
    """

    def __init__(self, config: DualARConfig, semantic_begin_id: int, semantic_end_id: int):
        super().__init__()
        c = config
        self.config = c
        self.semantic_begin_id = semantic_begin_id
        self.semantic_end_id = semantic_end_id
        self.embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.codebook_embeddings = nn.Embedding(c.codebook_size * c.num_codebooks, c.dim)
        self.layers = nn.ModuleList(
            TransformerBlock(
                c.dim,
                c.n_head,
                c.n_local_heads,
                c.intermediate_size,
                c.norm_eps,
                c.attention_qkv_bias,
            )
            for _ in range(c.n_layer)
        )
        self.norm = RMSNorm(c.dim, c.norm_eps)
        if not c.tie_word_embeddings:
            self.output = nn.Linear(c.dim, c.vocab_size, bias=False)
        if c.fast_dim != c.dim:
            self.fast_project_in = nn.Linear(c.dim, c.fast_dim)
        self.fast_embeddings = nn.Embedding(c.codebook_size, c.fast_dim)
        self.fast_layers = nn.ModuleList(
            TransformerBlock(
                c.fast_dim,
                c.fast_n_head,
                c.fast_n_local_heads,
                c.fast_intermediate_size,
                c.norm_eps,
                c.fast_attention_qkv_bias,
            )
            for _ in range(c.n_fast_layer)
        )
        self.fast_norm = RMSNorm(c.fast_dim, c.norm_eps)
        self.fast_output = nn.Linear(c.fast_dim, c.codebook_size, bias=False)
        self._rope: dict[torch.device, tuple[Tensor, Tensor]] = {}

    # -- helpers -------------------------------------------------------------------------------
    def rope_tables(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """(slow, fast) RoPE tables on `device`: (max_seq_len, Dh/2, 2), (nc, Dh_fast/2, 2)."""
        if device not in self._rope:
            c = self.config
            slow = rope_table(c.max_seq_len, c.head_dim, c.rope_base)
            fast = rope_table(c.num_codebooks, c.fast_head_dim, c.rope_base)
            self._rope[device] = (slow.to(device), fast.to(device))
        return self._rope[device]

    def is_semantic(self, tokens: Tensor) -> Tensor:
        """Boolean mask of semantic-token ids, same shape as `tokens`."""
        return (tokens >= self.semantic_begin_id) & (tokens <= self.semantic_end_id)

    # -- slow transformer ----------------------------------------------------------------------
    def embed(self, inp: Tensor) -> Tensor:
        """Embed input columns (spec §2.3).

        Args:
            inp: int (B, 1 + nc, T): row 0 token ids, rows 1.. codebook values.

        Returns:
            (B, T, D) in the embedding dtype.
        """
        c = self.config
        tokens, codes = inp[:, 0], inp[:, 1 : 1 + c.num_codebooks]
        offsets = torch.arange(c.num_codebooks, device=inp.device) * c.codebook_size
        codebook_sum = self.codebook_embeddings(codes + offsets[None, :, None]).sum(dim=1)
        mask = self.is_semantic(tokens).unsqueeze(-1)
        return self.embeddings(tokens) + codebook_sum * mask.to(codebook_sum.dtype)

    def forward_slow(self, x: Tensor, positions: Tensor, attn: AttentionBackend) -> Tensor:
        """Run the slow layers.

        Args:
            x: (B, T, D) embedded input.
            positions: int (T,) or (B, T) absolute positions, < max_seq_len.
            attn: the slow stack's attention backend.

        Returns:
            (B, T, D) pre-norm residual stream (the fast transformer's input; spec §2.5).
        """
        rope = self.rope_tables(x.device)[0][positions]
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, attn, i)
        return x

    def slow_logits(self, hidden: Tensor) -> Tensor:
        """Token logits (..., V) from pre-norm hidden states (..., D)."""
        h = self.norm(hidden)
        if self.config.tie_word_embeddings:
            return F.linear(h, self.embeddings.weight)
        return self.output(h)

    # -- fast transformer ----------------------------------------------------------------------
    def fast_input_from_hidden(self, hidden: Tensor) -> Tensor:
        """Slot-0 input of the fast transformer from the slow pre-norm hidden (..., D)."""
        if self.config.fast_dim != self.config.dim:
            return self.fast_project_in(hidden)
        return hidden

    def forward_fast(self, x: Tensor, positions: Tensor, attn: AttentionBackend) -> Tensor:
        """Run the fast layers and head.

        Args:
            x: (B, T, fast_dim): slot 0 is `fast_input_from_hidden(h)`, slot i the
                `fast_embeddings` of code i - 1.
            positions: int (T,) codebook slots in [0, nc).
            attn: the fast stack's attention backend.

        Returns:
            logits (B, T, C).
        """
        rope = self.rope_tables(x.device)[1][positions]
        for i, layer in enumerate(self.fast_layers):
            x = layer(x, rope, attn, i)
        return self.fast_output(self.fast_norm(x))

    # -- training-style full forward -----------------------------------------------------------
    def forward(self, inp: Tensor, key_padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Full causal forward with teacher-forced codebooks (spec §2.6).

        Args:
            inp: int (B, 1 + nc, T).
            key_padding_mask: optional boolean (B, T), True = padding.

        Returns:
            token_logits (B, T, V) and codebook_logits (B, T, nc, C); codebook rows of
            positions whose next frame has codes 0..nc-2 all zero are exact zeros.
        """
        b, _, t = inp.shape
        c = self.config
        positions = torch.arange(t, device=inp.device)
        hidden = self.forward_slow(self.embed(inp), positions, CausalAttention(key_padding_mask))
        token_logits = self.slow_logits(hidden)

        next_codes = torch.zeros(b, c.num_codebooks - 1, t, dtype=inp.dtype, device=inp.device)
        next_codes[:, :, :-1] = inp[:, 1 : c.num_codebooks, 1:]
        next_codes = next_codes.permute(0, 2, 1).reshape(b * t, -1)  # (B*T, nc-1)
        rows = (next_codes != 0).any(dim=1)
        if not rows.any():
            rows[: c.num_codebooks] = True  # the reference computes a few rows regardless
        fast_in = torch.cat(
            [
                self.fast_input_from_hidden(hidden.reshape(b * t, 1, -1)[rows]),
                self.fast_embeddings(next_codes[rows]),
            ],
            dim=1,
        )
        fast_pos = torch.arange(c.num_codebooks, device=inp.device)
        fast_logits = self.forward_fast(fast_in, fast_pos, CausalAttention())
        codebook_logits = fast_logits.new_zeros(b * t, c.num_codebooks, c.codebook_size)
        codebook_logits[rows] = fast_logits
        return token_logits, codebook_logits.view(b, t, c.num_codebooks, c.codebook_size)
