"""FishTokenizer parity with the reference tokenizer (spec §3.1, fixture tiny_t2s)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import tiktoken

from fishserve.models.special_tokens import SPECIAL_TOKENS
from fishserve.models.tokenizer import FISH_PATTERN, MAX_ENCODE_CHARS, FishTokenizer

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_t2s"


@cache
def _tok() -> FishTokenizer:
    return FishTokenizer(FIXTURE / "tokenizer.tiktoken")


@cache
def _cases() -> dict:
    return json.loads((FIXTURE / "tokenizer_cases.json").read_text(encoding="utf-8"))


def _case_ids(text: str) -> list[int]:
    return next(c["ids"] for c in _cases()["cases"] if c["text"] == text)


def _encoding_with(pattern: str) -> tiktoken.Encoding:
    tok = _tok()
    return tiktoken.Encoding(
        name="variant",
        pat_str=pattern,
        mergeable_ranks=tok.mergeable_ranks,
        special_tokens=tok.special_token_ids,
    )


@pytest.mark.parametrize("index", range(10))
def test_fixture_cases_identical(index: int) -> None:
    case = _cases()["cases"][index]
    assert _tok().encode(case["text"]) == case["ids"]


def test_all_fixture_cases_covered() -> None:
    assert len(_cases()["cases"]) == 10


def test_special_token_table_matches_fixture() -> None:
    expected = json.loads((FIXTURE / "special_tokens.json").read_text(encoding="utf-8"))
    tok = _tok()
    assert tok.special_token_ids == expected
    assert list(expected) == list(SPECIAL_TOKENS)
    for name, token_id in _cases()["special_token_ids"].items():
        assert tok.token_id(name) == token_id


def test_id_properties_match_meta() -> None:
    meta = json.loads((FIXTURE / "meta.json").read_text(encoding="utf-8"))
    tok = _tok()
    assert tok.num_mergeable == meta["n_mergeable_ranks"] == 297
    assert tok.semantic_begin_id == meta["semantic_begin_id"] == _cases()["semantic_begin_id"]
    assert tok.semantic_end_id == meta["semantic_end_id"] == _cases()["semantic_end_id"]
    assert (tok.im_start_id, tok.im_end_id, tok.voice_id) == (300, 301, 307)
    assert tok.vocab_size == 297 + 1036
    assert len(SPECIAL_TOKENS) == 1036


def test_specials_inside_text_are_live() -> None:
    tok = _tok()
    ids = tok.encode("hi<|im_end|><|semantic:5|>")
    assert ids[-2:] == [tok.im_end_id, tok.semantic_begin_id + 5]


def test_regex_quirk_matters_on_fixture_cases() -> None:
    # With the usual lookahead "\s+(?!\S)" instead of the reference's escaped "\s+(\?!\S)",
    # runs of spaces split as "  " + " c" (merge ' c'=291) instead of "    " + "c".
    fixed = _encoding_with(FISH_PATTERN.replace(r"\s+(\?!\S)", r"\s+(?!\S)"))
    for text in ["a   b    c ?!x", "  spaces\tand\nnewlines\n\n"]:
        assert fixed.encode(text) != _case_ids(text)
        assert _tok().encode(text) == _case_ids(text)


def test_regex_quirk_literal_question_bang() -> None:
    # "\s+(\?!\S)" matches whitespace + literal "?!" + one non-space: "  ?!t" is one pre-token,
    # so "the" cannot merge; without the quirk the tail is "the" (267).
    text = "x  ?!the"
    expected = [ord("x"), 32, 32, ord("?"), ord("!"), ord("t"), 257]
    assert _tok().encode(text) == expected
    without_alt7 = _encoding_with(FISH_PATTERN.replace(r"|\s+(\?!\S)", ""))
    assert without_alt7.encode(text, allowed_special="all")[-1] == 267


def test_encode_slices_at_400k_chars() -> None:
    tok = _tok()
    straddling = "a" * (MAX_ENCODE_CHARS - 3) + "<|im_end|>"
    assert tok.im_end_id not in tok.encode(straddling)
    inside = "a" * (MAX_ENCODE_CHARS - 10) + "<|im_end|>"
    assert tok.encode(inside)[-1] == tok.im_end_id


def test_decode_roundtrip() -> None:
    tok = _tok()
    text = "café 你好 <|voice|> what?!"
    assert tok.decode(tok.encode(text)) == text


def test_encode_rejects_non_str() -> None:
    with pytest.raises(TypeError):
        _tok().encode(b"bytes")  # type: ignore[arg-type]


def test_loads_from_directory() -> None:
    assert FishTokenizer(FIXTURE).num_mergeable == 297


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        FishTokenizer(tmp_path / "nope.tiktoken")
    with pytest.raises(FileNotFoundError):
        FishTokenizer(tmp_path)


@pytest.mark.parametrize(
    "content",
    [
        "",
        "QQ==\n",
        "QQ== 0 7\n",
        "!!!! 0\n",
        "QQ== zero\n",
        "QQ== 0\nQQ== 1\n",
        "QQ== 0\nQg== 2\n",
        "QQ== 1\nQg== 1\n",
    ],
    ids=["empty", "no-rank", "extra-field", "bad-b64", "bad-rank", "dup-token", "gap", "dup-rank"],
)
def test_malformed_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "tokenizer.tiktoken"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError):
        FishTokenizer(path)


@pytest.mark.parametrize("index", range(len(_cases()["cases"])))
def test_the_fast_path_for_text_without_specials_matches_the_full_encode(index: int) -> None:
    """Text without "<|" takes `encode_ordinary`; it must give the full encode's ids."""
    tok = _tok()
    text = _cases()["cases"][index]["text"].replace("<|", "<")
    full = tok._encoding.encode(text, allowed_special="all", disallowed_special=())
    assert tok.encode(text) == full


def test_short_pieces_with_specials_are_cached_and_match_the_full_encode() -> None:
    tok = _tok()
    header = "<|im_start|>user\n"
    full = tok._encoding.encode(header, allowed_special="all", disallowed_special=())
    assert tok.encode(header) == full
    ids = tok.encode(header)
    ids.append(-1)  # the caller's list is its own: the cache is not changed through it
    assert tok.encode(header) == full
    assert tok._cache[header] == tuple(full)


def test_the_cache_belongs_to_its_tokenizer_and_is_bounded() -> None:
    """A shared cache kept every unloaded tokenizer alive (~39 MB each at release size)."""
    import gc
    import weakref

    tok = FishTokenizer(FIXTURE)
    tok.encode("<|im_start|>user\n")
    ref = weakref.ref(tok)
    del tok
    gc.collect()
    assert ref() is None
    tok = _tok()
    for i in range(600):
        tok.encode(f"<|im_start|>{i}\n")
    assert len(tok._cache) <= 256
