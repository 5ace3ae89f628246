"""Optional text normaliser for HTTP requests (`normalize: true`, the Fish API default).

What it does, in order:
* markdown links: `[label](url)` -> label;
* markdown emphasis and code: removes the markers of `***x***`, `**x**`, `*x*`, `___x___`,
  `__x__`, `_x_`, `~~x~~` and `` `x` `` (up to three backticks) when they wrap text on one line
  at word boundaries: the opening marker is not preceded by a letter, digit or `_` and is
  followed by a non-space, the closing one is preceded by a non-space and not followed by a
  letter, digit or `_`. So `2*3*4`, `a * b * c`, `snake_case` and `my__var__name` stay as
  written. Wrapped text cannot contain its own marker character (`**a*b**` is left alone);
* line markers: heading `#`s, blockquote `>` and list bullets (`-`, `*`, `+`) at line starts;
* emoji: removes pictographs, symbols and their modifiers (the model cannot speak them; the
  reference's cleaner removes only four emoji blocks);
* whitespace: collapses runs of spaces/tabs, keeps at most one blank line.

Every pattern runs in time linear in the text length: each one is anchored on a marker
character and its repeated parts cannot cross the next marker or line end, so no input makes
the regex engine backtrack over more than one span (a text of 10,000 backticks or asterisks
takes milliseconds).

What it does not do: numbers, dates and abbreviations are left as written (the model reads
digits); no language-specific rewriting. Without `normalize`, only the reference's own cleaning
(spec §6.1) applies.
"""

from __future__ import annotations

import re

# The url may hold spaces (`[a](u "title")`) but no parentheses or newline.
_LINK = re.compile(r"\[([^\[\]\n]*)\]\([^()\n]*\)")
_CODE = re.compile(r"(?<!`)(`{1,3})([^`\n]+)\1(?!`)")
_LINE_MARKERS = re.compile(r"^[ \t]*(?:#{1,6}[ \t]+|>[ \t]?|[-*+][ \t]+)", re.MULTILINE)
_EMOJI = re.compile(
    "[\U0001f000-\U0001faff\U00002600-\U000027bf\U0001f1e6-\U0001f1ff"
    "\u200d\ufe0e\ufe0f\U0001f3fb-\U0001f3ff]"
)
_SPACES = re.compile(r"[ \t]+")
_BLANK_LINES = re.compile(r"\n(?:[ \t\r\f\v]*\n)+")


def _wrapped(marker: str) -> re.Pattern[str]:
    """`marker` text `marker` at word boundaries, on one line, text free of the marker char."""
    m, c = re.escape(marker), re.escape(marker[0])
    return re.compile(rf"(?<![\w{c}]){m}(?=[^\s{c}])([^{c}\n]*?[^\s{c}]){m}(?![\w{c}])")


# Longest markers first: `**` must not be read as two `*` markers.
_EMPHASIS = [_wrapped(m) for m in ("***", "**", "*", "___", "__", "_", "~~")]


def normalize_text(text: str) -> str:
    """Apply the normaliser described in the module docstring; returns the stripped result."""
    text = _LINK.sub(r"\1", text)
    text = _CODE.sub(r"\2", text)
    for pattern in _EMPHASIS:
        text = pattern.sub(r"\1", text)
    text = _LINE_MARKERS.sub("", text)
    text = _EMOJI.sub("", text)
    text = _SPACES.sub(" ", text)
    text = _BLANK_LINES.sub("\n\n", text)
    return text.strip()
