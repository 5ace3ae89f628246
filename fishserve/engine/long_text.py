"""Long text, segment by segment, with history windowing (spec §6.1-6.2).

A request's text is cleaned and split into segments of at most `chunk_length` UTF-8 bytes.
Each segment is generated with a prompt made of the system + reference turns (if any), a
window of earlier segments (their user turns and generated frames) and the new segment's user
turn. The codes handed to the decoder for a segment drop its first generated frame and keep a
trailing `<|im_end|>` frame, as the reference does (spec §6.2, gotcha 8).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from torch import Tensor

from fishserve.models.prompt import (
    Reference,
    build_prompt,
    prefix_budget_length,
    reference_prefix,
    select_history,
    user_turn,
)
from fishserve.models.text import split_text
from fishserve.models.tokenizer import FishTokenizer

# Spec §5 (generate_long / HTTP defaults): history budget in positions.
DEFAULT_MAX_LENGTH = 2048


@dataclass
class LongTextPlan:
    """Prompt state of one long-text request across its segments.

    Attributes:
        segments: the split text segments, in order.
        prefix: int64 (1 + nc, P) system + reference turns (empty without references).
        prefix_length: positions the history budget subtracts (system counted always).
        history: user turns and generated frames of the segments so far (spec §6.2's H).
    """

    tokenizer: FishTokenizer
    num_codebooks: int
    segments: list[str]
    prefix: Tensor
    prefix_length: int
    max_length: int = DEFAULT_MAX_LENGTH
    history: list[Tensor] = field(default_factory=list)

    def next_prompt(self, index: int) -> Tensor:
        """The prompt (1 + nc, T) of segment `index`; call after `record` of segment index-1."""
        self.history.append(user_turn(self.tokenizer, self.segments[index], self.num_codebooks))
        kept = select_history(self.history, self.max_length, self.prefix_length)
        return build_prompt(self.prefix, kept)

    def record(self, frames: Tensor) -> Tensor:
        """Add a segment's generated frames (1 + nc, n) to the history.

        Returns:
            int64 (nc, n - 1) codes for the decoder: codebook rows, first frame dropped.
        """
        self.history.append(frames.cpu())
        return frames[1:, 1:]


# Unicode categories of control, format and separator (space, line, paragraph) characters.
_UNSPOKEN = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})


def _speakable(segment: str) -> bool:
    """Whether `segment` has a character outside `_UNSPOKEN`: text of only those is refused,
    not spoken as noise."""
    return any(unicodedata.category(c) not in _UNSPOKEN for c in segment)


def plan_long_text(
    tokenizer: FishTokenizer,
    num_codebooks: int,
    text: str,
    references: list[Reference],
    chunk_length: int,
    max_length: int = DEFAULT_MAX_LENGTH,
) -> LongTextPlan:
    """Split `text` and prepare the prompt prefix.

    Raises:
        ValueError: the text has nothing to speak after cleaning and splitting.
    """
    segments = split_text(text, chunk_length) if chunk_length > 0 else [text.strip()]
    segments = [s for s in segments if _speakable(s)]
    if not segments:
        raise ValueError("text is empty after cleaning: nothing to synthesize")
    prefix = reference_prefix(tokenizer, references, num_codebooks)
    budget = prefix_budget_length(tokenizer, references, num_codebooks)
    return LongTextPlan(tokenizer, num_codebooks, segments, prefix, budget, max_length)


def generate_long(
    plan: LongTextPlan, generate_segment: Callable[[Tensor, int], Tensor]
) -> Iterator[Tensor]:
    """Generate every segment in order and yield its decoder codes (nc, n_i).

    Args:
        plan: from `plan_long_text`.
        generate_segment: (prompt (1 + nc, T), segment index) -> frames (1 + nc, n).
    """
    for index in range(len(plan.segments)):
        prompt = plan.next_prompt(index)
        yield plan.record(generate_segment(prompt, index))
