"""The GPU decoder runner: fixed shapes, compiled kernels, CUDA graphs and its own CUDA stream.

Batched decode calls (:mod:`fishserve.audio.batching`) have many shapes: any number of jobs,
any job length. :class:`DecoderRunner` rounds every call up to a fixed bucket, the batch to the
next of 1, 2, 4, ... ``max_batch`` and the frames to the next of ``frame_buckets`` (by default
the job lengths the chunk schedule produces, :func:`frame_buckets_for`), so that on the GPU:

* on CUDA the HiFi-GAN head runs as fused channels-last Triton convolutions
  (:class:`~fishserve.models.firefly.triton_head.TritonHead`, ``kernels="triton"``, the default
  where Triton is installed), or as PyTorch/cuDNN convolutions (``kernels="torch"``);
* optionally (``channels_last=True``, PyTorch head) the head runs as channels_last conv2d (no cuDNN
  NCHW<->NHWC transposes, see :mod:`fishserve.models.firefly.layers`), and with
  ``compile=True`` inductor fuses the SiLU, padding and residual adds (dynamic shapes; all
  compilation happens at start-up, which then takes minutes on an H200). Both are off by
  default: measured on the H200, uncompiled channels_last is slower from 8 jobs per call;
* each bucket is captured in a CUDA graph at start-up (``num_captures``), so a call costs one
  graph launch instead of ~700 kernel launches (and the GIL is free for the engine thread);
* with the Triton head and ``trim_context`` (how the server runs), a job's context frames are
  decoded only as far as its new samples need them: each layer of the head computes the new
  samples plus what the rest of the head reaches back to
  (:meth:`FireflyGenerator.decode_tail_unchecked`), not ``context + new`` frames at every
  layer. Buckets then count new frames, and every call decodes ``bucket + trim_context``
  frames of latent. With the released decoder and 15 context frames this is ~1.5x less work
  for a 20-frame chunk (the heavy late layers reach back < 1.5 frames, docs/benchmarks.md);
* everything runs on a dedicated CUDA stream, so decoder calls overlap the language model's
  steps instead of queueing behind them on one stream; with ``num_sms`` that stream belongs to
  a green context of that many SMs (:mod:`fishserve.engine.sm_partition`), graphs captured on
  it included, so a busy decoder leaves the other SMs to the engine's kernels;
* a call can be launched without waiting for it (:meth:`DecoderRunner.start_jobs`, up to
  `MAX_IN_FLIGHT` at once): its inputs go up through a pinned staging buffer and its audio
  comes down into a pinned buffer of its own, so the caller prepares the next call, or cuts
  up the last one's audio, while the GPU decodes (the decoder thread's pipelining,
  :mod:`fishserve.server.decode_worker`).

Why padding is exact: right-padded frames cannot reach earlier samples (every op is causal) and
padded batch rows have length 0; each job keeps only its own samples (see ``batching``). On the
CPU the runner decodes eagerly without padding (unless ``pad=True``), exactly as
``FireflyGenerator.decode``. Exact in the math, not bit for bit: a chunk decoded in a batch of
several jobs can round differently from the same chunk decoded alone (convolution kernels pick
their algorithm and reduction order by shape), ~1e-7 relative, an occasional 16-bit LSB.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fishserve.engine.busy_timer import BusyTimer
from fishserve.engine.graph_decoder import graph_buckets
from fishserve.engine.host_copy import ALIGN_BYTES, PinnedDownload, align_up, to_device
from fishserve.engine.sm_partition import SMPartition, SMPartitionError, make_partition
from fishserve.models.firefly import FireflyConfig, FireflyGenerator
from fishserve.models.firefly.triton_head import (
    TritonHead,
    triton_head_available,
    triton_interpreted,
)
from fishserve.models.fusion import gpu_fused

from .batching import DecodeJob, check_groups, decode_stateful, pad_jobs, split_samples
from .streaming import ChunkPolicy

log = logging.getLogger(__name__)
FRAME_ALIGN = 8  # frame buckets are multiples of 8 code frames (0.37 s at 21.53 frames/s)

__all__ = [
    "DECODER_KERNELS",
    "MAX_IN_FLIGHT",
    "DecoderRunner",
    "PendingDecode",
    "frame_buckets_for",
    "new_frame_buckets_for",
    "resolve_kernels",
]
DECODER_KERNELS = ("auto", "triton", "torch")
# Calls launched by `DecoderRunner.start_jobs` whose audio is not read yet, at most: one
# decoding, one whose audio is being cut up (or the next one queued behind it).
MAX_IN_FLIGHT = 2


def _triton_head_missing(device: torch.device, capability: bool) -> str:
    """Why the Triton head cannot run on `device` ("" when it can)."""
    if device.type != "cuda":
        return f"the device is {device}"
    if not triton_head_available():
        return "Triton is not installed"
    if capability:  # initialises CUDA in this process
        major, minor = torch.cuda.get_device_capability(device)
        if major < 8:
            return f"{device} has compute capability {major}.{minor}"
    return ""


def resolve_kernels(kernels: str, device: torch.device, capability: bool = True) -> str:
    """``"auto"`` -> ``"triton"`` where the Triton head can run, else ``"torch"``.

    The Triton head needs a CUDA device of compute capability 8.0 or later (Ampere: bf16
    tensor-core dots, and the shared memory its tiles are sized for) and Triton installed.
    With ``capability=False`` the compute capability is not checked (no CUDA initialisation:
    for a process that must not create a CUDA context, such as the HTTP process).

    Raises:
        ValueError: unknown name, or ``"triton"`` asked for where it cannot run.
    """
    if kernels not in DECODER_KERNELS:
        raise ValueError(f"decoder kernels must be one of {', '.join(DECODER_KERNELS)}")
    missing = _triton_head_missing(device, capability)
    interpreter = device.type == "cpu" and triton_interpreted() and triton_head_available()
    if kernels == "triton" and interpreter:
        return "triton"  # Triton's CPU interpreter, asked for by name: how tests run the kernels
    if kernels == "triton" and missing:
        raise ValueError(
            f"decoder kernels 'triton' need a CUDA device of compute capability 8.0+ and "
            f"Triton ({missing}); use 'auto' or 'torch'"
        )
    if kernels == "auto":
        return "torch" if missing else "triton"
    return kernels


def frame_buckets_for(policy: ChunkPolicy, config: FireflyConfig) -> tuple[int, ...]:
    """Every multiple of 8 from the shortest to the longest job of `policy`'s chunk schedule.

    A stream's jobs are its first chunk (no context yet), then ``context + chunk`` frames for
    each growing chunk size up to ``chunk_frames``; but a last chunk and the early chunks of a
    client about to run dry (`server.pipeline`) can have any length in between, and a call pads
    every job to its bucket, so every multiple of 8 gets one. The default policy with the
    released decoder gives (16, 24, ..., 80): 9 buckets.
    """
    context = policy.context_frames(config)
    sizes, chunk = {policy.first_chunk_frames}, policy.first_chunk_frames
    while True:
        nxt = policy.next_chunk_frames(chunk)
        sizes.add(min(context, chunk) + nxt if len(sizes) == 1 else context + nxt)
        if nxt == chunk:
            break
        chunk = nxt
    sizes.add(policy.max_decode_frames(config))
    low, high = (math.ceil(s / FRAME_ALIGN) for s in (min(sizes), max(sizes)))
    return tuple(FRAME_ALIGN * k for k in range(low, high + 1))


def new_frame_buckets_for(policy: ChunkPolicy) -> tuple[int, ...]:
    """Buckets of a runner with ``trim_context``: every multiple of 8 up to the largest chunk
    of `policy` (a job's new frames; its context is trimmed, see the module docstring). The
    default policy gives (8, 16, ..., 64): 8 buckets."""
    high = math.ceil(max(policy.first_chunk_frames, policy.chunk_frames) / FRAME_ALIGN)
    return tuple(FRAME_ALIGN * k for k in range(1, high + 1))


# Decoder calls of up to this many jobs are captured at every batch size, not just powers of
# two: a call of 5 jobs would otherwise run (and cost) 8.
EXACT_BATCH_BUCKETS = 8


def decoder_batch_buckets(max_batch: int) -> list[int]:
    """Captured batch sizes of the decoder: 1 to `EXACT_BATCH_BUCKETS` each, then powers of
    two, then `max_batch`."""
    exact = list(range(1, min(max_batch, EXACT_BATCH_BUCKETS) + 1))
    return exact + [b for b in graph_buckets(max_batch) if b > exact[-1]]


def _decode(
    codes: Tensor,
    lengths: Tensor,
    decoder: FireflyGenerator,
    channels_last: bool,
    head: TritonHead | None = None,
) -> Tensor:
    """`FireflyGenerator.decode_unchecked` in the chosen layout / head."""
    return decoder.decode_unchecked(codes, lengths, channels_last=channels_last, head=head)


_decode_compiled = gpu_fused(_decode)


@dataclass
class _Captured:
    """One bucket's CUDA graph and the static tensors it reads and writes."""

    graph: torch.cuda.CUDAGraph
    inputs: Tensor  # int64 (N,): codes, lengths and skip, each 128-byte aligned (one upload)
    codes: Tensor  # (B, G, L) int64, a view of `inputs` at offset 0
    lengths: Tensor  # (B,) int64, a view of `inputs` at `lengths_at`
    skip: Tensor | None  # (num_convs, B) int64 skip rows of a trimmed head (at `skip_at`)
    wave: Tensor  # (B, frames * frame_samples) float32
    lengths_at: int  # element offsets in `inputs`
    skip_at: int


class _Slot:
    """The pinned host buffers of one call in flight: its inputs' staging, its audio."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.download = PinnedDownload(device)
        self._staging = torch.empty(0, dtype=torch.int64, pin_memory=self.cuda)
        self._staging_np = self._staging.numpy()

    def reserve(self, upload_elements: int, download_bytes: int) -> None:
        """Grow the buffers to these sizes now (allocating pinned memory synchronises the
        device: done at start-up, not while serving)."""
        if upload_elements > self._staging.numel():
            self._staging = torch.empty(upload_elements, dtype=torch.int64, pin_memory=self.cuda)
            self._staging_np = self._staging.numpy()
        self.download.reserve(download_bytes)

    def upload(self, dst: Tensor, parts: Sequence[tuple[int, np.ndarray]]) -> None:
        """Copy int64 host arrays into the flat int64 device tensor `dst`, each at its
        element offset (`parts`: ``(offset, array)``), on the current stream, through this
        slot's staging buffer, without waiting: one copy of all of `dst` whatever the number
        of arrays (each PyTorch call costs a round trip of the GIL, docs/benchmarks.md §6.15;
        elements no part covers get whatever the staging buffer held).

        Raises:
            ValueError: a part that does not lie inside `dst`.
        """
        total = dst.numel()
        self.reserve(total, 0)
        host = self._staging_np
        for offset, src in parts:
            if offset < 0 or offset + src.size > total:
                raise ValueError(
                    f"{src.size} elements at {offset} do not fit a tensor of {total} elements"
                )
            host[offset : offset + src.size] = src.reshape(-1)
        dst.copy_(self._staging[:total], non_blocking=True)


class PendingDecode:
    """A decoder call launched by :meth:`DecoderRunner.start_jobs`, its audio not read yet.

    On CUDA the call runs on the runner's stream while the host goes on: :meth:`ready` says
    whether its work (with the copy of its audio to pinned host memory) has run, without
    blocking; :meth:`wait_gpu` waits for it; :meth:`result` cuts each job's samples out and
    frees the call's buffers for another call. On the CPU the call ran in ``start_jobs``.
    """

    def __init__(
        self,
        runner: DecoderRunner,
        slot: _Slot,
        cut: Callable[[np.ndarray], list[np.ndarray]],
    ) -> None:
        self._runner, self._slot, self._cut = runner, slot, cut
        self._done = False
        # the call's own event: the slot's is recorded again by a later call once this one's
        # result is taken, and another thread may still be waiting on this call then
        self._event: torch.cuda.Event | None = None
        if runner.stream is not None:
            self._event = torch.cuda.Event()
            self._event.record(runner.stream)

    def ready(self) -> bool:
        """Whether the call's GPU work is done (never blocks; always True on the CPU)."""
        return self._event is None or self._event.query()

    def wait_gpu(self) -> None:
        """Block until the call's GPU work is done (releases the GIL while waiting); any
        thread may wait."""
        if self._event is not None:
            self._event.synchronize()

    def result(self) -> list[np.ndarray]:
        """One ``(job.new_frames * frame_samples,)`` float32 array per job, in order, at
        ``config.sample_rate`` Hz (waits for the call first).

        Raises:
            RuntimeError: the result was taken already (the call's buffers are reused).
        """
        if self._done:
            raise RuntimeError("this decoder call's result was taken already")
        self._done = True
        try:
            return self._cut(self._slot.download.wait_view())
        finally:
            self._runner._release(self._slot)


class DecoderRunner:
    """Decodes padded batches of jobs through fixed shapes (see module docstring).

    Args:
        decoder: the Firefly generator (its device and dtype are used as they are).
        max_batch: most jobs per call; larger calls are split.
        frame_buckets: padded frame lengths, ascending; a longer job runs unpadded and eager.
        use_graphs: capture a CUDA graph per (batch, frames) bucket at start-up (CUDA only;
            default: on for CUDA).
        pad: pad to buckets even without graphs (default: only with graphs); tests use it.
        compile: fuse the PyTorch head's elementwise work with torch.compile (CUDA only; the
            Triton head is fused already and is not compiled).
        channels_last: run the PyTorch head as channels_last conv2d (see the module
            docstring). Off by default: uncompiled, cuDNN picks much slower kernels for it from
            8 jobs per call on an H200 (docs/benchmarks.md §2).
        kernels: ``"triton"``, ``"torch"`` or ``"auto"`` (Triton where usable, see
            :func:`resolve_kernels`); the CPU always runs the PyTorch head.
        num_sms: run on a partition of this many SMs (CUDA green context, see
            :mod:`fishserve.engine.sm_partition`); None: the decoder's stream may use every SM.
        partition: run on this SM partition instead (e.g. the decoder's of
            `make_disjoint_partitions`, disjoint from the engine's); not with `num_sms`.
        trim_context: with the Triton head, decode each job's context only as far as its new
            samples need it, keeping at most this many context frames per job (the chunk
            policy's context; module docstring); `frame_buckets` then count new frames.
            Ignored with the PyTorch head. None: decode every frame of every job.

    Raises:
        ValueError: bad ``kernels`` (see :func:`resolve_kernels`).
        SMPartitionError: ``num_sms`` given but no such partition can be made, both
            ``num_sms`` and ``partition``, or ``partition`` off CUDA (a ValueError).

    Attributes:
        kernels: the head's kernels in use, ``"triton"`` or ``"torch"``.
        trim_context: the context kept per job when trimming, else None.
        num_captures: CUDA graphs captured (0 on CPU or with ``use_graphs=False``).
        busy_seconds: decoder time on its stream, measured with CUDA events (wall time on CPU).
        calls, frames_decoded, jobs_decoded: calls made, new frames decoded and jobs (audio
            chunks) decoded (for metrics).
    """

    def __init__(
        self,
        decoder: FireflyGenerator,
        max_batch: int,
        frame_buckets: Sequence[int],
        use_graphs: bool | None = None,
        pad: bool | None = None,
        compile: bool = False,
        channels_last: bool = False,
        kernels: str = "auto",
        num_sms: int | None = None,
        trim_context: int | None = None,
        partition: SMPartition | None = None,
    ) -> None:
        self.decoder = decoder
        self.config = decoder.config
        self.device = decoder.device
        cuda = self.device.type == "cuda"
        self.use_graphs = cuda if use_graphs is None else use_graphs and cuda
        self.pad = self.use_graphs if pad is None else pad
        self.kernels = resolve_kernels(kernels, self.device)
        head = TritonHead(decoder.head) if self.kernels == "triton" else None
        self.head = head
        self.trim_context = trim_context if head is not None else None
        if trim_context is not None and trim_context < 0:
            raise ValueError(f"trim_context must be >= 0, got {trim_context}")
        if compile and head is not None:
            log.warning("decoder_compile applies to the PyTorch head only; the Triton head runs")
        log.info("decoder head kernels: %s", self.kernels)
        self._forward = functools.partial(
            _decode_compiled if compile and head is None else _decode,
            channels_last=channels_last,
            head=head,
        )
        self.batch_buckets = decoder_batch_buckets(max_batch)
        self.frame_buckets = tuple(sorted(frame_buckets))
        if num_sms is not None and partition is not None:
            raise SMPartitionError("give the decoder num_sms or a partition, not both")
        if partition is not None and not cuda:
            raise SMPartitionError(f"an SM partition needs a CUDA decoder, not {self.device}")
        self.partition = partition
        if num_sms is not None:
            self.partition = make_partition(self.device, num_sms)
        self.stream = self._make_stream() if cuda else None
        # Pinned copies: a pageable copy here blocked the engine thread's CUDA calls until the
        # whole decoder call had run (`fishserve.engine.host_copy`). One set per call in flight.
        self._free_slots = [_Slot(self.device) for _ in range(MAX_IN_FLIGHT)]
        self.graphs: dict[tuple[int, int], _Captured] = {}
        self.busy = BusyTimer(self.device)
        self.calls = 0
        self.frames_decoded = 0
        self.jobs_decoded = 0
        if self.use_graphs:
            self._capture_all()

    @classmethod
    def for_policy(
        cls,
        decoder: FireflyGenerator,
        policy: ChunkPolicy,
        max_batch: int,
        *,
        trim: bool = True,
        **kwargs: Any,
    ) -> DecoderRunner:
        """The runner for streams chunked by `policy`: with the Triton head (and `trim`),
        context trimmed to ``policy.context_frames`` and buckets of new frames
        (:func:`new_frame_buckets_for`); otherwise buckets of whole jobs
        (:func:`frame_buckets_for`). `kwargs` go to the constructor.

        Raises:
            ValueError, SMPartitionError: as the constructor.
        """
        kernels = str(kwargs.pop("kernels", "auto"))
        triton = resolve_kernels(kernels, decoder.device) == "triton"
        if trim and triton:
            context = policy.context_frames(decoder.config)
            buckets = new_frame_buckets_for(policy)
            return cls(decoder, max_batch, buckets, kernels=kernels, trim_context=context, **kwargs)
        buckets = frame_buckets_for(policy, decoder.config)
        return cls(decoder, max_batch, buckets, kernels=kernels, **kwargs)

    def job_frames(self, job: DecodeJob) -> int:
        """The frames `job` is bucketed by: its new frames when trimming, else all of them."""
        return job.new_frames if self.trim_context is not None else job.total_frames

    @property
    def max_batch(self) -> int:
        """Most jobs per call."""
        return self.batch_buckets[-1]

    def frame_bucket(self, frames: int) -> int:
        """Frames a job of `frames` runs as: the next frame bucket (`frames` past the last)."""
        return next((size for size in self.frame_buckets if size >= frames), frames)

    def batch_bucket(self, jobs: int) -> int:
        """Rows a call of `jobs` (<= `max_batch`) jobs runs as: the next batch bucket when
        padding, else `jobs`."""
        return next(size for size in self.batch_buckets if size >= jobs) if self.pad else jobs

    @property
    def num_captures(self) -> int:
        """CUDA graphs captured at start-up."""
        return len(self.graphs)

    # ------------------------------------------------------------------ public API
    def decode_jobs(self, jobs: Sequence[DecodeJob]) -> list[np.ndarray]:
        """Decode jobs (in calls of at most ``max_batch``); same result as ``decode_batch``.

        Returns:
            One ``(job.new_frames * frame_samples,)`` float32 array per job, in order, at
            ``config.sample_rate`` Hz.

        Raises:
            ValueError: a job's codes do not have ``config.n_groups`` rows.
            RuntimeError: `MAX_IN_FLIGHT` calls of `start_jobs` are in flight.
        """
        out: list[np.ndarray] = []
        for start in range(0, len(jobs), self.max_batch):
            out += self.start_jobs(jobs[start : start + self.max_batch]).result()
        return out

    def start_jobs(self, jobs: Sequence[DecodeJob]) -> PendingDecode:
        """Launch one call for 1 to ``max_batch`` jobs and return without waiting for it.

        On CUDA the call is queued on the runner's stream; ``result()`` of the returned
        :class:`PendingDecode` gives what :meth:`decode_jobs` would. At most `MAX_IN_FLIGHT`
        calls may be in flight (launched, result not taken); calls run in launch order.

        Raises:
            ValueError: no jobs, more than ``max_batch``, or a job's codes do not have
                ``config.n_groups`` rows.
            RuntimeError: `MAX_IN_FLIGHT` calls are in flight already.
        """
        if not 1 <= len(jobs) <= self.max_batch:
            raise ValueError(f"a decoder call takes 1 to {self.max_batch} jobs, got {len(jobs)}")
        check_groups(jobs, self.config.n_groups)
        slot = self._take_slot()
        try:
            if jobs[0].state is not None:
                cut = self._launch_stateful(jobs)
            elif self.trim_context is not None:
                cut = self._launch_tails(jobs, slot)
            else:
                cut = self._launch_padded(jobs, slot)
        except BaseException:
            self._free_slots.append(slot)
            raise
        self.calls += 1
        self.frames_decoded += sum(job.new_frames for job in jobs)
        self.jobs_decoded += len(jobs)
        return PendingDecode(self, slot, cut)

    def decode_padded(self, codes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """``(B, G, L)`` int64 codes and ``(B,)`` lengths -> ``(B, L * frame_samples)`` float32.

        B must be at most ``max_batch``. Samples past each length are 0.

        Raises:
            RuntimeError: `MAX_IN_FLIGHT` calls of `start_jobs` are in flight.
        """
        slot = self._take_slot()
        try:
            width = codes.shape[2] * self.config.frame_samples
            self._launch_padded_codes(codes, lengths, slot)
            return slot.download.wait_view()[:, :width].copy()
        finally:
            self._free_slots.append(slot)

    @property
    def launches_async(self) -> bool:
        """Whether `start_jobs` returns before the call's work is done (CUDA), so that
        pipelining calls overlaps them with the host's work; on the CPU it decodes at once."""
        return self.stream is not None

    def _take_slot(self) -> _Slot:
        """Buffers for one more call in flight (RuntimeError when `MAX_IN_FLIGHT` are)."""
        if not self._free_slots:
            raise RuntimeError(
                f"{MAX_IN_FLIGHT} decoder calls are in flight: take a result before the next"
            )
        return self._free_slots.pop()

    def _release(self, slot: _Slot) -> None:
        """A call's result was taken: its buffers may serve another call."""
        self._free_slots.append(slot)

    def _launch_padded(
        self, jobs: Sequence[DecodeJob], slot: _Slot
    ) -> Callable[[np.ndarray], list[np.ndarray]]:
        """Launch `jobs` padded to their longest (no trimming); returns how to cut the rows."""
        codes, lengths = pad_jobs(jobs, self.config.n_groups)
        self._launch_padded_codes(codes, lengths, slot)
        fs = self.config.frame_samples
        return lambda rows: split_samples(rows[:, : codes.shape[2] * fs], jobs, fs)

    def _launch_stateful(
        self, jobs: Sequence[DecodeJob]
    ) -> Callable[[np.ndarray], list[np.ndarray]]:
        """Decode stateful jobs at once (eager, on the current stream; the CPU path) and
        return their audio whatever the slot holds.

        Raises:
            ValueError: on CUDA (stateful calls have no captured path yet), or jobs mixing
                stateful and stateless ones.
        """
        if self.stream is not None:
            raise ValueError("stateful decoding runs on the CPU only for now")
        with self.busy.measure():
            audio = decode_stateful(self.decoder, jobs)
        return lambda _rows: audio

    def _launch_tails(
        self, jobs: Sequence[DecodeJob], slot: _Slot
    ) -> Callable[[np.ndarray], list[np.ndarray]]:
        """Launch `jobs` with trimmed context: each job's last ``trim_context`` context frames
        and its new frames, left-aligned in a ``(B, G, bucket + trim_context)`` call; returns
        how to cut each job's new samples out of the call's rows."""
        groups, context = self.config.n_groups, self.trim_context
        assert context is not None
        new = max(job.new_frames for job in jobs)
        b = len(jobs)
        bb = self.batch_bucket(b)
        frames = self.frame_bucket(new) if self.pad else new
        codes = np.zeros((bb, groups, frames + context), dtype=np.int64)
        lengths = np.zeros(bb, dtype=np.int64)
        for i, job in enumerate(jobs):
            keep = min(job.context_frames, context) + job.new_frames
            codes[i, :, :keep] = job.codes[:, job.total_frames - keep :]
            lengths[i] = keep
        fs = self.config.frame_samples
        wanted = [job.new_frames * fs for job in jobs] + [0] * (bb - b)  # padded rows: none
        assert self.head is not None
        steps = codes.shape[2] * self.config.downsample_factor  # latent steps of the call
        skip = self.head.skip_rows(frames * fs, steps, wanted)
        self._launch(codes, lengths, frames, b, slot, skip)
        return lambda rows: [
            rows[i, (frames - job.new_frames) * fs :].copy() for i, job in enumerate(jobs)
        ]

    def _launch_padded_codes(self, codes: np.ndarray, lengths: np.ndarray, slot: _Slot) -> None:
        """Launch ``(B, G, L)`` codes padded to their buckets; `slot` receives ``(B, bucket *
        frame_samples)`` rows."""
        b, groups, frames = codes.shape
        bb = next(size for size in self.batch_buckets if size >= b)
        fb = self.frame_bucket(frames)
        if self.pad:
            padded = np.zeros((bb, groups, fb), dtype=np.int64)
            padded[:b, :, :frames] = codes
            lengths = np.concatenate([lengths, np.zeros(bb - b, dtype=lengths.dtype)])
            codes = padded
        self._launch(codes, lengths, codes.shape[2], b, slot)

    def _launch(
        self,
        codes: np.ndarray,
        lengths: np.ndarray,
        frames: int,
        rows: int,
        slot: _Slot,
        skip: np.ndarray | None = None,
    ) -> None:
        """One call on ``(B, G, L)`` codes, not waited for: the first `rows` of its ``(B,
        frames * frame_samples)`` float32 output go to `slot`'s download. `frames` is ``L``, or
        the new frames per job when trimming; `skip`: the trimmed head's skip rows
        (`TritonHead.skip_rows`)."""
        if self.stream is None:
            with self.busy.measure():
                slot.download.start(self._eager(codes, lengths, frames, skip)[:rows])
            return
        with torch.cuda.stream(self.stream), torch.inference_mode(), self.busy.measure():
            graph = self.graphs.get((codes.shape[0], frames)) if self.use_graphs else None
            if graph is not None:
                parts = [(0, codes), (graph.lengths_at, lengths)]
                if graph.skip is not None:  # no table: skip nothing (not the last call's)
                    table = np.zeros(graph.skip.numel(), np.int64) if skip is None else skip
                    parts.append((graph.skip_at, table))
                slot.upload(graph.inputs, parts)
                graph.graph.replay()
                wave = graph.wave
            else:
                wave = self._eager(codes, lengths, frames, skip)
            slot.download.start(wave[:rows])

    @property
    def busy_seconds(self) -> float:
        """Decoder time on its stream (CUDA events, see `BusyTimer`; wall time on CPU)."""
        return self.busy.seconds

    # ------------------------------------------------------------------ internals
    def _make_stream(self) -> torch.cuda.Stream:
        if self.partition is None:
            return torch.cuda.Stream(self.device)
        log.info(
            "decoder on %d of %d SMs (green context)",
            self.partition.num_sms,
            self.partition.total_sms,
        )
        return self.partition.stream

    def _eager(
        self, codes: np.ndarray, lengths: np.ndarray, frames: int, skip: np.ndarray | None
    ) -> Tensor:
        codes_t = to_device(torch.from_numpy(codes), self.device)
        lengths_t = to_device(torch.from_numpy(lengths), self.device)
        skip_t = None if skip is None else to_device(torch.from_numpy(skip), self.device)
        with torch.inference_mode():
            return self._call(codes_t, lengths_t, frames, skip_t)

    def _call(
        self, codes: Tensor, lengths: Tensor, frames: int, skip: Tensor | None = None
    ) -> Tensor:
        """``(B, G, L)`` codes on the device -> ``(B, frames * frame_samples)`` float32."""
        if self.trim_context is not None:
            assert self.head is not None
            return self.decoder.decode_tail_unchecked(codes, lengths, frames, self.head, skip)
        if self.device.type == "cuda":
            return self._forward(codes, lengths, self.decoder)[:, 0]
        return self.decoder.decode_unchecked(codes, lengths)[:, 0]

    def _skip_rows(self, frames: int, width: int) -> int:
        """Rows of a captured trimmed call's skip table (one per convolution), else 0."""
        if self.trim_context is None or self.head is None:
            return 0
        steps = width * self.config.downsample_factor
        return len(self.head.tail_plan(frames * self.config.frame_samples, steps))

    def _graph_inputs(
        self, shape: tuple[int, int, int], frames: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, int, int]:
        """A captured call's inputs as views of one flat int64 device tensor (one upload per
        call): ``(flat, codes (B, G, L) zeros, lengths (B,) = L, skip (convs, B) zeros or
        None, lengths offset, skip offset)``. Each view starts on a 128-byte boundary, so the
        kernels reading it keep their aligned loads."""
        batch, width = shape[0], shape[2]
        skip_rows = self._skip_rows(frames, width)
        n_codes = batch * shape[1] * width
        align = ALIGN_BYTES // 8  # int64 elements
        lengths_at = align_up(n_codes, align)
        skip_at = align_up(lengths_at + batch, align)
        size = skip_at + batch * skip_rows if skip_rows else lengths_at + batch
        flat = torch.zeros(size, dtype=torch.int64, device=self.device)
        codes = flat[:n_codes].view(shape)
        lengths = flat[lengths_at : lengths_at + batch]
        lengths.fill_(width)
        skip = flat[skip_at:].view(skip_rows, batch) if skip_rows else None
        return flat, codes, lengths, skip, lengths_at, skip_at

    def _capture_all(self) -> None:
        """Warm up (compile) and capture every bucket, largest first (one shared memory pool)."""
        assert self.stream is not None
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        groups = self.config.n_groups
        context = self.trim_context or 0
        for fb in reversed(self.frame_buckets):
            for bb in reversed(self.batch_buckets):
                shape = (bb, groups, fb + context)
                inputs, codes, lengths, skip, lengths_at, skip_at = self._graph_inputs(shape, fb)
                with torch.cuda.stream(self.stream), torch.inference_mode():
                    for _ in range(2):  # compile / pick cuDNN algorithms outside the capture
                        self._call(codes, lengths, fb, skip)
                    self.stream.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=self.stream):
                        wave = self._call(codes, lengths, fb, skip)
                self.graphs[(bb, fb)] = _Captured(
                    graph, inputs, codes, lengths, skip, wave, lengths_at, skip_at
                )
                for slot in self._free_slots:
                    slot.reserve(inputs.numel(), wave.numel() * wave.element_size())
        log.info(
            "captured %d decoder CUDA graphs (batch %s x frames %s) in %.1f s",
            len(self.graphs),
            self.batch_buckets,
            self.frame_buckets,
            time.perf_counter() - start,
        )
