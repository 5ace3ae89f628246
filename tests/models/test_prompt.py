"""Prompt builder parity with the reference prompts (spec §3.2, §3.3, §6.2; fixture tiny_t2s)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from fishserve.models.prompt import (
    HISTORY_RESERVE,
    Reference,
    build_prompt,
    frames_to_columns,
    prefix_budget_length,
    reference_prefix,
    select_history,
    select_history_indices,
    system_message,
    user_turn,
)
from fishserve.models.text import split_text
from fishserve.models.tokenizer import FishTokenizer

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_t2s"
NC = 4


@cache
def _tok() -> FishTokenizer:
    return FishTokenizer(FIXTURE / "tokenizer.tiktoken")


@cache
def _meta() -> dict:
    return json.loads((FIXTURE / "meta.json").read_text(encoding="utf-8"))


@cache
def _case(name: str) -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURE / f"{name}.safetensors"))


def _refs() -> list[Reference]:
    return [Reference(_case("generate_long_case")["ref_codes"], _meta()["ref_text"])]


def _same(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    return actual.dtype == torch.long and torch.equal(actual, expected.to(torch.long))


def test_generate_case_prompt_parts() -> None:
    tok, parts = _tok(), _meta()["prompt_parts"]
    prefix = reference_prefix(tok, _refs(), NC)
    segment = user_turn(tok, _meta()["segment_text"], NC)
    assert system_message(tok, NC).shape == (1 + NC, parts["system"])
    assert prefix.shape == (1 + NC, parts["system"] + parts["reference"])
    assert segment.shape == (1 + NC, parts["segment"])
    assert _same(build_prompt(prefix, [segment]), _case("generate_case")["prompt"])


def test_generate_case_prompt_eos() -> None:
    tok = _tok()
    segment = user_turn(tok, _meta()["eos_case"]["segment_text"], NC)
    prompt = build_prompt(reference_prefix(tok, _refs(), NC), [segment])
    assert _same(prompt, _case("generate_case")["prompt_eos"])


def test_reference_turn_layout() -> None:
    tok = _tok()
    prefix = reference_prefix(tok, _refs(), NC)
    codes = _case("generate_long_case")["ref_codes"].long()
    voice_at = (prefix[0] == tok.voice_id).nonzero().item()
    audio = prefix[:, voice_at + 1 : voice_at + 1 + codes.shape[1]]
    assert torch.equal(audio[0], codes[0] + tok.semantic_begin_id)
    assert torch.equal(audio[1:], codes)
    assert prefix[0, -1].item() == tok.im_end_id
    assert not prefix[1:, : voice_at + 1].any() and not prefix[1:, -1].any()
    no_newline = (prefix[0, :-1] == tok.im_end_id) & (prefix[0, 1:] == tok.im_start_id)
    assert int(no_newline.sum()) == 2  # system|user and user|assistant are adjacent


def test_reference_codes_cut_to_num_codebooks() -> None:
    tok, ref = _tok(), _refs()[0]
    extra = torch.cat([ref.codes, torch.full((4, ref.codes.shape[1]), 999)], dim=0)
    wide = reference_prefix(tok, [Reference(extra, ref.text)], NC)
    assert torch.equal(wide, reference_prefix(tok, [ref], NC))
    narrow = reference_prefix(tok, [ref], 2)
    assert narrow.shape == (3, 86) and torch.equal(narrow, wide[:3])
    with pytest.raises(ValueError):
        reference_prefix(tok, [Reference(ref.codes[:3], ref.text)], NC)


def test_no_references() -> None:
    tok = _tok()
    assert reference_prefix(tok, [], NC).shape == (1 + NC, 0)
    assert prefix_budget_length(tok, [], NC) == _meta()["prompt_parts"]["system"]
    assert prefix_budget_length(tok, _refs(), NC) == 86
    prompt = build_prompt(reference_prefix(tok, [], NC), [user_turn(tok, "Hi.", NC)])
    assert prompt[0, 0].item() == tok.im_start_id and prompt[0, -1].item() == tok.voice_id


def test_user_turn_cleans_and_keeps_specials_live() -> None:
    tok = _tok()
    # Cleaned once: the space before the removed emoji survives (strip runs first).
    cleaned = user_turn(tok, "  it\u2019s ok \U0001f600", NC)
    expected = [
        *tok.encode("<|im_start|>user\n"),
        *tok.encode("it's ok "),
        tok.im_end_id,
        *tok.encode("<|im_start|>assistant\n"),
        tok.voice_id,
    ]
    assert cleaned[0].tolist() == expected and not cleaned[1:].any()
    injected = user_turn(tok, "a<|im_end|>b", NC)[0].tolist()
    assert injected.count(tok.im_end_id) == 2


def test_frames_to_columns() -> None:
    frames = torch.tensor([[0, 5, 1023], [1, 2, 3]], dtype=torch.int32)
    cols = frames_to_columns(frames, 309)
    assert cols.dtype == torch.long
    assert cols.tolist() == [[309, 314, 1332], [0, 5, 1023], [1, 2, 3]]
    for bad in [torch.tensor([[1024]]), torch.tensor([[-1]]), torch.zeros(3), torch.zeros(2, 2)]:
        with pytest.raises(ValueError):
            frames_to_columns(bad, 309)


def test_generate_long_prompts() -> None:
    tok, meta, case = _tok(), _meta()["generate_long"], _case("generate_long_case")
    segments = split_text(meta["text"], meta["chunk_length"])
    assert segments == meta["split_segments"] == meta["segment_texts"]
    prefix = reference_prefix(tok, _refs(), NC)
    budget_prefix = prefix_budget_length(tok, _refs(), NC)
    u0, u1 = (user_turn(tok, s, NC) for s in segments)
    history = [u0]
    p0 = build_prompt(prefix, select_history(history, meta["max_length"], budget_prefix))
    assert _same(p0, case["segment_0_prompt"])
    # Frames generated for segment 0 = the columns between the two user turns of prompt 1.
    p1_expected = case["segment_1_prompt"].long()
    gen0 = p1_expected[:, p0.shape[1] : p1_expected.shape[1] - u1.shape[1]]
    assert torch.equal(gen0[1:, 1:], case["segment_0_codes"].long())  # first frame dropped
    assert gen0[0, -1].item() == tok.im_end_id
    history += [gen0, u1]
    p1 = build_prompt(prefix, select_history(history, meta["max_length"], budget_prefix))
    assert _same(p1, p1_expected)
    assert [p0.shape[1], p1.shape[1]] == meta["segment_prompt_lengths"]


def _items(lengths: list[int]) -> list[torch.Tensor]:
    return [torch.full((1 + NC, n), j) for j, n in enumerate(lengths)]


@pytest.mark.parametrize(
    ("budget", "kept"),
    [
        (1000, [0, 1, 2, 3, 4, 5, 6]),  # everything fits
        (30, [0, 1, 4, 5, 6]),  # stops at i=3 (count 25 + 8 = 33 > 30)
        (22, [0, 1, 6]),  # stops at i=2 (17 + 6 = 23 > 22), even -> 1
        (7, [0, 1, 0, 1, 2, 3, 4, 5, 6]),  # i=0: reference's h[-0:] repeats the whole list
    ],
)
def test_select_history_hand_computed(budget: int, kept: list[int]) -> None:
    lengths = [10, 20, 5, 8, 6, 7, 4]
    history = _items(lengths)
    prefix_length = 29
    max_length = budget + HISTORY_RESERVE + prefix_length
    chosen = select_history(history, max_length, prefix_length)
    assert [int(t[0, 0]) for t in chosen] == kept
    assert all(chosen[k] is history[j] for k, j in enumerate(kept))


def test_select_history_zero_quirk_option_and_short_lists() -> None:
    assert select_history_indices([10, 20, 5], 1030, 0, exact_reference=False) == [0, 1, 2]
    assert select_history_indices([10, 20, 5], 1030, 0) == [0, 1, 0, 1, 2]
    assert select_history_indices([500], 1030, 0) == [0]  # len(H) <= 2 keeps all
    assert select_history_indices([5, 9, 500], 1030, 0) == [0, 1, 0, 1, 2]
    with pytest.raises(ValueError):
        select_history_indices([], 2048, 0)


def _walk_stop(lengths: list[int], budget: int) -> int | None:
    count = 0
    for k, n in enumerate(reversed(lengths)):
        count += n
        if count + n > budget:
            return k
    return None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=12),
    st.integers(min_value=-50, max_value=400),
    st.booleans(),
)
def test_select_history_properties(lengths: list[int], budget: int, exact: bool) -> None:
    n = len(lengths)
    keep = select_history_indices(lengths, budget + HISTORY_RESERVE, 0, exact_reference=exact)
    stop = _walk_stop(lengths, budget)
    i = n - 1 if stop is None else stop
    i -= i > 0 and i % 2 == 0
    if i >= n - 2:
        assert keep == list(range(n))  # everything
        return
    assert keep[:2] == [0, 1]
    suffix = keep[2:]
    if i == 0 and exact:
        assert suffix == list(range(n))  # the reference's h[-0:]
        return
    assert suffix == list(range(n - len(suffix), n))  # a sub-list keeping the newest item
    assert suffix[0] >= 2  # no repeats
    assert len(suffix) % 2 == 1  # odd count: the suffix starts at a user turn
    assert len(suffix) == max(i, 1)
    count = 0
    for n_k in reversed([lengths[j] for j in suffix]):
        count += n_k
        assert count + n_k <= budget or i == 0  # every kept item passed the walk's test


def test_a_prompt_is_built_with_few_pytorch_calls() -> None:
    """Every PyTorch call releases and re-takes the GIL, ~0.5 ms each in the engine's busy
    process (docs/benchmarks.md §6.27): a request's prompt is built in NumPy instead."""
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        calls: list[str]

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", str(func))
            if name != "__get__":  # attribute reads (.shape, .dtype) release nothing
                self.calls.append(name)
            return func(*args, **(kwargs or {}))

    tok = _tok()
    prefix_budget_length(tok, [], NC)  # the system message is encoded once per tokenizer
    counter = Count()
    counter.calls = []
    with counter:
        prefix = reference_prefix(tok, [], NC)
        budget = prefix_budget_length(tok, [], NC)
        prompt = build_prompt(prefix, [user_turn(tok, "Hello there, a test.", NC)])
    assert len(counter.calls) <= 2, counter.calls  # the final concatenation, at most
    assert budget == system_message(tok, NC).shape[1] and prompt.shape[0] == 1 + NC


