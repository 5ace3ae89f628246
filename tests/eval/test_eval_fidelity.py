"""Teacher-forced fidelity on the tiny model: parity with the dense forward, exact self-agreement,
and lower agreement for a damaged model or a quantized KV cache."""

from __future__ import annotations

import copy

import pytest
import torch

from fishserve.engine.long_text import plan_long_text
from fishserve.eval.fidelity import compare, sequence_columns, teacher_forced
from fishserve.eval.int8_weights import perturb_linears

FRAMES = 24


@pytest.fixture(scope="module")
def sequence(tiny_model, tiny_tokenizer):
    nc = tiny_model.config.num_codebooks
    prompt = plan_long_text(tiny_tokenizer, nc, "Hello there, friend.", [], 0).next_prompt(0)
    codes = torch.randint(1, 1024, (nc, FRAMES), generator=torch.Generator().manual_seed(0))
    return prompt, codes


def test_fp32_paged_teacher_forcing_equals_the_dense_training_forward(tiny_model, sequence):
    prompt, codes = sequence
    tf = teacher_forced(tiny_model, prompt, codes, "fp32")
    p = prompt.shape[1]
    with torch.inference_mode():
        token_logits, codebook_logits = tiny_model(
            sequence_columns(tiny_model, prompt, codes)[None]
        )
    torch.testing.assert_close(tf.slow, token_logits[0, p - 1 : p + FRAMES - 1], atol=1e-4, rtol=0)
    torch.testing.assert_close(
        tf.fast, codebook_logits[0, p - 1 : p + FRAMES - 1], atol=1e-4, rtol=0
    )


def test_same_configuration_agrees_exactly(tiny_model, sequence):
    a = teacher_forced(tiny_model, *sequence, "fp32")
    b = teacher_forced(tiny_model, *sequence, "fp32")
    fid = compare([a], [b])
    assert fid.frames == FRAMES
    assert fid.slow_top1 == 1.0 and fid.slow_kl == 0.0
    assert fid.codebook_top1 == [1.0] * 4 and fid.codebook_kl == [0.0] * 4


def test_quantized_kv_has_small_but_nonzero_divergence(tiny_model, sequence):
    ref = teacher_forced(tiny_model, *sequence, "fp32")
    fid = compare([ref], [teacher_forced(tiny_model, *sequence, "int8")])
    assert 0 < fid.slow_kl < 0.05 and fid.slow_top1 > 0.8


def test_damaged_model_shows_lower_agreement(tiny_model, sequence):
    damaged = copy.deepcopy(tiny_model)
    perturb_linears(damaged, 0.5, seed=1)
    ref = teacher_forced(tiny_model, *sequence, "fp32")
    fid = compare([ref], [teacher_forced(damaged, *sequence, "fp32")])
    assert fid.slow_top1 < 0.9 and fid.codebook_top1_min < 0.9 and fid.slow_kl > 0.05
