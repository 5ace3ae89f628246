"""The sampler's steps follow the reference semantics (spec §5)."""

from __future__ import annotations

import pytest
import torch

from fishserve.engine.sampling import (
    SamplingParams,
    apply_repetition_penalty,
    exponential_noise,
    sample,
    top_p_filter,
)


def test_repetition_penalty_divides_positive_multiplies_negative_once():
    logits = torch.tensor([[2.0, -2.0, 1.0, 3.0]])
    window = torch.tensor([[0, 1, 1, 0]])  # duplicates are penalised once
    out = apply_repetition_penalty(logits, window, torch.tensor([2.0]))
    assert torch.equal(out, torch.tensor([[1.0, -4.0, 1.0, 3.0]]))


def test_top_p_drops_the_token_that_crosses_the_threshold():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    kept = top_p_filter(logits, torch.tensor([0.7])).isfinite()
    # cumulative 0.5, 0.8 > 0.7: the second token crosses and is removed (unlike HF)
    assert kept.tolist() == [[True, False, False, False]]
    kept = top_p_filter(logits, torch.tensor([0.85])).isfinite()
    assert kept.tolist() == [[True, True, False, False]]


def test_top_p_always_keeps_the_most_likely():
    logits = torch.tensor([[0.0, 5.0, 1.0]])
    assert top_p_filter(logits, torch.tensor([1e-6])).isfinite().tolist() == [[False, True, False]]


def test_noise_is_exponential_and_batch_invariant():
    seeds = torch.tensor([1, 2, 1])
    counters = torch.tensor([5, 5, 5])
    noise = exponential_noise(seeds, counters, 50_000)
    assert torch.equal(noise[0], noise[2]) and not torch.equal(noise[0], noise[1])
    assert (noise > 0).all()
    assert abs(noise.mean().item() - 1.0) < 0.02 and abs(noise.std().item() - 1.0) < 0.03
    alone = exponential_noise(seeds[1:2], counters[1:2], 50_000)  # a batch of one: 2 rows run
    assert alone.shape == (1, 50_000) and torch.equal(alone[0], noise[1])


def test_sample_frequencies_follow_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    n = 4000
    logits = probs.log().expand(n, 3)
    ones = torch.ones(n)
    noise = exponential_noise(torch.full((n,), 3), torch.arange(n), 3)
    ids = sample(logits, ones, ones, ones, None, noise)
    freq = torch.bincount(ids, minlength=3).float() / n
    assert torch.allclose(freq, probs, atol=0.03), freq


def test_greedy_at_tiny_temperature():
    logits = torch.randn(8, 100)
    ones = torch.ones(8)
    noise = exponential_noise(torch.arange(8), torch.zeros(8, dtype=torch.long), 100)
    ids = sample(logits, torch.full((8,), 1e-5), ones, ones, None, noise)
    assert torch.equal(ids, logits.argmax(-1))


def test_fp16_logits_do_not_overflow_at_tiny_temperature():
    logits = torch.tensor([[9.0, 8.0, 1.0]], dtype=torch.float16)
    noise = torch.ones(1, 3)
    one = torch.ones(1)
    assert sample(logits, torch.full((1,), 1e-5), one, one, None, noise).item() == 0


@pytest.mark.parametrize(
    "kwargs", [{"temperature": 0}, {"top_p": 0}, {"top_p": 1.5}, {"repetition_penalty": 0}]
)
def test_sampling_params_reject_bad_values(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
