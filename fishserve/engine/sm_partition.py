"""SM partitions: a CUDA stream whose kernels run on a fixed share of the GPU's SMs.

Why: beside the decoder's long convolution blocks, each of an engine step's ~1,300 short
kernels waits for SMs to drain, and a step lasts two to three decoder calls (docs/benchmarks.md
§6.5); stream priorities do not help, since a running block is never preempted. A CUDA green
context (driver API, CUDA 12.4+; `torch.cuda.green_contexts`) owns a subset of the SMs, and
kernels launched on one of its streams run only there. A CUDA graph's kernels run in the
context of the stream that captured it, whatever stream replays it: captured on a green
context's stream it stays on its SMs, captured on an ordinary stream it may use every SM
(`tests/engine/test_sm_partition.py`, on an H200). So the decoder can run on part of the GPU
and leave the rest free for the engine's kernels whenever it is busy.

The driver hands out SMs in groups (8 on Hopper, 2-4 on earlier GPUs: "SM resource
granularity" in the CUDA driver API's green-context docs), so a requested count may be rounded
up to the next group.

PyTorch's `GreenContext.create(num_sms=N)` always takes the first group of N SMs, so two such
contexts overlap. `make_disjoint_partitions` splits the SMs once through the driver API
(`cuDevSmResourceSplitByCount`, from NVIDIA's `cuda-bindings` package) and gives the engine and
the decoder disjoint sets. The server reserves the engine's set (setting `engine_sms`): the
decoder never runs there, the engine's eager kernels run only there, and its decode graphs,
captured on PyTorch's capture stream, may also use idle decoder SMs (at their stream's
priority: high unless `async_scheduling`). On an H200 that kept every stream fed at 448
streams in 3 of 3 runs, where confining the graphs too (`confine_engine_graphs`) cut the
engine's steps per second by a quarter (docs/benchmarks.md §6.21).
"""

from __future__ import annotations

import importlib.util
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)


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
        stream: the stream; kernels launched on it, and CUDA graphs captured on it, use the
            partition only (a graph captured elsewhere may use any SM wherever replayed).
    """

    num_sms: int
    total_sms: int
    stream: torch.cuda.Stream
    context: Any  # torch.cuda.green_contexts.GreenContext, or the driver handles kept alive


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


@dataclass(frozen=True)
class GroupPlan:
    """Which groups of one SM split go to the engine and to the decoder.

    Attributes:
        engine: indices of the engine's groups (the first ones).
        decoder: indices of the decoder's groups (the ones after the engine's).
        remainder: whether the decoder also takes the split's remainder (the SMs no group
            holds: 12 of an H200's 132 in groups of 8).
    """

    engine: tuple[int, ...]
    decoder: tuple[int, ...]
    remainder: bool


def plan_disjoint_groups(
    group_sms: int, groups: int, engine_sms: int, decoder_sms: int | None
) -> GroupPlan:
    """Split `groups` groups of `group_sms` SMs each between the engine and the decoder.

    The engine takes the first ceil(`engine_sms` / `group_sms`) groups; the decoder the next
    ceil(`decoder_sms` / `group_sms`), or, with `decoder_sms` None, every other group and the
    remainder.

    Raises:
        SMPartitionError: a count below 1, the engine taking every group, or the two asking
            for more groups than there are.
    """
    if engine_sms < 1 or (decoder_sms is not None and decoder_sms < 1):
        raise SMPartitionError(
            f"engine_sms and decoder_sms must be >= 1, got {engine_sms} and {decoder_sms}"
        )
    n_engine = math.ceil(engine_sms / group_sms)
    n_decoder = groups - n_engine if decoder_sms is None else math.ceil(decoder_sms / group_sms)
    if n_engine >= groups or n_engine + n_decoder > groups:
        wanted = "none left" if decoder_sms is None else f"{n_decoder * group_sms} asked"
        raise SMPartitionError(
            f"engine_sms {engine_sms} ({n_engine * group_sms} SMs in groups of {group_sms}) "
            f"leaves too few SMs for the decoder ({wanted}): the driver splits this GPU into "
            f"{groups} groups of {group_sms} SMs"
        )
    engine = tuple(range(n_engine))
    return GroupPlan(engine, tuple(range(n_engine, n_engine + n_decoder)), decoder_sms is None)


def make_disjoint_partitions(
    device: torch.device, engine_sms: int, decoder_sms: int | None, engine_priority: int = 0
) -> tuple[SMPartition, SMPartition]:
    """Green contexts on disjoint SMs for the engine (reserved for it) and for the decoder, and
    a stream of each (made on the first call, the same ones after: see `SMPartition`).

    The driver splits the device's SMs into equal groups (at least its minimum partition
    size, 8 on Hopper; it may make them larger); see `plan_disjoint_groups` for who gets
    which. `num_sms` of each partition is the count it got, which may exceed the one asked for.

    Args:
        device: a CUDA device.
        engine_sms: SMs reserved for the engine (rounded up to whole groups).
        decoder_sms: SMs for the decoder (rounded up); None: all SMs the engine leaves.
        engine_priority: CUDA priority of the engine's stream (lower is higher).

    Returns:
        (engine partition, decoder partition).

    Raises:
        SMPartitionError: not a CUDA device, the counts do not fit (`plan_disjoint_groups`),
            another split already made on this device (its SMs would overlap these), the
            `cuda-bindings` package is missing, or the driver refuses (green contexts need
            CUDA 12.4+).
    """
    if device.type != "cuda":
        raise SMPartitionError(f"an SM partition needs a CUDA device, not {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    asked = (engine_sms, decoder_sms, engine_priority)
    if index in _DISJOINT:
        made, partitions = _DISJOINT[index]
        if made != asked:
            raise SMPartitionError(
                f"cuda:{index} is already split for (engine_sms, decoder_sms, priority) {made}; "
                f"a second split {asked} would overlap it"
            )
        return partitions
    driver = _driver()
    _make_current(device)
    cu_device = _ok(driver, driver.cuDeviceGet(index), "cuDeviceGet")
    whole, groups, remainder = _split(driver, cu_device)
    group_sms = int(groups[0].sm.smCount)
    plan = plan_disjoint_groups(group_sms, len(groups), engine_sms, decoder_sms)
    total = int(whole.sm.smCount)
    engine_desc = _descriptor(driver, [groups[i] for i in plan.engine])
    engine = _green_partition(driver, cu_device, engine_desc, total, engine_priority, device)
    picked = [groups[i] for i in plan.decoder]
    extra = remainder if plan.remainder and int(remainder.sm.smCount) > 0 else None
    desc = _decoder_descriptor(driver, picked, extra)
    decoder = _green_partition(driver, cu_device, desc, total, 0, device)
    _DISJOINT[index] = (asked, (engine, decoder))
    return engine, decoder


# Minimum SMs per group asked of the driver where it does not say (its granularity on
# Hopper; a multiple of every earlier GPU's).
DEFAULT_GROUP_SMS = 8
# Per device index: what was asked (engine_sms, decoder_sms, priority) and the partitions.
_DISJOINT: dict[int, tuple[tuple[int, int | None, int], tuple[SMPartition, SMPartition]]] = {}


NO_CUDA_BINDINGS = (
    "engine_sms needs NVIDIA's cuda-bindings package for the driver's SM split "
    "(pip install cuda-bindings of the CUDA major version of PyTorch's build, e.g. "
    "'cuda-bindings==12.*' for torch.version.cuda 12.x)"
)


def cuda_bindings_installed() -> bool:
    """Whether NVIDIA's `cuda.bindings` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec("cuda.bindings") is not None
    except ModuleNotFoundError:  # no `cuda` package at all
        return False


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise SMPartitionError(NO_CUDA_BINDINGS) from exc
    return driver


