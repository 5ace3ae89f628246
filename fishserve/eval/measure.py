"""Device memory of one configuration, relative to what was allocated before it loaded.

On CUDA the numbers come from PyTorch's caching allocator (`torch.cuda.memory_allocated` and
`max_memory_allocated`: bytes of live tensors, not the allocator's reserved pool nor the CUDA
context). On CPU the load figure is the bytes of the model, KV pool and decoder tensors, and
peaks are not measured (None).
"""

from __future__ import annotations

import gc

import torch

from fishserve.engine.kv_cache import PagedKVCache
from fishserve.engine.memory import module_bytes
from fishserve.eval.variants import Loaded


def cache_bytes(cache: PagedKVCache) -> int:
    """Bytes of a paged KV pool (values and scales)."""
    tensors = [cache.k, cache.v, cache.k_scale, cache.v_scale]
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def loaded_bytes(loaded: Loaded) -> dict[str, int]:
    """Tensor bytes of each part of a loaded configuration."""
    return {
        "llm_weights": module_bytes(loaded.model),
        "kv_pool": cache_bytes(loaded.engine.cache),
        "decoder_weights": module_bytes(loaded.decoder),
    }


class DeviceMemory:
    """Allocations on one device since `start()`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.baseline = 0

    def start(self) -> None:
        """Free what can be freed and remember the allocated bytes as zero."""
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            self.baseline = torch.cuda.memory_allocated(self.device)

    def allocated(self) -> int | None:
        """Bytes allocated since `start()` (None on CPU)."""
        if not self.cuda:
            return None
        torch.cuda.synchronize(self.device)
        return torch.cuda.memory_allocated(self.device) - self.baseline

    def reset_peak(self) -> None:
        """Start a new peak window."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int | None:
        """Peak bytes since `start()` within the current window (None on CPU)."""
        if not self.cuda:
            return None
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device) - self.baseline
