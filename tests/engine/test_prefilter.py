"""The top-k prefilter for top-p gives the tokens of the full-sort sampler (issue 8, part 3).

Peaked rows (nucleus inside the k candidates) are decided by the prefilter; flat rows are
flagged and resampled over the full vocabulary; either way the token equals `sample`'s.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import make_engine, run_engine

from fishserve.engine.engine import GenerationRequest
from fishserve.engine.frame import BatchSampling, inexact_rows, resample_rows_, sample_token
from fishserve.engine.sampling import (
    SamplingParams,
    exponential_noise,
    exponential_noise_at,
    noise_from_bits,
    sample,
    sample_prefiltered,
)

V, K = 5000, 64


def batch(rows: int, seed: int, temperature: float = 0.7, top_p: float = 0.7) -> BatchSampling:
    g = torch.Generator().manual_seed(seed)
    f = torch.full((rows,), 1.0)
    return BatchSampling(
        temperature=f * temperature,
        top_p=f * top_p,
        penalty=f * 1.3,
        seeds=torch.randint(0, 2**32, (rows,), generator=g),
        segments=torch.zeros(rows, dtype=torch.int64),
        frames=torch.randint(0, 500, (rows,), generator=g),
    )


def prefilter_exact(logits: torch.Tensor, p: BatchSampling, k: int) -> torch.Tensor:
    """bool (B,): rows `sample_prefiltered` with k candidates decides exactly (no penalty)."""
    _, exact = sample_prefiltered(
        logits, p.temperature, p.top_p, p.penalty, None, p.seeds, p.counters(0), k
    )
    return exact


def logits_of(rows: int, scale: float, seed: int) -> torch.Tensor:
    """Gaussian logits; scale 8 puts > 0.9 of the mass on a few dozen ids, scale 0.5 is flat."""
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * scale


def full_tokens(logits: torch.Tensor, p: BatchSampling, window: torch.Tensor) -> torch.Tensor:
    noise = exponential_noise(p.seeds, p.counters(0), V)
    return sample(logits, p.temperature, p.top_p, p.penalty, window, noise)


def test_noise_at_indices_is_the_gathered_full_noise() -> None:
    p = batch(6, seed=1)
    ids = torch.randint(0, V, (6, 100))
    full = exponential_noise(p.seeds, p.counters(0), V)
    assert torch.equal(exponential_noise_at(p.seeds, p.counters(0), ids), full.gather(1, ids))


@pytest.mark.parametrize("temperature", [1e-6, 0.3, 0.7, 1.5])
@pytest.mark.parametrize("top_p", [0.1, 0.7, 0.95])
def test_peaked_rows_are_decided_by_the_prefilter(temperature: float, top_p: float) -> None:
    p = batch(64, seed=int(temperature * 10 + top_p * 100), temperature=temperature, top_p=top_p)
    logits = logits_of(64, scale=8.0, seed=2)
    window = torch.randint(0, V, (64, 16))
    token, exact = sample_prefiltered(
        logits, p.temperature, p.top_p, p.penalty, window, p.seeds, p.counters(0), K
    )
    # nearly every row is decided (a few have a cumulative mass within CUT_TOLERANCE of top_p)
    assert exact.float().mean() >= 0.9
    assert torch.equal(token[exact], full_tokens(logits, p, window)[exact])


def test_flat_rows_are_flagged_and_mixed_batches_resample_only_them() -> None:
    p = batch(8, seed=3)
    logits = logits_of(8, scale=8.0, seed=4)
    flat = [1, 4, 5]
    logits[flat] = logits_of(3, scale=0.5, seed=5)
    window = torch.randint(0, V, (8, 16))
    _, exact = sample_token(logits, p, window, K)
    assert exact is not None
    rows = inexact_rows(exact)
    assert rows is not None and rows.tolist() == flat


def test_sample_frame_with_prefilter_equals_full_sort(tiny_model) -> None:
    from fishserve.engine.frame import sample_frame

    c = tiny_model.config
    p = batch(8, seed=6)
    hidden = torch.randn(8, c.dim, generator=torch.Generator().manual_seed(7))
    logits = logits_of(8, scale=8.0, seed=8)[:, : c.vocab_size]
    logits[[0, 3]] *= 0.02  # two flat rows go through the exact fallback
    windows = torch.randint(0, 1024, (8, 1 + c.num_codebooks, 16))
    with torch.inference_mode():
        fast, _ = sample_frame(tiny_model, hidden, logits, p, windows, top_k_prefilter=16)
        full, none = sample_frame(tiny_model, hidden, logits, p, windows, top_k_prefilter=0)
        assert none == 0  # no prefilter: nothing left to the full sort
    assert torch.equal(fast, full)


def test_top_p_one_always_falls_back() -> None:
    p = batch(4, seed=9, top_p=1.0)
    logits = logits_of(4, scale=8.0, seed=10)
    exact = prefilter_exact(logits, p, K)
    assert not exact.any()


@pytest.mark.parametrize("static_decode", [False, True])
def test_engine_codes_do_not_depend_on_the_prefilter(tiny_model, tiny_tokenizer, static_decode):
    """k = 8 sends most tiny-model rows to the fallback, k = 256 few, 0 none: same codes."""
    requests = [
        GenerationRequest(
            f"hello number {i}",
            [],
            SamplingParams(0.8, 0.9, 1.2, seed=i),
            max_new_tokens=24,
            request_id=f"r{i}",
        )
        for i in range(4)
    ]
    results = {}
    for k in (0, 8, 256):
        engine = make_engine(
            tiny_model, tiny_tokenizer, top_k_prefilter=k, static_decode=static_decode
        )
        results[k] = run_engine(engine, requests)
    for rid in results[0]:
        assert results[0][rid][0].shape[1] > 1
        assert torch.equal(results[8][rid][0], results[0][rid][0])
        assert torch.equal(results[256][rid][0], results[0][rid][0])


def test_noise_is_never_zero_even_at_the_extreme_hashes() -> None:
    """With 24-bit uniforms 2**-24 of the draws gave noise -0.0 (0.6% of slow-token draws):
    an id outside the nucleus then won the race. The extreme hashes show it directly."""
    extremes = torch.tensor([0, 1, (1 << 9) - 1, 1 << 31, (1 << 32) - 512, (1 << 32) - 1])
    noise = noise_from_bits(extremes)
    assert bool((noise > 0).all()) and bool(noise.isfinite().all())
    old = -torch.log(((extremes >> 8).float() + 0.5) * (1.0 / (1 << 24)))  # the 24-bit map
    assert not bool((old > 0).all())  # so this test fails on the old mapping


def test_no_id_outside_the_nucleus_wins() -> None:
    seeds = torch.arange(200)
    counters = torch.full((200,), 5)
    noise = exponential_noise(seeds, counters, 102_048)
    assert bool((noise > 0).all()) and bool(noise.isfinite().all())
    logits = torch.full((200, 102_048), -30.0)
    logits[:, 7] = 30.0  # all the mass on id 7
    ones = torch.ones(200)
    tokens = sample(logits, ones * 0.7, ones * 0.7, ones, None, noise)
    assert bool((tokens == 7).all())


@pytest.mark.parametrize("pair", [(5, 900), (996, 1459), (700, 701), (900, 5)])
def test_a_tie_across_the_cut_keeps_the_lower_id_as_the_full_sort_does(
    pair: tuple[int, int],
) -> None:
    """top_p 0.4 keeps one of two tied ids: the stable full sort keeps the lower one, and the
    prefilter decides the row the same way (whatever order topk returned them in)."""
    logits = torch.full((1, 1536), -20.0)
    logits[0, list(pair)] = 10.0
    for seed in range(8):
        p = batch(1, seed=seed, top_p=0.4)
        token, exact = sample_token(logits, p, None, 64)
        noise = exponential_noise(p.seeds, p.counters(0), 1536)
        full = sample(logits, p.temperature, p.top_p, p.penalty, None, noise)
        assert bool(exact.all()) and token.item() == full.item() == min(pair)


def test_a_tie_group_reaching_past_the_candidates_goes_to_the_full_sort() -> None:
    """100 tied ids, 64 candidates: which tied ids the cut keeps depends on ids topk left out."""
    logits = torch.full((1, 1536), -20.0)
    logits[0, torch.arange(100) * 13] = 10.0
    p = batch(1, seed=11, top_p=0.4)
    token, exact = sample_token(logits, p, None, 64)
    assert not exact.any()
    rows = inexact_rows(exact)
    assert rows is not None
    resample_rows_(token, rows, logits[rows], p, None)
    noise = exponential_noise(p.seeds, p.counters(0), 1536)
    assert torch.equal(token, sample(logits, p.temperature, p.top_p, p.penalty, None, noise))


@pytest.mark.parametrize("k", [64, 1024])
def test_bf16_logits_with_many_ties_are_decided_by_the_prefilter(k: int) -> None:
    """Logits rounded to bf16 (the model's dtype) tie often near the cut: the prefilter now
    decides those rows (it sent ~9% of them to the full sort), with the full sort's tokens."""
    rows, vocab = 256, 20_000
    logits = (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(3)) * 8).bfloat16()
    logits = logits.float()
    p = batch(rows, seed=4)
    window = torch.randint(0, vocab, (rows, 16), generator=torch.Generator().manual_seed(5))
    token, exact = sample_prefiltered(
        logits, p.temperature, p.top_p, p.penalty, window, p.seeds, p.counters(0), k
    )
    noise = exponential_noise(p.seeds, p.counters(0), vocab)
    full = sample(logits, p.temperature, p.top_p, p.penalty, window, noise)
    assert exact.float().mean() >= 0.99
    assert torch.equal(token[exact], full[exact])


