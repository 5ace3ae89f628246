"""Text cleaning and chunking as in the Fish Speech 1.5 reference (spec §6.1).

All lengths are UTF-8 **byte** counts (spec §9.11). The splitter reproduces the reference
exactly, including two quirks:

* during the sentence-punctuation stage, decimals such as ``3.14`` are protected by rewriting them
  as ``<3_f_14>``, and that stage's length test sees the *protected* (longer) text (this cannot
  change the result: a text that fits is re-joined whole by the final merge);
* the hard cut appends whole characters and cuts once a piece reaches ``chunk_length`` bytes, so a
  piece can exceed the limit by up to 3 bytes when a multi-byte character crosses the boundary.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Iterator

_QUOTE_MAP = {"\u2018": "'", "\u2019": "'"}
_QUOTE_RE = re.compile("[\u2018\u2019]")
_EMOJI_RE = re.compile(
    "[\U0001f600-\U0001f64f\U0001f300-\U0001f5ff\U0001f680-\U0001f6ff\U0001f1e0-\U0001f1ff]+"
)
_COMMAS_RE = re.compile(",{2,}")
# A decimal number "12.5" (protected from the sentence split at its "."). The lookbehind starts
# a match only at the first digit of a run: without it a long run of digits with no "." is
# retried from every digit, quadratic in its length (10,000 digits: 1.2 s). Same matches.
_FLOAT_RE = re.compile(r"(?<!\d)(\d+)\.(\d+)")
_PROTECTED_FLOAT_RE = re.compile(r"<(\d+)_f_(\d+)>")

SENTENCE_PUNCTUATION = frozenset(".!?。！？")
"""Characters after which over-long text is split first (spec §6.1)."""
COMMA_PUNCTUATION = frozenset(",，")
"""Characters after which still-long pieces are split second (spec §6.1)."""
_SPACES = frozenset(" ")
_ASCII_PUNCTUATION = frozenset(string.punctuation)


def clean_text(text: str) -> str:
    """Clean text as the reference does before tokenizing (spec §6.1).

    Steps, in order: strip surrounding whitespace; map the curly single quotes U+2018/U+2019 to
    ``'``; delete emoji in U+1F600-1F64F, U+1F300-1F5FF, U+1F680-1F6FF, U+1F1E0-1F1FF; collapse
    runs of two or more ``,`` into one. The strip happens first, so whitespace next to a removed
    emoji at either end survives (reference behaviour).

    Raises:
        TypeError: ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"expected str, got {type(text).__name__}")
    text = text.strip()
    text = _QUOTE_RE.sub(lambda m: _QUOTE_MAP[m.group()], text)
    text = _EMOJI_RE.sub("", text)
    return _COMMAS_RE.sub(",", text)


def utf8_len(text: str) -> int:
    """Length of ``text`` in UTF-8 bytes (spec §6.1)."""
    return len(text.encode("utf-8"))


def _break_after(texts: Iterable[str], limit: int, marks: frozenset[str]) -> Iterator[str]:
    """Split each text longer than ``limit`` bytes after every character in ``marks``."""
    for text in texts:
        if utf8_len(text) <= limit:
            yield text
            continue
        current = ""
        for char in text:
            current += char
            if char in marks:
                yield current
                current = ""
        if current:
            yield current


def _hard_cut(texts: Iterable[str], limit: int) -> Iterator[str]:
    """Cut each text longer than ``limit`` bytes into whole-character pieces of >= ``limit``."""
    for text in texts:
        if utf8_len(text) <= limit:
            yield text
            continue
        current = ""
        for char in text:
            current += char
            if utf8_len(current) >= limit:
                yield current
                current = ""
        if current:
            yield current


def _is_droppable(piece: str) -> bool:
    return all(c.isspace() or c in _ASCII_PUNCTUATION for c in piece)


def _merge(pieces: Iterable[str], limit: int) -> list[str]:
    """Greedily re-join pieces while the total stays <= ``limit``; strip; drop empty ones."""
    segments: list[str] = []
    current = ""
    for piece in pieces:
        if utf8_len(current) + utf8_len(piece) <= limit:
            current += piece
            continue
        segments.append(current.strip())
        current = piece
    segments.append(current.strip())
    return [s for s in segments if s and not _is_droppable(s)]


def split_text(text: str, chunk_length: int) -> list[str]:
    """Clean ``text`` and split it into chunks of at most ``chunk_length`` UTF-8 bytes (§6.1).

    Stages (each only touches pieces still longer than ``chunk_length`` bytes):

    1. split after ``. ! ? 。 ！ ？`` with decimals like ``3.14`` protected (the length test of this
       stage sees the protected form ``<3_f_14>``);
    2. split after ``,`` and ``，``;
    3. split after spaces;
    4. hard cut: whole characters are appended until the piece reaches ``chunk_length`` bytes, so
       a multi-byte character is never split but may overshoot the limit by up to 3 bytes.

    Pieces are then greedily re-joined while the total stays <= ``chunk_length``; every result is
    stripped and dropped when it is empty or only whitespace/ASCII punctuation.

    Args:
        text: raw input text (it is passed through :func:`clean_text` first, as in the reference).
        chunk_length: limit in bytes; ``<= 0`` disables splitting (the reference's
            "iterative prompting off"): returns ``[text]`` unchanged, since the prompt builder
            cleans each chunk once, or ``[]`` when the cleaned text is empty or droppable.

    Returns:
        The chunks, in order.

    Raises:
        TypeError: ``text`` is not a ``str``.
    """
    cleaned = clean_text(text)
    if chunk_length <= 0:
        return [] if not cleaned or _is_droppable(cleaned) else [text]
    text = cleaned
    pieces: Iterable[str] = [_FLOAT_RE.sub(r"<\1_f_\2>", text)]
    pieces = _break_after(pieces, chunk_length, SENTENCE_PUNCTUATION)
    pieces = (_PROTECTED_FLOAT_RE.sub(r"\1.\2", p) for p in pieces)
    pieces = _break_after(pieces, chunk_length, COMMA_PUNCTUATION)
    pieces = _break_after(pieces, chunk_length, _SPACES)
    return _merge(_hard_cut(pieces, chunk_length), chunk_length)