def _ok(driver: Any, result: Sequence[Any], what: str) -> Any:
    """The values of a `cuda.bindings` call (its first item is the CUresult).

    Raises:
        SMPartitionError: the call failed.
    """
    if result[0] != driver.CUresult.CUDA_SUCCESS:
        raise SMPartitionError(f"{what} failed: {result[0]!r}")
    return result[1] if len(result) == 2 else tuple(result[1:])


def _split(driver: Any, cu_device: Any) -> tuple[Any, list[Any], Any]:
    """(the device's SM resource, its groups of equal size, the remainder) from one split.

    Raises:
        SMPartitionError: a failing call, no group, or groups of unequal sizes.
    """
    whole = _ok(driver, driver.cuDeviceGetDevResource(cu_device, _sm_type(driver)), "get SMs")
    least = max(int(getattr(whole.sm, "minSmPartitionSize", 0) or 0), DEFAULT_GROUP_SMS)
    split = driver.cuDevSmResourceSplitByCount(int(whole.sm.smCount) // least, whole, 0, least)
    groups, count, remainder = _ok(driver, split, "cuDevSmResourceSplitByCount")
    groups = list(groups)[: int(count)]  # the entries past `count` are left empty
    sizes = {int(g.sm.smCount) for g in groups}
    if not groups or len(sizes) != 1:
        raise SMPartitionError(f"the driver split the SMs into groups of sizes {sorted(sizes)}")
    return whole, groups, remainder


def _descriptor(driver: Any, resources: list[Any]) -> Any:
    """A resource descriptor of `resources` (SM groups of one split)."""
    return _ok(driver, driver.cuDevResourceGenerateDesc(resources, len(resources)), "descriptor")


def _decoder_descriptor(driver: Any, groups: list[Any], remainder: Any | None) -> Any:
    """A descriptor of `groups` and, where the driver accepts the mix, `remainder`."""
    if remainder is not None:
        try:
            return _descriptor(driver, [*groups, remainder])
        except SMPartitionError as exc:  # not of the groups' alignment or locality
            log.warning("the decoder's SMs leave out the driver's remainder: %s", exc)
    return _descriptor(driver, groups)


def _green_partition(
    driver: Any, cu_device: Any, desc: Any, total: int, priority: int, device: torch.device
) -> SMPartition:
    """A green context of the resources in `desc` and a stream of it."""
    flags = driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
    context = _ok(driver, driver.cuGreenCtxCreate(desc, cu_device, flags), "cuGreenCtxCreate")
    sms = _ok(driver, driver.cuGreenCtxGetDevResource(context, _sm_type(driver)), "its SMs")
    non_blocking = driver.CUstream_flags.CU_STREAM_NON_BLOCKING
    handle = _ok(driver, driver.cuGreenCtxStreamCreate(context, non_blocking, priority), "stream")
    stream = _external_stream(int(handle), device)  # int(CUstream): the stream's address
    return SMPartition(int(sms.sm.smCount), total, stream, (desc, context, handle))


def _sm_type(driver: Any) -> Any:
    return driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM


def _make_current(device: torch.device) -> None:
    """Initialise PyTorch's CUDA context on `device` (the driver calls need one current)."""
    torch.zeros(1, device=device)


def _external_stream(pointer: int, device: torch.device) -> torch.cuda.Stream:
    """PyTorch's handle of a stream made through the driver (`pointer`: its CUstream)."""
    return torch.cuda.ExternalStream(pointer, device=device)
