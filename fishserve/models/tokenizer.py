"""The Fish Speech 1.5 byte-level BPE tokenizer (spec §3.1).

The vocabulary file ``tokenizer.tiktoken`` holds one mergeable token per line as
``base64(token bytes) SPACE rank`` with ranks ``0..N-1``. The 1036 special tokens of
:mod:`fishserve.models.special_tokens` are appended at ids ``N + k``. Text is pre-tokenized with
:data:`FISH_PATTERN`, which reproduces the reference's escaped ``\\?`` in its 7th alternative.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from pathlib import Path

import tiktoken

from fishserve.models.special_tokens import (
    IM_END,
    IM_START,
    SEMANTIC_OFFSET,
    SPECIAL_TOKENS,
    VOICE,
    semantic_token,
)

FISH_PATTERN = "|".join(
    [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)",
        r"\p{P}",
        r"[^\r\n\p{L}\p{N}]?\p{L}+",
        r"\p{N}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        # Not a lookahead: the escaped "\?" makes this match whitespace + literal "?!" + one
        # non-space character. The reference has this bug; ids depend on it (spec §3.1, §9.9).
        r"\s+(\?!\S)",
        r"\s+",
    ]
)
"""Pre-tokenizer regex of the reference, alternatives in order (spec §3.1)."""

MAX_ENCODE_CHARS = 400_000
"""Inputs are encoded in slices of this many characters, as the reference does (spec §3.1)."""

TOKENIZER_FILENAME = "tokenizer.tiktoken"


def load_mergeable_ranks(path: str | Path) -> dict[bytes, int]:
    """Read a ``tokenizer.tiktoken`` file into a ``{token bytes: rank}`` map (spec §3.1).

    Empty lines are skipped. The ranks must be exactly ``0..N-1`` with no duplicate tokens.

    Raises:
        FileNotFoundError: ``path`` does not exist or is not a file.
        ValueError: a line is not ``base64 SPACE integer``, a token or rank repeats, or the ranks
            are not ``0..N-1``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    ranks: dict[bytes, int] = {}
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            line = raw.strip()
            if not line:
                continue
            token, rank = _parse_rank_line(line, path, lineno)
            if token in ranks:
                raise ValueError(f"{path}:{lineno}: duplicate token {token!r}")
            ranks[token] = rank
    _check_rank_range(ranks, path)
    return ranks


def _parse_rank_line(line: bytes, path: Path, lineno: int) -> tuple[bytes, int]:
    fields = line.split()
    if len(fields) != 2:
        raise ValueError(f"{path}:{lineno}: expected 'base64 rank', got {line[:80]!r}")
    try:
        token = base64.b64decode(fields[0], validate=True)
        rank = int(fields[1])
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{path}:{lineno}: malformed line {line[:80]!r}: {exc}") from exc
    if not token:
        raise ValueError(f"{path}:{lineno}: empty token")
    return token, rank


def _check_rank_range(ranks: dict[bytes, int], path: Path) -> None:
    if not ranks:
        raise ValueError(f"{path}: no tokens")
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: ranks must be exactly 0..{len(ranks) - 1} without repeats")


# Every special token starts with "<|", so text without it is encoded the same with or without
# them (`encode_ordinary`: ~15x faster than passing tiktoken the 1,036 allowed names per call).
_SPECIALS_OPEN_WITH_BAR = all(name.startswith("<|") for name in SPECIAL_TOKENS)
# Pieces with special tokens up to this many characters are encoded once and cached, up to
# this many pieces per tokenizer.
_CACHED_CHARS = 64
_CACHED_PIECES = 256


