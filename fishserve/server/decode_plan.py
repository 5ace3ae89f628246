"""Which queued audio chunks one decoder call takes: a cost model of padded calls.

A decoder call pads its jobs to one frame bucket and its batch to one batch bucket (fixed
shapes for CUDA graphs), so it costs a fixed part plus a part per padded job-frame. On the H200
(bf16, trimmed context, docs/benchmarks.md §6.9) a call of 8 jobs costs ~1.3 ms plus ~0.02 ms
per padded job-frame, whatever the bucket: the fixed part is worth ~64 job-frames. Taking only
the jobs of the earliest job's bucket (a 10-frame first chunk runs with other short chunks
only) therefore splits the queue into many small calls, each paying the fixed part; padding a
short chunk into a longer call is often cheaper than a call of its own.

`plan_call` keeps the worker's earliest-deadline-first order (the earliest job is always in
the call, and every call takes the earliest jobs that fit its bucket) and picks, among the
buckets of the queued jobs, the one that decodes the most new frames per unit of cost.

Trade-off: deadlines do not enter the score, so under a backlog of long chunks an urgent first
chunk can ride in a large call (16 jobs of 64 frames: ~21 ms on the H200 instead of ~2 ms
alone). Measured end to end this way (docs/benchmarks.md §6.10), TTFA did not suffer at 320-384
streams; a cap for urgent jobs is a candidate if it does elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# A call's fixed cost in padded job-frames (docs/benchmarks.md §6.9, bf16 on the H200: ~1.3 ms
# per call against ~0.02 ms per job-frame in calls of 8-32 jobs of 24 or 64 frames).
CALL_OVERHEAD_FRAMES = 64.0
# The largest fixed cost a server may set (job-frames; a call of 32 jobs of 128 frames is 4,096).
MAX_CALL_OVERHEAD = 4096.0

__all__ = ["CALL_OVERHEAD_FRAMES", "MAX_CALL_OVERHEAD", "plan_call"]


def plan_call(
    frames: Sequence[int],
    new_frames: Sequence[int],
    max_batch: int,
    frame_bucket: Callable[[int], int],
    batch_bucket: Callable[[int], int],
    overhead: float = CALL_OVERHEAD_FRAMES,
) -> list[int]:
    """Indices of the queued jobs one call decodes (ascending; index 0 always included).

    Args:
        frames: per queued job, in deadline order, the frames it is bucketed by (the
            runner's `job_frames`). new_frames: per job, the frames whose audio it delivers.
        max_batch: most jobs per call (>= 1).
        frame_bucket: padded frames of a job of n frames (the runner's `frame_bucket`).
        batch_bucket: padded batch of a call of n jobs (the runner's `batch_bucket`).
        overhead: a call's fixed cost in padded job-frames (`CALL_OVERHEAD_FRAMES`).

    Returns:
        For the bucket B (one of the queued jobs' buckets, at least the first job's) and the
        count n that maximise ``sum(new frames) / (overhead + batch_bucket(n) * B)``, the
        first n jobs whose bucket is at most B, n being all of them (at most `max_batch`) or
        the largest unpadded batch below that; ties go to the smaller bucket, then more jobs.

    Raises:
        ValueError: no jobs, `frames` and `new_frames` of different lengths, or max_batch < 1.
    """
    if not frames or len(frames) != len(new_frames) or max_batch < 1:
        raise ValueError(
            f"plan_call needs >= 1 job, equal lengths and max_batch >= 1 (got {len(frames)} "
            f"and {len(new_frames)} jobs, max_batch {max_batch})"
        )
    buckets = [frame_bucket(n) for n in frames]
    best: tuple[float, list[int]] = (-1.0, [0])
    for size in sorted({b for b in buckets if b >= buckets[0]}):
        fits = [i for i, b in enumerate(buckets) if b <= size][:max_batch]
        unpadded = next((n for n in range(len(fits), 0, -1) if batch_bucket(n) == n), 1)
        for take in (fits, fits[:unpadded]):
            rate = sum(new_frames[i] for i in take) / (overhead + batch_bucket(len(take)) * size)
            if rate > best[0]:
                best = (rate, take)
    return best[1]
