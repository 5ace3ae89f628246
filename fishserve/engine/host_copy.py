"""Copies between host and device through reusable pinned buffers, waited for on an event.

Why not ``tensor.cpu()`` or ``tensor.copy_(torch.from_numpy(array))``: those copy to or from
pageable memory, and the CUDA driver then blocks the calling thread until the copy has run,
in a way that also blocks the other threads' CUDA calls of the process (kernel and graph
launches, event records). Measured on an H200 (docs/benchmarks.md §6.7): an engine step of
12 ms alone took 102 ms beside a decoder thread whose calls ended in a pageable copy, on SMs of
its own, and 18 ms beside the same calls without the copies. With pinned memory the copy is
queued like a kernel (``non_blocking``) and the thread waits on a CUDA event, which blocks only
itself.

Downloads reuse one pinned buffer per `PinnedDownload` (the copy is waited for before it is
read); uploads (`to_device`, `copy_to_device_`) take pinned blocks from PyTorch's caching host
allocator, which keeps each until its copy has run. On the CPU all are plain copies.
"""

from __future__ import annotations

import threading

import numpy as np
import torch
from torch import Tensor

# Offsets of the parts of one flat upload buffer start at multiples of this many bytes: any
# dtype's alignment, and a cache line / global-memory transaction, so views into the buffer
# load as fast as separate tensors (`StagedInputs`, the decoder runner's graph inputs).
ALIGN_BYTES = 128


def align_up(n: int, multiple: int) -> int:
    """`n` rounded up to a multiple of `multiple` (both > 0; units as given)."""
    return -(-n // multiple) * multiple


class PinnedDownload:
    """Device-to-host copies into a reusable pinned buffer (see module docstring).

    Args:
        device: where the tensors to copy live; on the CPU `download` is a plain copy.
        nbytes: initial buffer size in bytes (it grows to the largest copy; growing allocates
            pinned memory, which synchronises the device).
    """

    def __init__(self, device: torch.device, nbytes: int = 1 << 20) -> None:
        cuda = device.type == "cuda"
        self._bytes = (
            torch.empty(max(1, nbytes), dtype=torch.uint8, pin_memory=True) if cuda else None
        )
        self._event = torch.cuda.Event() if cuda else None
        self._host = np.zeros(0)

    def reserve(self, nbytes: int) -> None:
        """Grow the buffer to `nbytes` now (allocating pinned memory synchronises the device,
        so a server does it at start-up); the last download's view stays valid."""
        if self._bytes is not None and nbytes > self._bytes.numel():
            self._bytes = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def download(self, tensor: Tensor) -> np.ndarray:
        """`tensor` (contiguous, a NumPy-compatible dtype) as a NumPy array of its own.

        Queues the copy on the current stream and waits for it: the stream's earlier work is
        done on return.
        """
        return self.download_view(tensor).copy()

    def download_view(self, tensor: Tensor) -> np.ndarray:
        """Like `download`, but on CUDA the array is a view of the pinned buffer, valid
        until the next download (no host copy)."""
        self.start(tensor)
        return self.wait_view()

    def start(self, tensor: Tensor) -> None:
        """Queue the copy of `tensor` on the current stream without waiting; `wait` returns
        it. On the CPU the copy is made at once."""
        if self._bytes is None or self._event is None:
            self._host = tensor.detach().numpy()
            return
        nbytes = tensor.numel() * tensor.element_size()
        self.reserve(nbytes)
        host = self._bytes[:nbytes].view(tensor.dtype).view(tensor.shape)
        host.copy_(tensor, non_blocking=True)
        self._event.record()
        self._host = host.numpy()

    def wait(self) -> np.ndarray:
        """The array of the last `start`, a copy of its own, once the copy has run."""
        return self.wait_view().copy()

    def wait_view(self) -> np.ndarray:
        """Like `wait`, but a view of the pinned buffer, valid until the next `start`."""
        if self._event is not None:
            self._event.synchronize()
        return self._host


_THREAD = threading.local()


def download(tensor: Tensor) -> np.ndarray:
    """`tensor` as a NumPy array of its own, through a pinned buffer of the calling thread
    for its device (a `PinnedDownload`; waits for the current stream's work up to the copy)."""
    if tensor.device.type != "cuda":
        return tensor.detach().numpy().copy()
    buffers: dict[torch.device, PinnedDownload] = _THREAD.__dict__.setdefault("buffers", {})
    if tensor.device not in buffers:
        buffers[tensor.device] = PinnedDownload(tensor.device, nbytes=1 << 16)
    return buffers[tensor.device].download(tensor)


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