def test_system_message_is_cached_but_each_call_returns_a_new_tensor() -> None:
    tok = _tok()
    first, second = system_message(tok, NC), system_message(tok, NC)
    assert torch.equal(first, second) and first.data_ptr() != second.data_ptr()
    first[0, 0] = -1  # a caller may write into its copy...
    assert torch.equal(system_message(tok, NC), second)  # ...without touching the cache


def test_the_system_message_cache_is_read_only_and_lets_tokenizers_go() -> None:
    import gc
    import weakref

    from fishserve.models.prompt import _system_array

    tok = FishTokenizer(FIXTURE / "tokenizer.tiktoken")  # a tokenizer of a model loaded...
    cached = _system_array(tok, NC)
    with pytest.raises(ValueError):
        cached.flags.writeable = True  # nobody can write into the shared columns
    probe = weakref.ref(tok)
    del tok, cached  # ...and unloaded
    gc.collect()
    assert probe() is None


def test_a_prompt_without_history_is_still_a_new_contiguous_int64_tensor() -> None:
    prefix = torch.arange(1 + NC, dtype=torch.int32).repeat(3, 1).t()  # (1 + NC, 3) view
    prompt = build_prompt(prefix, [])
    assert prompt.dtype == torch.long and prompt.is_contiguous()
    assert torch.equal(prompt, prefix.long()) and prompt.data_ptr() != prefix.data_ptr()
