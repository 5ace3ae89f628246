"""Batched decode: chunks of several streams in one Firefly ``decode`` call (issue 4, part 2).

A :class:`DecodeJob` is one chunk of one stream: ``context_frames`` already-emitted frames (left
context, see :mod:`fishserve.audio.streaming`) followed by ``new_frames`` frames whose audio is
wanted. :func:`decode_batch` right-pads the jobs' codes with code 0 to the longest job, passes each
job's true length as ``feature_lengths`` and keeps, per job, only the samples of its new frames.

Why padding is harmless: every decoder op is causal (spec §4.3), so samples of frame ``t`` depend
only on frames ``<= t`` and right padding cannot reach them; the decoder also zeroes the latent and
the samples past ``feature_lengths`` (spec §4.5 steps 3-4). Batched output equals one-job-at-a-time
output up to floating-point rounding of the batched convolutions: measured on the tiny fixture
decoder (CPU, fp32) max abs difference ~4e-8 (tests/audio/test_batching.py asserts 1e-6).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from fishserve.models.firefly import FireflyGenerator
from fishserve.models.firefly.streaming import StreamState, decode_chunks

if TYPE_CHECKING:
    from .streaming import StreamingDecoder

__all__ = [
    "DecodeJob",
    "check_groups",
    "decode_batch",
    "decode_stateful",
    "decode_streams",
    "pad_jobs",
    "split_samples",
]


@dataclass(frozen=True)
class DecodeJob:
    """One chunk to decode.

    Attributes:
        codes: ``(G, context_frames + new_frames)`` int64 codes, oldest frame first. Ids may be
            ``>= codebook_size`` (the decoder wraps them, spec §4.4); they must be ``>= 0``.
        context_frames: leading frames that are decoded only as context; their samples are dropped.
        state: for a stateful stream (`StreamingDecoder(stateful=True)`), its decoder layers'
            last inputs, continued by this job (then ``context_frames`` is 0 and jobs of one
            stream must be decoded in order, one at a time); None: stateless.

    Raises:
        ValueError: ``codes`` is not a 2-D int64 array, holds negative ids, or
            ``context_frames`` is outside ``[0, frames)`` (a job needs at least one new frame).
    """

    codes: np.ndarray
    context_frames: int
    state: StreamState | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.state is not None and self.context_frames:
            raise ValueError("a stateful job has no context frames (its state is the context)")
        if self.codes.ndim != 2 or self.codes.dtype != np.int64:
            raise ValueError(
                f"DecodeJob.codes must be a (G, L) int64 array, got "
                f"{self.codes.dtype} {self.codes.shape}"
            )
        if self.codes.size and int(self.codes.min()) < 0:
            raise ValueError(f"DecodeJob.codes must be >= 0, got {int(self.codes.min())}")
        if not 0 <= self.context_frames < self.codes.shape[1]:
            raise ValueError(
                f"context_frames must lie in [0, {self.codes.shape[1]}), got {self.context_frames}"
            )

    @property
    def total_frames(self) -> int:
        """Frames passed to the decoder (context + new)."""
        return int(self.codes.shape[1])

    @property
    def new_frames(self) -> int:
        """Frames whose audio this job produces."""
        return self.total_frames - self.context_frames


def decode_batch(decoder: FireflyGenerator, jobs: Sequence[DecodeJob]) -> list[np.ndarray]:
    """Decode several jobs in ONE ``decoder.decode`` call and trim each to its new frames.

    Args:
        decoder: the Firefly generator (any device/dtype).
        jobs: chunks to decode; their lengths may differ (shorter ones are right-padded).

    Returns:
        One ``(job.new_frames * frame_samples,)`` float32 array per job, in ``jobs`` order, at
        ``decoder.config.sample_rate`` Hz, values in (-1, 1). Empty list for no jobs.

    Raises:
        ValueError: a job's codes do not have ``decoder.config.n_groups`` rows.
    """
    if not jobs:
        return []
    if any(job.state is not None for job in jobs):
        return decode_stateful(decoder, jobs)
    codes, lengths = pad_jobs(jobs, decoder.config.n_groups)
    device = decoder.device
    with torch.inference_mode():
        wave, _ = decoder.decode(
            torch.from_numpy(codes).to(device), torch.from_numpy(lengths).to(device)
        )
    samples = wave[:, 0].float().cpu().numpy()  # (B, L_max * frame_samples)
    return split_samples(samples, jobs, decoder.config.frame_samples)


def decode_stateful(decoder: FireflyGenerator, jobs: Sequence[DecodeJob]) -> list[np.ndarray]:
    """Decode stateful jobs (one per stream) in one padded call, each continuing its stream's
    state (`fishserve.models.firefly.streaming.decode_chunks`).

    Returns:
        One ``(job.new_frames * frame_samples,)`` float32 array per job, in order.

    Raises:
        ValueError: a job without a state, two jobs of one stream, or codes with the wrong
            number of rows.
    """
    states = [job.state for job in jobs]
    if any(state is None for state in states) or len({id(s) for s in states}) < len(states):
        raise ValueError("a stateful call takes one stateful job per stream")
    codes, lengths = pad_jobs(jobs, decoder.config.n_groups)
    waves = decode_chunks(
        decoder,
        torch.from_numpy(codes).to(decoder.device),
        torch.from_numpy(lengths),
        states,  # type: ignore[arg-type]
    )
    return [wave.cpu().numpy() for wave in waves]


def pad_jobs(jobs: Sequence[DecodeJob], groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad the jobs' codes with 0 to the longest job.

    Returns:
        ``(codes, lengths)``: ``(B, G, L_max)`` int64 and ``(B,)`` int64 frames per job.

    Raises:
        ValueError: a job's codes do not have ``groups`` rows.
    """
    check_groups(jobs, groups)
    lengths = np.array([job.total_frames for job in jobs], dtype=np.int64)
    codes = np.zeros((len(jobs), groups, int(lengths.max())), dtype=np.int64)
    for row, job in zip(codes, jobs, strict=True):
        row[:, : job.total_frames] = job.codes
    return codes, lengths


def check_groups(jobs: Sequence[DecodeJob], groups: int) -> None:
    """Raise ValueError unless every job's codes have `groups` rows (codebooks per frame)."""
    bad = [job.codes.shape for job in jobs if job.codes.shape[0] != groups]
    if bad:
        raise ValueError(f"decoder expects {groups} codebooks per frame, got jobs of shape {bad}")


def split_samples(samples: np.ndarray, jobs: Sequence[DecodeJob], frame: int) -> list[np.ndarray]:
    """Cut each job's new-frame samples out of ``(B, >= L_max * frame)`` decoded rows."""
    return [
        samples[i, job.context_frames * frame : job.total_frames * frame].copy()
        for i, job in enumerate(jobs)
    ]


def decode_streams(
    decoder: FireflyGenerator, streams: Sequence[StreamingDecoder]
) -> list[np.ndarray | None]:
    """Take at most one ready chunk from each stream and decode them all in one call.

    This is the decoder thread's step: streams with no ready chunk contribute nothing. Memory of
    the call is bounded by ``len(streams) * policy.max_decode_frames`` frames.

    Returns:
        Per stream, in order: its next audio chunk (float32, see :func:`decode_batch`) or ``None``.
    """
    jobs = [stream.next_job() for stream in streams]
    ready = [job for job in jobs if job is not None]
    audio = iter(decode_batch(decoder, ready))
    return [None if job is None else next(audio) for job in jobs]
