"""The paged KV cache: one pool of fixed-size blocks shared by all slow-transformer layers.

Storage is flat over slots: slot = block * block_size + offset (vLLM's slot mapping). Each
layer holds K and V tensors of shape (num_slots, KV, Dh) in the storage dtype. For `int8` and
`fp8` the values are quantized when written, symmetric, with one float32 scale per token per KV
head stored beside the blocks (shape (num_slots, KV)):

    int8: scale = max|x| / 127, q = round(x / scale) in [-127, 127]
    fp8:  scale = max|x| / 448, q = float8_e4m3fn(x / scale)   (448 = largest e4m3 value)

and dequantized as q * scale when read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fishserve.models.fusion import gpu_fused

_STORAGE = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "int8": torch.int8,
    "fp8": torch.float8_e4m3fn,
}
# Largest representable magnitude per quantized type (OCP FP8 spec: e4m3fn max 448).
_QMAX = {"int8": 127.0, "fp8": 448.0}
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
KV_CACHE_DTYPES = ("auto", *_STORAGE)


def resolve_kv_dtype(name: str, weight_dtype: torch.dtype) -> str:
    """Map a `--kv-cache-dtype` value to a storage name; `auto` = the weight dtype.

    Raises:
        ValueError: unknown name.
    """
    if name == "auto":
        return _DTYPE_NAMES[weight_dtype]
    if name not in _STORAGE:
        choices = ", ".join(KV_CACHE_DTYPES)
        raise ValueError(f"unknown KV cache dtype {name!r}; use one of {choices}")
    return name


@dataclass(frozen=True)
class KVCacheLayout:
    """Sizes of the paged KV pool.

    Attributes:
        num_layers, kv_heads, head_dim: from the slow transformer.
        block_size: positions per block.
        num_blocks: blocks in the pool.
        dtype: storage name (fp32, bf16, fp16, int8, fp8).
    """

    num_layers: int
    kv_heads: int
    head_dim: int
    block_size: int
    num_blocks: int
    dtype: str

    @property
    def quantized(self) -> bool:
        """True for int8/fp8 storage (with per-token-per-head scales)."""
        return self.dtype in _QMAX

    @property
    def bytes_per_token(self) -> int:
        """Bytes one position occupies over all layers, K and V, scales included."""
        return kv_bytes_per_token(self.num_layers, self.kv_heads, self.head_dim, self.dtype)

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block over all layers."""
        return self.bytes_per_token * self.block_size


def kv_bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype: str) -> int:
    """KV bytes per position: 2 (K, V) * layers * KV heads * (Dh * elem + scale bytes)."""
    elem = torch.empty((), dtype=_STORAGE[dtype]).element_size()
    scale = 4 if dtype in _QMAX else 0
    return 2 * num_layers * kv_heads * (head_dim * elem + scale)


@gpu_fused
def quantize(x: Tensor, dtype: str) -> tuple[Tensor, Tensor]:
    """Quantize x (N, KV, Dh) per token per head.

    Returns:
        (values (N, KV, Dh) in the storage dtype, float32 scales (N, KV)).
    """
    xf = x.float()
    scale = xf.abs().amax(dim=-1).clamp(min=1e-8) / _QMAX[dtype]
    scaled = xf / scale[..., None]
    if dtype == "int8":
        return scaled.round().clamp(-127, 127).to(torch.int8), scale
    return scaled.to(_STORAGE[dtype]), scale


class PagedKVCache:
    """K/V storage for all slow layers, indexed by slot.

    Memory: `layout.bytes_per_block * layout.num_blocks` bytes, allocated once.
    """

    def __init__(self, layout: KVCacheLayout, device: torch.device | str) -> None:
        self.layout = layout
        slots = layout.num_blocks * layout.block_size
        shape = (layout.num_layers, slots, layout.kv_heads, layout.head_dim)
        storage = _STORAGE[layout.dtype]
        self.k = torch.zeros(shape, dtype=storage, device=device)
        self.v = torch.zeros(shape, dtype=storage, device=device)
        self.k_scale: Tensor | None = None
        self.v_scale: Tensor | None = None
        if layout.quantized:
            self.k_scale = torch.ones(shape[:3], dtype=torch.float32, device=device)
            self.v_scale = torch.ones(shape[:3], dtype=torch.float32, device=device)

    def write(self, layer: int, slots: Tensor, k: Tensor, v: Tensor) -> None:
        """Store K/V (N, KV, Dh) of N positions at `slots` (N,) int64 of `layer`."""
        if not self.layout.quantized:
            self.k[layer, slots] = k.to(self.k.dtype)
            self.v[layer, slots] = v.to(self.v.dtype)
            return
        for store, scales, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            q, s = quantize(x, self.layout.dtype)
            store[layer, slots] = q
            scales[layer, slots] = s

    def read(self, layer: int, slots: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """K and V at `slots` (any shape S) of `layer`, dequantized: (*S, KV, Dh) in `dtype`."""
        k, v = self.k[layer, slots], self.v[layer, slots]
        if not self.layout.quantized:
            return k.to(dtype), v.to(dtype)
        k = k.float() * self.k_scale[layer, slots][..., None]
        v = v.float() * self.v_scale[layer, slots][..., None]
        return k.to(dtype), v.to(dtype)
