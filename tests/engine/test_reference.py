"""The batch-1 reference loop reproduces the reference `generate()` token for token."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_IM_END, load_tiny_model

from fishserve.engine.reference import PromptTooLongError, frame_budget, generate
from fishserve.engine.sampling import SamplingParams

# (expected sequence, prompt, repetition penalty, max_new_tokens): tests/fixtures/README.md
CASES = [
    ("seq_nopen", "prompt", 1.0, 24),
    ("seq_reppen", "prompt", 1.3, 24),
    ("seq_eos", "prompt_eos", 1.0, 40),
]
# bf16 weights agree with the fp32 reference on this many leading frames of every case (random
# tiny weights put several candidates within bf16 rounding of each other after a few frames).
BF16_AGREEING_FRAMES = 3


def greedy(penalty: float) -> SamplingParams:
    """Greedy decoding through the sampler, as the fixtures were made (temperature 1e-5)."""
    return SamplingParams(temperature=1e-5, top_p=0.9, repetition_penalty=penalty)


@pytest.mark.parametrize(("name", "prompt", "penalty", "max_new"), CASES)
def test_greedy_generation_is_token_identical(
    tiny_model, generate_case, name, prompt, penalty, max_new
):
    frames = generate(tiny_model, generate_case[prompt], greedy(penalty), TINY_IM_END, max_new)
    expected = generate_case[name][:, generate_case[prompt].shape[1] :].long()
    assert torch.equal(frames, expected)


def test_eos_case_stops_on_im_end_and_keeps_it(tiny_model, generate_case):
    frames = generate(tiny_model, generate_case["prompt_eos"], greedy(1.0), TINY_IM_END, 40)
    assert frames.shape[1] == 32
    assert frames[0, -1] == TINY_IM_END and frames[1, -1] == 0
    assert (frames[0, :-1] != TINY_IM_END).all()


def test_penalty_changes_the_output(tiny_model, generate_case):
    a = generate(tiny_model, generate_case["prompt"], greedy(1.0), TINY_IM_END, 24)
    b = generate(tiny_model, generate_case["prompt"], greedy(1.3), TINY_IM_END, 24)
    assert not torch.equal(a, b)


@pytest.mark.parametrize(("name", "prompt", "penalty", "max_new"), CASES)
def test_bf16_agrees_on_leading_frames(generate_case, name, prompt, penalty, max_new):
    model = load_tiny_model(torch.bfloat16)
    frames = generate(model, generate_case[prompt], greedy(penalty), TINY_IM_END, max_new)
    expected = generate_case[name][:, generate_case[prompt].shape[1] :].long()
    n = BF16_AGREEING_FRAMES
    assert torch.equal(frames[:, :n], expected[:, :n])


def test_seeded_sampling_is_reproducible_and_seed_dependent(tiny_model, generate_case):
    params = SamplingParams(temperature=0.9, top_p=0.95, repetition_penalty=1.1)
    prompt = generate_case["prompt"]
    a = generate(tiny_model, prompt, params, TINY_IM_END, 12, seed=7)
    b = generate(tiny_model, prompt, params, TINY_IM_END, 12, seed=7)
    c = generate(tiny_model, prompt, params, TINY_IM_END, 12, seed=8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_max_new_tokens_one_returns_the_prefill_frame(tiny_model, generate_case):
    frames = generate(tiny_model, generate_case["prompt"], greedy(1.0), TINY_IM_END, 1)
    expected = generate_case["seq_nopen"][:, generate_case["prompt"].shape[1] :][:, :1].long()
    assert torch.equal(frames, expected)


def test_frame_budget_rules():
    assert frame_budget(100, 0, 256) == 156  # 0 = until the context is full
    assert frame_budget(100, 20, 256) == 20
    assert frame_budget(250, 20, 256) == 6
    with pytest.raises(PromptTooLongError):
        frame_budget(256, 10, 256)


def test_prompt_too_long_is_refused(tiny_model):
    prompt = torch.zeros(5, tiny_model.config.max_seq_len, dtype=torch.long)
    with pytest.raises(PromptTooLongError, match="no room"):
        generate(tiny_model, prompt, greedy(1.0), TINY_IM_END, 4)
