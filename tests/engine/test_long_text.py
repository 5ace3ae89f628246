"""Long-text generation reproduces the reference `generate_long()` prompts and codes."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY_IM_END, TINY_T2S
from safetensors.torch import load_file

from fishserve.engine.long_text import generate_long, plan_long_text
from fishserve.engine.reference import generate
from fishserve.engine.sampling import SamplingParams
from fishserve.models.prompt import Reference
from fishserve.models.tokenizer import FishTokenizer


@pytest.fixture(scope="module")
def long_case():
    meta = json.loads((TINY_T2S / "meta.json").read_text())
    return meta, load_file(TINY_T2S / "generate_long_case.safetensors")


def test_generate_long_prompts_and_codes_are_identical(tiny_model, long_case):
    meta, case = long_case
    cfg = meta["generate_long"]
    tokenizer = FishTokenizer(TINY_T2S)
    refs = [Reference(case["ref_codes"], meta["ref_text"])]
    plan = plan_long_text(tokenizer, 4, cfg["text"], refs, cfg["chunk_length"], cfg["max_length"])
    assert plan.segments == cfg["split_segments"]
    params = SamplingParams(cfg["temperature"], cfg["top_p"], cfg["repetition_penalty"])
    prompts = []

    def segment(prompt: torch.Tensor, index: int) -> torch.Tensor:
        prompts.append(prompt)
        return generate(
            tiny_model, prompt, params, TINY_IM_END, cfg["max_new_tokens"], segment=index
        )

    codes = list(generate_long(plan, segment))
    for i, (prompt, emitted) in enumerate(zip(prompts, codes, strict=True)):
        assert torch.equal(prompt, case[f"segment_{i}_prompt"].long())
        assert torch.equal(emitted, case[f"segment_{i}_codes"].long())


@pytest.mark.parametrize("chunk_length", [60, 0])
@pytest.mark.parametrize("text", [" ... ", "\x01\x02\x07\x1b", "\u200b\u00a0\t"])
def test_text_with_nothing_to_speak_is_refused(text: str, chunk_length: int):
    """Punctuation only, or only control, format and space characters (synth spoke the
    latter as 26 frames of noise)."""
    tokenizer = FishTokenizer(TINY_T2S)
    if text == " ... " and chunk_length == 0:
        pytest.skip("without splitting, punctuation is spoken (the reference's behaviour)")
    with pytest.raises(ValueError, match="empty"):
        plan_long_text(tokenizer, 4, text, [], chunk_length)
    assert plan_long_text(tokenizer, 4, text + "Hi.", [], chunk_length).segments
