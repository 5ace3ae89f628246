"""Tests for fishserve.server.decode_plan: which queued jobs one decoder call takes."""

from __future__ import annotations

import pytest

from fishserve.server.decode_plan import plan_call


def by8(frames: int) -> int:
    return -(-frames // 8) * 8


def pow2(jobs: int) -> int:
    return 1 << (jobs - 1).bit_length()


def plan(frames: list[int], max_batch: int = 16, batch=pow2, overhead: float = 64.0) -> list[int]:
    return plan_call(frames, frames, max_batch, by8, batch, overhead)


def test_the_earliest_job_is_always_taken_even_with_the_largest_bucket() -> None:
    assert plan([64, 8, 8, 8]) == [0, 1, 2, 3]
    assert plan([64, 8, 8, 8], max_batch=1) == [0]


def test_short_jobs_stay_apart_from_long_ones_when_padding_costs_more() -> None:
    # bucket 16: 4 x 16 new frames over 64 + 4 * 16; bucket 64: 64 more frames over 64 + 8 * 64
    assert plan([16, 16, 16, 64, 16]) == [0, 1, 2, 4]


def test_a_short_job_joins_long_ones_when_a_call_of_its_own_costs_more() -> None:
    assert plan([8, 64, 64, 64]) == [0, 1, 2, 3]


def test_a_call_takes_at_most_max_batch_jobs_in_deadline_order() -> None:
    assert plan([8] * 10, max_batch=4) == [0, 1, 2, 3]


def test_the_padded_batch_counts() -> None:
    # 9 jobs run as 16 rows: 8 jobs decode more per cost; unpadded, all 9 fit
    assert plan([32] * 9, batch=pow2) == list(range(8))
    assert plan([32] * 9, batch=lambda n: n) == list(range(9))


def test_without_a_fixed_cost_the_smallest_bucket_wins_and_ties_go_to_it() -> None:
    assert plan([8, 64, 8], overhead=0.0) == [0, 2]
    assert plan_call([8, 16], [8, 8], 4, by8, lambda n: n, 0.0) == [0]


@pytest.mark.parametrize(
    ("frames", "new", "max_batch"), [([], [], 4), ([8], [8, 8], 4), ([8], [8], 0)]
)
def test_bad_arguments_are_refused(frames: list[int], new: list[int], max_batch: int) -> None:
    with pytest.raises(ValueError, match="plan_call"):
        plan_call(frames, new, max_batch, by8, pow2)