def test_a_zero_logit_at_the_cut_goes_to_the_full_sort() -> None:
    """-0.0 and +0.0 may sort apart on some devices: a cut between them is not decided."""
    logits = torch.full((1, 1536), -20.0)
    logits[0, 3], logits[0, 9] = 0.0, -0.0
    p = batch(1, seed=13, top_p=0.4)
    assert not prefilter_exact(logits, p, 64).any()


def test_stable_descending_orders_ties_by_id_and_signed_zeros_as_equal() -> None:
    from fishserve.engine.sampling import stable_descending

    values = torch.tensor([[1.0, -0.0, 3.0, 1.0, 0.0, -2.5, 3.0]])
    ids = torch.tensor([[9, 4, 8, 2, 3, 0, 1]])
    v, i = stable_descending(values, ids, 10)
    assert i.tolist() == [[1, 8, 2, 9, 3, 4, 0]]
    assert v.tolist() == [[3.0, 3.0, 1.0, 1.0, 0.0, -0.0, -2.5]]


def test_top_p_one_keeps_every_id_in_both_samplers() -> None:
    """The float32 cumulative mass can round to 1.0000001 > 1.0; that must not cut an id."""
    from fishserve.engine.sampling import top_p_filter

    logits = torch.full((1, 1536), float("-inf"))
    logits[0, [566, 647, 1341]] = torch.tensor([0.00847904477, 0.000575817015, -0.00938897673])
    kept = top_p_filter(logits, torch.ones(1)).isfinite()
    assert kept.sum().item() == 3
    p = batch(1, seed=12, top_p=1.0)
    exact = prefilter_exact(logits, p, 64)
    assert not exact.any()


