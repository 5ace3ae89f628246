"""Copies between host and device through reusable pinned buffers, waited for on an event.

Why not ``tensor.cpu()`` or ``tensor.copy_(torch.from_numpy(array))``: those copy to or from
pageable memory, and the CUDA driver then blocks the calling thread until the copy has run,
in a way that also blocks the other threads' CUDA calls of the process (kernel and graph
launches, event records). Measured on an H200 (docs/benchmarks.md §6.7): an engine step of
12 ms alone took 102 ms beside a decoder thread whose calls ended in a pageable copy, on SMs of
its own, and 18 ms beside the same calls without the copies. With pinned memory the copy is
queued like a kernel (``non_blocking``) and the thread waits on a CUDA event, which blocks only
itself.

Contract: `PinnedUpload.upload` reuses its buffer, so the previous upload must have run before
the next one: one `PinnedUpload` per array uploaded in a call, and a wait for the stream
between calls (callers end each call with a `PinnedDownload.download`, which waits). On the
CPU both are plain copies.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


class _PinnedBuffer:
    """A pinned host byte buffer that grows to the largest request (growing allocates pinned
    memory, which synchronises the device: size it at start-up)."""

    def __init__(self, nbytes: int) -> None:
        self._bytes = torch.empty(max(1, nbytes), dtype=torch.uint8, pin_memory=True)

    def view(self, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """A pinned tensor of `shape` and `dtype` over the buffer's first bytes."""
        nbytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        if nbytes > self._bytes.numel():
            self._bytes = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return self._bytes[:nbytes].view(dtype).view(shape)


class PinnedDownload:
    """Device-to-host copies into a reusable pinned buffer (see module docstring).

    Args:
        device: where the tensors to copy live; on the CPU `download` is a plain copy.
        nbytes: initial buffer size in bytes (it grows to the largest copy).
    """

    def __init__(self, device: torch.device, nbytes: int = 1 << 20) -> None:
        self.cuda = device.type == "cuda"
        self._buffer = _PinnedBuffer(nbytes) if self.cuda else None
        self._event = torch.cuda.Event() if self.cuda else None

    def download(self, tensor: Tensor) -> np.ndarray:
        """`tensor` (contiguous, a NumPy-compatible dtype) as a NumPy array of its own.

        Queues the copy on the current stream and waits for it: the stream's earlier work is
        done on return.
        """
        return self.download_view(tensor).copy()

    def download_view(self, tensor: Tensor) -> np.ndarray:
        """Like `download`, but on CUDA the array is a view of the pinned buffer, valid
        until the next download (no host copy)."""
        if self._buffer is None or self._event is None:
            return tensor.detach().numpy()
        host = self._buffer.view(tuple(tensor.shape), tensor.dtype)
        host.copy_(tensor, non_blocking=True)
        self._event.record()
        self._event.synchronize()
        return host.numpy()


class PinnedUpload:
    """Host-to-device copies through a reusable pinned buffer (see module docstring).

    Args:
        device: the destination device; on the CPU `upload` is a plain copy.
        nbytes: initial buffer size in bytes (it grows to the largest copy).
    """

    def __init__(self, device: torch.device, nbytes: int = 1 << 20) -> None:
        self._buffer = _PinnedBuffer(nbytes) if device.type == "cuda" else None

    def upload(self, dst: Tensor, array: np.ndarray) -> None:
        """Queue ``dst.copy_(array)`` on the current stream (`array` of `dst`'s shape).

        The buffer is reused: the stream must have run this copy before the next `upload`.
        """
        source = torch.from_numpy(np.ascontiguousarray(array))
        if self._buffer is None:
            dst.copy_(source)
            return
        host = self._buffer.view(tuple(source.shape), source.dtype)
        host.copy_(source)
        dst.copy_(host, non_blocking=True)


def to_device(tensor: Tensor, device: torch.device) -> Tensor:
    """`tensor` (on the host) copied to `device` without blocking any thread.

    On CUDA the copy goes through pinned memory from PyTorch's caching host allocator, which
    keeps the block until the copy has run (see the module docstring for why not from pageable
    memory); elsewhere it is ``tensor.to(device)``.
    """
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def copy_to_device_(dst: Tensor, src: Tensor) -> None:
    """``dst.copy_(src)`` for a host `src`, through pinned memory on CUDA (see `to_device`)."""
    if dst.device.type != "cuda" or src.device.type != "cpu":
        dst.copy_(src)
        return
    dst.copy_(src.pin_memory(), non_blocking=True)
