"""Tests for fishserve.server.decode_plan: which queued jobs one decoder call takes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    # a true tie: 8 / 8 == (8 + 24) / (2 * 16): the smaller bucket
    assert plan_call([8, 16], [8, 24], 4, by8, lambda n: n, 0.0) == [0]


def test_a_tie_between_all_fitting_jobs_and_an_unpadded_batch_takes_more_jobs() -> None:
    # 3 jobs padded to 4 rows vs 2 unpadded: 3 * 8 / (4 * 8) < 2 * 8 / (2 * 8), so 2 jobs; with
    # a fourth row's worth of new frames in the third job the two tie, and more jobs win
    assert plan_call([8, 8, 8], [8, 8, 8], 4, by8, pow2, 0.0) == [0, 1]
    assert plan_call([8, 8, 8], [8, 8, 16], 4, lambda n: 8, pow2, 0.0) == [0, 1, 2]


def test_jobs_in_smaller_buckets_than_the_earliest_never_push_it_out() -> None:
    # a bucket of 8 would decode more per cost, but the earliest job does not fit it
    assert 0 in plan([64] + [8] * 8)


@settings(max_examples=300, deadline=None)
@given(
    frames=st.lists(st.integers(1, 80), min_size=1, max_size=40),
    max_batch=st.integers(1, 20),
    overhead=st.floats(0, 200),
)
def test_the_plan_is_the_earliest_job_and_at_most_max_batch_fitting_jobs_in_order(
    frames: list[int], max_batch: int, overhead: float
) -> None:
    take = plan_call(frames, frames, max_batch, by8, pow2, overhead)
    assert take[0] == 0 and take == sorted(set(take)) and len(take) <= max_batch
    size = max(by8(frames[i]) for i in take)
    fitting = [i for i, n in enumerate(frames) if by8(n) <= size]
    assert take == fitting[: len(take)]  # no fitting job skipped for a later one


@pytest.mark.parametrize(
    ("frames", "new", "max_batch"), [([], [], 4), ([8], [8, 8], 4), ([8], [8], 0)]
)
def test_bad_arguments_are_refused(frames: list[int], new: list[int], max_batch: int) -> None:
    with pytest.raises(ValueError, match="plan_call"):
        plan_call(frames, new, max_batch, by8, pow2)