class FishTokenizer:
    """Fish Speech tokenizer: tiktoken BPE + 1036 special tokens at ids ``N + k`` (spec §3.1).

    Special tokens written inside input text are recognized (a user typing ``<|im_end|>`` injects
    that token), exactly as in the reference (spec §3.1, §9.9).

    Args:
        path: a ``tokenizer.tiktoken`` file, or a checkpoint folder that contains one.

    Raises:
        FileNotFoundError: the file (or the folder's ``tokenizer.tiktoken``) does not exist.
        ValueError: the file is malformed (see :func:`load_mergeable_ranks`).
    """

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILENAME
        self._setup(load_mergeable_ranks(path), f"fish:{path}")
        self.path: Path | None = path

    def _setup(self, ranks: dict[bytes, int], name: str) -> None:
        self._ranks = ranks
        self._cache: dict[str, tuple[int, ...]] = {}
        self._num_mergeable = len(ranks)
        self._special_ids = {name: self._num_mergeable + k for k, name in enumerate(SPECIAL_TOKENS)}
        self._encoding = tiktoken.Encoding(
            name=name,
            pat_str=FISH_PATTERN,
            mergeable_ranks=ranks,
            special_tokens=self._special_ids,
        )

    @classmethod
    def byte_level(cls, num_mergeable: int = 100_000) -> FishTokenizer:
        """A stand-in tokenizer for random-weight runs when no `tokenizer.tiktoken` is at hand.

        Ranks 0..255 are the single bytes (every text is encoded byte by byte); ranks
        256..num_mergeable-1 are unreachable fillers (they start with 0xFF, which UTF-8 never
        contains), so the special tokens land at the released ids (`num_mergeable + k`, e.g.
        `<|semantic:0|>` = 100012 for the release, spec §3.1).

        Raises:
            ValueError: num_mergeable < 256.
        """
        if num_mergeable < 256:
            raise ValueError(f"num_mergeable must be >= 256, got {num_mergeable}")
        ranks = {bytes([i]): i for i in range(256)}
        for rank in range(256, num_mergeable):
            ranks[b"\xff" + rank.to_bytes(4, "big")] = rank
        tokenizer = cls.__new__(cls)
        tokenizer._setup(ranks, f"fish:byte-level-{num_mergeable}")
        tokenizer.path = None
        return tokenizer

    @property
    def encoding(self) -> tiktoken.Encoding:
        """The underlying ``tiktoken.Encoding``."""
        return self._encoding

    @property
    def mergeable_ranks(self) -> dict[bytes, int]:
        """Copy of the ``{token bytes: rank}`` map read from the file."""
        return dict(self._ranks)

    @property
    def num_mergeable(self) -> int:
        """N, the number of mergeable ranks in the file (297 for the tiny fixture)."""
        return self._num_mergeable

    @property
    def vocab_size(self) -> int:
        """Number of used ids, N + 1036. The model's embedding may have more rows (padding)."""
        return self._num_mergeable + len(SPECIAL_TOKENS)

    @property
    def special_token_ids(self) -> dict[str, int]:
        """Copy of the ``{special token name: id}`` map (same content as special_tokens.json)."""
        return dict(self._special_ids)

    @property
    def im_start_id(self) -> int:
        """Id of ``<|im_start|>`` (N + 3)."""
        return self._special_ids[IM_START]

    @property
    def im_end_id(self) -> int:
        """Id of ``<|im_end|>`` (N + 4), the only EOS token (spec §9.8)."""
        return self._special_ids[IM_END]

    @property
    def voice_id(self) -> int:
        """Id of ``<|voice|>`` (N + 10)."""
        return self._special_ids[VOICE]

    @property
    def semantic_begin_id(self) -> int:
        """Id of ``<|semantic:0|>`` (N + 12)."""
        return self._num_mergeable + SEMANTIC_OFFSET

    @property
    def semantic_end_id(self) -> int:
        """Id of ``<|semantic:1023|>`` (N + 1035), inclusive."""
        return self._special_ids[semantic_token(len(SPECIAL_TOKENS) - SEMANTIC_OFFSET - 1)]

    def token_id(self, name: str) -> int:
        """Return the id of special token ``name``.

        Raises:
            KeyError: ``name`` is not a special token.
        """
        return self._special_ids[name]

    def encode(self, text: str) -> list[int]:
        """Encode ``text`` to ids, special tokens allowed, in 400,000-character slices (§3.1).

        A special token that straddles a slice boundary is split, as in the reference.

        Raises:
            TypeError: ``text`` is not a ``str``.
        """
        if not isinstance(text, str):
            raise TypeError(f"expected str, got {type(text).__name__}")
        ids: list[int] = []
        for start in range(0, len(text), MAX_ENCODE_CHARS):
            piece = text[start : start + MAX_ENCODE_CHARS]
            if _SPECIALS_OPEN_WITH_BAR and "<|" not in piece:  # no special token can match
                ids.extend(self._encoding.encode_ordinary(piece))
                continue
            if len(piece) <= _CACHED_CHARS:  # chat headers like "<|im_start|>user\n"
                ids.extend(self._encode_cached(piece))
                continue
            ids.extend(self._encoding.encode(piece, allowed_special="all", disallowed_special=()))
        return ids

    def _encode_cached(self, piece: str) -> tuple[int, ...]:
        """Ids of a short piece with special tokens (the prompt's headers recur every
        request), kept in this tokenizer's cache of at most `_CACHED_PIECES` pieces."""
        ids = self._cache.get(piece)
        if ids is None:
            ids = tuple(self._encoding.encode(piece, allowed_special="all", disallowed_special=()))
            if len(self._cache) < _CACHED_PIECES:
                self._cache[piece] = ids
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Decode ids to text (invalid UTF-8 replaced by U+FFFD); special tokens print by name.

        Raises:
            KeyError: an id is not in the vocabulary (``>= vocab_size`` or negative).
        """
        return self._encoding.decode([int(i) for i in ids], errors="replace")
