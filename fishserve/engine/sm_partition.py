"""SM partitions: a CUDA stream whose kernels run on a fixed share of the GPU's SMs.

Why: beside the decoder's long convolution blocks, each of an engine step's ~1,300 short
kernels waits for SMs to drain, and a step lasts two to three decoder calls (docs/benchmarks.md
§6.5); stream priorities do not help, since a running block is never preempted. A CUDA green
context (driver API, CUDA 12.4+; `torch.cuda.green_contexts`) owns a subset of the SMs, and
work launched on one of its streams, CUDA graphs captured on that stream included, runs only
there; work on ordinary streams still uses every SM. So the decoder can run on part of the GPU
and leave the rest free for the engine's kernels whenever it is busy.

The driver hands out SMs in groups (8 on Hopper, 2-4 on earlier GPUs: "SM resource
granularity" in the CUDA driver API's green-context docs), so a requested count may be rounded
up to the next group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class SMPartitionError(ValueError):
    """The requested SM partition cannot be made on this device or PyTorch build."""


@dataclass
class SMPartition:
    """A green context of `num_sms` SMs and a CUDA stream that runs on them.

    One per device and size for the whole process (`make_partition` keeps them): destroying a
    green context while CUDA graphs, events or buffers used on its stream still exist aborts
    the process (seen on an H200, PyTorch 2.11), so it is destroyed only at exit.

    Attributes:
        num_sms: SMs requested (the driver may round up to its granularity).
        total_sms: SMs of the whole device.
        stream: the stream; kernels and CUDA graphs launched on it use the partition only.
    """

    num_sms: int
    total_sms: int
    stream: torch.cuda.Stream
    context: Any  # torch.cuda.green_contexts.GreenContext


def device_sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA `device` (132 on an H200 SXM)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def check_sm_count(num_sms: int, device: torch.device) -> None:
    """Validate `num_sms` for `device` without creating anything.

    Raises:
        SMPartitionError: not a CUDA device, fewer than 1 or not fewer than the device's SMs,
            or this PyTorch build has no green contexts.
    """
    if device.type != "cuda":
        raise SMPartitionError(f"an SM partition needs a CUDA device, not {device}")
    if not _green_contexts_supported():
        raise SMPartitionError(
            "this PyTorch build has no CUDA green contexts (torch.cuda.green_contexts); "
            "leave decoder_sms unset"
        )
    total = device_sm_count(device)
    if not 1 <= num_sms < total:
        raise SMPartitionError(f"decoder_sms must be between 1 and {total - 1} on {device}")


# Partitions made so far, by (device index, SMs): kept until the process exits.
_PARTITIONS: dict[tuple[int, int], SMPartition] = {}


def make_partition(device: torch.device, num_sms: int) -> SMPartition:
    """The green context of `num_sms` SMs on `device` and a stream of it (made on the first
    call, the same one after: see `SMPartition`).

    Raises:
        SMPartitionError: see `check_sm_count`; also when the driver refuses the context (too
            old a driver: green contexts need CUDA 12.4+) or the build cannot give a stream.
    """
    check_sm_count(num_sms, device)
    from torch.cuda.green_contexts import GreenContext

    index = device.index if device.index is not None else torch.cuda.current_device()
    if (index, num_sms) in _PARTITIONS:
        return _PARTITIONS[(index, num_sms)]
    try:
        context = GreenContext.create(num_sms=num_sms, device_id=index)
    except RuntimeError as exc:
        raise SMPartitionError(f"cannot create a green context of {num_sms} SMs: {exc}") from exc
    if not hasattr(context, "Stream"):
        raise SMPartitionError("this PyTorch build's green contexts cannot make streams")
    partition = SMPartition(num_sms, device_sm_count(device), context.Stream(), context)
    _PARTITIONS[(index, num_sms)] = partition
    return partition


def _green_contexts_supported() -> bool:
    try:
        from torch.cuda import green_contexts
    except ImportError:
        return False
    return bool(getattr(green_contexts, "SUPPORTED", False))
