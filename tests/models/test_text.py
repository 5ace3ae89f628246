"""clean_text / split_text against the reference behaviour (spec §6.1)."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fishserve.models.text import clean_text, split_text, utf8_len

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_t2s"
_IGNORED = set(string.punctuation) | set(string.whitespace)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  hello  ", "hello"),
        ("it\u2019s \u2018fine\u2019", "it's 'fine'"),
        (
            "smile \U0001f600 rocket \U0001f680 flag \U0001f1fa\U0001f1f8 !",
            "smile  rocket  flag  !",
        ),
        ("hi \U0001f600", "hi "),  # strip happens before the emoji removal
        ("a,,b,,,,c,d", "a,b,c,d"),
        ("wait... ok", "wait... ok"),  # only commas collapse
        ("\u201cdouble\u201d", "\u201cdouble\u201d"),  # double curly quotes are kept
        ("你好，，世界", "你好，，世界"),  # full-width commas are not collapsed
    ],
)
def test_clean_text(raw: str, expected: str) -> None:
    assert clean_text(raw) == expected


def test_clean_text_rejects_non_str() -> None:
    with pytest.raises(TypeError):
        clean_text(None)  # type: ignore[arg-type]


def test_generate_long_fixture_split() -> None:
    meta = json.loads((FIXTURE / "meta.json").read_text(encoding="utf-8"))["generate_long"]
    assert split_text(meta["text"], meta["chunk_length"]) == meta["split_segments"]


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        (
            "This is a test sentence. This is another test sentence. And a third one.",
            50,
            ["This is a test sentence.", "This is another test sentence. And a third one."],
        ),
        ("a,aaaaaa3.14", 10, ["a,", "aaaaaa3.14"]),
        ("   ", 10, []),
        ("a", 10, ["a"]),
        ("... !!! ,,", 3, []),
        (
            "This is a test sentence with only commas, and no dots, and no exclamation marks, "
            "and no question marks, and no newlines.",
            50,
            [
                "This is a test sentence with only commas,",
                "and no dots, and no exclamation marks,",
                "and no question marks, and no newlines.",
            ],
        ),
    ],
)
def test_split_examples(text: str, limit: int, expected: list[str]) -> None:
    assert split_text(text, limit) == expected


def test_split_cjk_sentence_punctuation() -> None:
    text = "今天天气很好。我们去公园吧！你觉得怎么样？"  # 3 sentences of 21, 21 and 24 bytes
    assert split_text(text, 30) == ["今天天气很好。", "我们去公园吧！", "你觉得怎么样？"]
    assert split_text(text, 42) == ["今天天气很好。我们去公园吧！", "你觉得怎么样？"]


def test_split_cjk_comma() -> None:
    text = "第一部分很长很长，第二部分也很长很长，第三部分"
    assert split_text(text, 30) == ["第一部分很长很长，", "第二部分也很长很长，", "第三部分"]


def test_decimals_not_split() -> None:
    text = "The value of pi is 3.14 and e is 2.71. Next sentence here."
    assert split_text(text, 40) == ["The value of pi is 3.14 and e is 2.71.", "Next sentence here."]


def test_hard_cut_keeps_multibyte_chars_whole() -> None:
    assert split_text("aaaaaaaaa你好", 10) == ["aaaaaaaaa你", "好"]  # 12 bytes: reference overshoot
    assert split_text("abcdefghijkl", 5) == ["abcde", "fghij", "kl"]


def test_no_splitting_when_limit_not_positive() -> None:
    text = "  One. Two, three! \u2019 "
    assert split_text(text, 0) == [text]
    assert split_text(text, -1) == [text]
    assert split_text(" ... ", 0) == []


_ALPHABET = "ab xy12.,!?;。，！？你é𝄞’\t"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=_ALPHABET, max_size=80), st.integers(min_value=1, max_value=40))
def test_split_properties(text: str, limit: int) -> None:
    pieces = split_text(text, limit)
    for piece in pieces:
        assert piece == piece.strip() and piece
        assert not all(c in _IGNORED for c in piece)
        # Over the limit only through the last (multi-byte, unbreakable) character.
        assert utf8_len(piece) <= limit or utf8_len(piece[:-1]) < limit
    kept = [c for c in "".join(pieces) if c not in _IGNORED]
    assert kept == [c for c in clean_text(text) if c not in _IGNORED]
    nonspace = [c for c in "".join(pieces) if not c.isspace()]
    source = iter(c for c in clean_text(text) if not c.isspace())
    assert all(c in source for c in nonspace)  # an in-order subsequence of the cleaned text


def test_decimal_protection_matches_as_the_unanchored_pattern_did():
    """The float pattern's lookbehind (linear time on long digit runs) changes no match."""
    import random
    import re

    from fishserve.models.text import _FLOAT_RE

    unanchored = re.compile(r"(\d+)\.(\d+)")
    rng = random.Random(0)
    for _ in range(2000):
        text = "".join(rng.choice("12.a <") for _ in range(rng.randrange(1, 30)))
        assert _FLOAT_RE.sub(r"<\1_f_\2>", text) == unanchored.sub(r"<\1_f_\2>", text), text


def test_a_long_run_of_digits_is_split_without_quadratic_backtracking():
    """50,000 digits took ~30 s with the unanchored pattern (quadratic), ~0.1 s now; the bound
    is loose on purpose: it catches the blow-up, not a slow machine."""
    import threading

    result: list[list[str]] = []
    worker = threading.Thread(target=lambda: result.append(split_text("1" * 50_000, 200)))
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "split_text backtracks on a long run of digits"
    assert "".join(result[0]) == "1" * 50_000 and max(map(len, result[0])) <= 200