def test_one_candidate_never_claims_exactness() -> None:
    """k = 1 cannot see the id after the cut, so a tie there would go unnoticed."""
    logits = torch.full((1, 1536), -20.0)
    logits[0, [0, 1]] = 10.0
    p = batch(1, seed=1, top_p=0.3)
    exact = prefilter_exact(logits, p, 1)
    assert not exact.any()


def test_a_mass_within_rounding_of_top_p_goes_to_the_full_sort() -> None:
    """The two samplers normalise differently: a cut this close to top_p is deferred."""
    logits = torch.full((1, 1536), -30.0)
    logits[0, :4] = torch.tensor([2.0, 1.0, 0.5, 0.0])
    probs = torch.softmax(logits, -1)[0, :4]
    p = batch(1, seed=2, top_p=float(probs[:2].sum()))  # the cut lands exactly on top_p
    exact = prefilter_exact(logits, p, 64)
    assert not exact.any()


def test_the_engine_counts_the_draws_the_prefilter_left_to_the_full_sort(
    tiny_model, tiny_tokenizer
) -> None:
    """The tiny random model's logits are flat: the prefilter over 8 ids leaves its draws to
    the full sort, on the static path and on the general one (CPU's default), and the engine's
    stats count them; without a prefilter none."""
    requests = [
        GenerationRequest("Hello there.", max_new_tokens=6, ignore_eos=True, request_id=f"r{i}")
        for i in range(3)
    ]
    counts = {}
    for static, k in itertools.product((True, False), (0, 8)):
        engine = make_engine(tiny_model, tiny_tokenizer, static_decode=static, top_k_prefilter=k)
        results = run_engine(engine, requests)
        assert all(event.finish_reason == "length" for _, event in results.values())
        assert all(codes.shape[1] == 5 for codes, _ in results.values())  # 6 frames, 1st not audio
        counts[static, k] = engine.stats().full_sort_rows
    assert counts[True, 0] == counts[False, 0] == 0
    assert counts[True, 8] > 0 and counts[False, 8] > 0


