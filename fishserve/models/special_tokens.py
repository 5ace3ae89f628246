"""Names of the Fish Speech 1.5 special tokens, in id order.

Source: spec §3.1. The special tokens are not stored in ``tokenizer.tiktoken``; token ``k`` of
:data:`SPECIAL_TOKENS` gets id ``N + k`` where ``N`` is the number of mergeable ranks in that file.
"""

from __future__ import annotations

BEGIN_OF_TEXT = "<|begin_of_text|>"
END_OF_TEXT = "<|end_of_text|>"
PAD = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TEXT = "<|text|>"
VOICE = "<|voice|>"
INTERLEAVE = "<|interleave|>"

NUM_PLACEHOLDERS = 4
NUM_SEMANTIC_TOKENS = 1024


def semantic_token(code: int) -> str:
    """Return the name of the semantic token for codebook-0 value ``code`` (spec §3.1).

    Raises:
        ValueError: ``code`` is outside ``[0, NUM_SEMANTIC_TOKENS)``.
    """
    if not 0 <= code < NUM_SEMANTIC_TOKENS:
        raise ValueError(f"semantic code {code} outside [0, {NUM_SEMANTIC_TOKENS})")
    return f"<|semantic:{code}|>"


SPECIAL_TOKENS: tuple[str, ...] = (
    BEGIN_OF_TEXT,
    END_OF_TEXT,
    PAD,
    IM_START,
    IM_END,
    *(f"<|placeholder:{k}|>" for k in range(NUM_PLACEHOLDERS)),
    TEXT,
    VOICE,
    INTERLEAVE,
    *(semantic_token(k) for k in range(NUM_SEMANTIC_TOKENS)),
)
"""All 1036 special-token names; the k-th one has id ``num_mergeable + k`` (spec §3.1)."""

SEMANTIC_OFFSET = SPECIAL_TOKENS.index(semantic_token(0))
"""Index of ``<|semantic:0|>`` in :data:`SPECIAL_TOKENS` (12)."""
