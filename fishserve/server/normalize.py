"""Optional text normaliser for HTTP requests (`normalize: true`, the Fish API default).

What it does, in order:
* markdown: `[label](url)` -> label; removes emphasis and code markers (`*`, `_` pairs, `` ` ``,
  `~~`), heading `#`s, blockquote `>` and list bullets at line starts;
* emoji: removes pictographs, symbols and their modifiers (the model cannot speak them; the
  reference's cleaner removes only four emoji blocks);
* whitespace: collapses runs of spaces/tabs, keeps at most one blank line.

What it does not do: numbers, dates and abbreviations are left as written (the model reads
digits); no language-specific rewriting. Without `normalize`, only the reference's own cleaning
(spec §6.1) applies.
"""

from __future__ import annotations

import re

_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_EMPHASIS = re.compile(r"(\*{1,3}|_{2,3}|~~|`+)(?=\S)(.+?)(?<=\S)\1")
_LINE_MARKERS = re.compile(r"^[ \t]*(?:#{1,6}[ \t]+|>[ \t]?|[-*+][ \t]+)", re.MULTILINE)
_EMOJI = re.compile(
    "[\U0001f000-\U0001faff\U00002600-\U000027bf\U0001f1e6-\U0001f1ff"
    "\u200d\ufe0e\ufe0f\U0001f3fb-\U0001f3ff]"
)
_SPACES = re.compile(r"[ \t]+")
_BLANK_LINES = re.compile(r"\n\s*\n+")


def normalize_text(text: str) -> str:
    """Apply the normaliser described in the module docstring; returns the stripped result."""
    text = _LINK.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\2", text)
    text = _LINE_MARKERS.sub("", text)
    text = _EMOJI.sub("", text)
    text = _SPACES.sub(" ", text)
    text = _BLANK_LINES.sub("\n\n", text)
    return text.strip()