def test_resampling_rows_padded_with_copies_of_the_first_gives_the_same_tokens() -> None:
    # a captured fallback pads its rows to a bucket with copies of the first row
    p = batch(8, seed=9)
    logits = logits_of(8, scale=0.5, seed=10)  # flat: every row needs the full sort
    window = torch.randint(0, V, (8, 16))
    plain = torch.full((8,), -1, dtype=torch.int64)
    rows = torch.tensor([1, 4, 5])
    resample_rows_(plain, rows, logits[rows], p, window)
    padded = torch.full((8,), -1, dtype=torch.int64)
    rows_padded = torch.tensor([1, 4, 5, 1, 1])
    resample_rows_(padded, rows_padded, logits[rows_padded], p, window)
    assert torch.equal(padded, plain)
    assert (plain[rows] >= 0).all() and (plain[[0, 2, 3, 6, 7]] == -1).all()
    assert torch.equal(plain[rows], full_tokens(logits, p, window)[rows])


def test_inexact_rows_host_gives_the_indices_or_none() -> None:
    from fishserve.engine.frame import inexact_rows_host

    assert inexact_rows_host(None) is None
    assert inexact_rows_host(torch.ones(4, dtype=torch.bool)) is None
    mask = torch.tensor([True, False, True, False])
    assert inexact_rows_host(mask).tolist() == [1, 3]
    assert inexact_rows(mask).tolist() == [1, 3]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_fallback_gives_the_tokens_of_the_full_sort(tiny_tokenizer) -> None:
    """On CUDA the rows the prefilter leaves (all of them: the tiny model's logits are flat)
    are resampled by a captured fallback graph: the frames are the full sort's."""
    from conftest import load_tiny_model

    model = load_tiny_model().cuda()
    requests = [
        GenerationRequest(
            "Hello there.",
            [],
            SamplingParams(0.8, 0.9, 1.2, seed=i),
            max_new_tokens=6,
            ignore_eos=True,
            request_id=f"r{i}",
        )
        for i in range(3)
    ]
    full = run_engine(make_engine(model, tiny_tokenizer, top_k_prefilter=0), requests)
    engine = make_engine(model, tiny_tokenizer, top_k_prefilter=8)
    graphs = engine.runner.graphs
    assert graphs is not None and all(captured.fallback for captured in graphs.graphs.values())
    got = run_engine(engine, requests)
    assert engine.stats().full_sort_rows > 0
    for rid, (codes, _) in full.items():
        assert torch.equal(got[rid][0], codes)


def test_logits_in_the_thousands_keep_the_mass_exact() -> None:
    """A logsumexp near 1e4 rounds to 1e-3: the mass is computed as softmax computes it."""
    vocab = 100
    logits = torch.full((64, vocab), 1e4 - 60.0)
    logits[:, :4] = 1e4  # four tied ids at the top, each 1/4 of the mass: cut after two
    p = batch(64, seed=14, top_p=0.499893)
    token, exact = sample_prefiltered(
        logits, p.temperature, p.top_p, p.penalty, None, p.seeds, p.counters(0), 48
    )
    noise = exponential_noise(p.seeds, p.counters(0), vocab)
    full = sample(logits, p.temperature, p.top_p, p.penalty, None, noise)
    assert torch.equal(token[exact], full[exact]) and bool(exact.any())
