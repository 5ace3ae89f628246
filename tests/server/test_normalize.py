"""The request text normaliser: what it strips, what it keeps, and that it is linear-time."""

from __future__ import annotations

import time

import pytest

from fishserve.server.normalize import normalize_text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("**bold** and *it* and _it_ and `code`", "bold and it and it and code"),
        ("***both*** __under__ ~~gone~~ ``two ticks``", "both under gone two ticks"),
        ("(*aside*), *end*.", "(aside), end."),
        ('[the label](https://example.com/x "title")', "the label"),
        ("# Title\n> quoted\n- item\n* other", "Title\nquoted\nitem\nother"),
        ("a\n\n\n \t\nb   c", "a\n\nb c"),
        ("hi 😀 there 👍🏽", "hi there"),
    ],
)
def test_markdown_is_removed(text, expected):
    assert normalize_text(text) == expected


@pytest.mark.parametrize(
    "text",
    ["2*3*4", "2**10**2", "a * b * c", "my__var__name", "snake_case", "x_1 and y_2", "**a*b**"],
)
def test_arithmetic_and_identifiers_are_kept(text):
    assert normalize_text(text) == text


ADVERSARIAL = ["`", "*", "_", "~", "**a", "[", "[a](", "`a", " *a", "_a ", "a*", "\n ", "#"]


@pytest.mark.parametrize("unit", ADVERSARIAL)
def test_linear_time_on_adversarial_input(unit):
    text = unit * (10_000 // len(unit))  # the old emphasis regex took ~15 s on 9,999 backticks
    start = time.perf_counter()
    normalize_text(text)
    assert time.perf_counter() - start < 0.5
