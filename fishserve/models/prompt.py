"""Prompt builder for Fish Speech 1.5 TTS: message encoding, references, history windowing.

Sources: spec §3.2 (message encoding), §3.3 (prompt layout), §6.2 (history windowing), §9.9-9.11.

Every prompt piece is an int64 tensor of shape ``(1 + num_codebooks, T)``: row 0 holds token ids,
rows ``1..num_codebooks`` hold codebook values, which are 0 at text/special positions (§2.2).
A message is ``<|im_start|>{role}\\n`` + parts + ``<|im_end|>``; each text part is tokenized on its
own (BPE never merges across parts), the header is its own part, and no newline separates
messages. The layout fed to the model for one chunk is::

    [system + reference turns, only when references exist] + [kept history] + [chunk user turn]

where the chunk user turn is the last item of the history list (see :func:`select_history`).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fishserve.models.special_tokens import IM_START, NUM_SEMANTIC_TOKENS, VOICE
from fishserve.models.text import clean_text
from fishserve.models.tokenizer import FishTokenizer

SYSTEM_PROMPT = "Speak out the provided text."
"""System message text, sent only when references are given (spec §3.3, §9.10)."""

HISTORY_RESERVE = 1024
"""Tokens the history budget keeps free for generation: budget = max_length - 1024 - prefix."""

MessagePart = str | torch.Tensor


@dataclass(frozen=True, eq=False)
class Reference:
    """A voice reference (spec §3.3).

    Attributes:
        codes: integer tensor ``(num_codebooks_or_more, T)`` of codebook values in ``[0, 1024)``
            (encoder output); rows past ``num_codebooks`` are ignored.
        text: the transcript of the reference audio (cleaned when encoded).
    """

    codes: torch.Tensor
    text: str


def text_columns(ids: Sequence[int], num_codebooks: int) -> torch.Tensor:
    """Columns for text/special token ids: int64 ``(1 + num_codebooks, len(ids))``, codes 0 (§2.2).

    Raises:
        ValueError: ``num_codebooks < 1``.
    """
    return torch.from_numpy(_text_array(ids, num_codebooks))


def _text_array(ids: Sequence[int], num_codebooks: int) -> np.ndarray:
    """`text_columns` as a NumPy int64 ``(1 + num_codebooks, len(ids))`` array.

    Prompts are built in NumPy and turned into a tensor once: every PyTorch call releases and
    re-acquires the GIL, which in the engine's process costs ~0.5 ms under load
    (docs/benchmarks.md §6.15, §6.27), and a request's prompt took ~30 of them.
    """
    _check_num_codebooks(num_codebooks)
    columns = np.zeros((1 + num_codebooks, len(ids)), dtype=np.int64)
    columns[0] = ids
    return columns


def frames_to_columns(
    frames: torch.Tensor, semantic_begin_id: int, *, codebook_size: int = NUM_SEMANTIC_TOKENS
) -> torch.Tensor:
    """Turn audio code frames into prompt columns (a VQ part, spec §3.2).

    Args:
        frames: integer tensor ``(nc, n)`` of codebook values in ``[0, codebook_size)``.
        semantic_begin_id: id of ``<|semantic:0|>``.
        codebook_size: exclusive upper bound of the code values (1024 semantic tokens).

    Returns:
        int64 ``(1 + nc, n)``: row 0 = ``semantic_begin_id + frames[0]``, rows 1.. = ``frames``
        (codebook 0 appears twice, §2.2).

    Raises:
        ValueError: ``frames`` is not a 2-D integer tensor with at least one row, or a code is out
            of range.
    """
    if frames.ndim != 2 or frames.shape[0] < 1 or frames.is_floating_point():
        raise ValueError(f"frames must be a 2-D integer tensor (nc, n), got {tuple(frames.shape)}")
    frames = frames.to(torch.long)
    if frames.numel() and (frames.min() < 0 or frames.max() >= codebook_size):
        raise ValueError(f"codes must lie in [0, {codebook_size})")
    return torch.cat([frames[:1] + semantic_begin_id, frames], dim=0)


def encode_message(
    tokenizer: FishTokenizer,
    role: str,
    parts: Sequence[MessagePart],
    num_codebooks: int,
    *,
    add_end: bool = True,
) -> torch.Tensor:
    """Encode one chat message (spec §3.2).

    The header ``<|im_start|>{role}\\n`` and every ``str`` part are tokenized separately (special
    tokens inside them are live); every tensor part ``(>= num_codebooks, n)`` becomes ``n`` semantic
    columns from its first ``num_codebooks`` rows. ``<|im_end|>`` is appended when ``add_end``.

    Returns:
        int64 ``(1 + num_codebooks, T)``.

    Raises:
        ValueError: a tensor part has fewer than ``num_codebooks`` rows or bad codes.
    """
    return torch.from_numpy(_message_array(tokenizer, role, parts, num_codebooks, add_end))


def _message_array(
    tokenizer: FishTokenizer,
    role: str,
    parts: Sequence[MessagePart],
    num_codebooks: int,
    add_end: bool = True,
) -> np.ndarray:
    """`encode_message` as a NumPy int64 array (see `_text_array` for why NumPy)."""
    pieces = [_text_array(tokenizer.encode(f"{IM_START}{role}\n"), num_codebooks)]
    for part in parts:
        pieces.append(_part_array(tokenizer, part, num_codebooks))
    if add_end:
        pieces.append(_text_array([tokenizer.im_end_id], num_codebooks))
    return np.concatenate(pieces, axis=1)


def _part_array(tokenizer: FishTokenizer, part: MessagePart, num_codebooks: int) -> np.ndarray:
    if isinstance(part, str):
        return _text_array(tokenizer.encode(part), num_codebooks)
    if part.ndim != 2 or part.shape[0] < num_codebooks:
        raise ValueError(f"codes must have shape (>= {num_codebooks}, T), got {tuple(part.shape)}")
    return frames_to_columns(part[:num_codebooks], tokenizer.semantic_begin_id).numpy()


def system_message(tokenizer: FishTokenizer, num_codebooks: int) -> torch.Tensor:
    """``<|im_start|>system\\nSpeak out the provided text.<|im_end|>`` (§3.3), int64 (1+nc, T).

    Encoded once per tokenizer and `num_codebooks` (every request needs at least its length);
    each call returns a new tensor.
    """
    return torch.from_numpy(_system_array(tokenizer, num_codebooks).copy())


def _system_array(tokenizer: FishTokenizer, num_codebooks: int) -> np.ndarray:
    """The system message's columns, read-only and shared by every caller; encoded once per
    tokenizer (held weakly: a tokenizer of an unloaded model is freed with it) and
    `num_codebooks`."""
    per_tokenizer = _SYSTEM.get(tokenizer)
    if per_tokenizer is None:
        per_tokenizer = _SYSTEM.setdefault(tokenizer, {})
    array = per_tokenizer.get(num_codebooks)
    if array is None:
        owner = _message_array(tokenizer, "system", [SYSTEM_PROMPT], num_codebooks)
        owner.flags.writeable = False
        array = owner[:]  # a view of a read-only array cannot be made writeable again
        per_tokenizer[num_codebooks] = array
    return array


_SYSTEM: weakref.WeakKeyDictionary[FishTokenizer, dict[int, np.ndarray]] = (
    weakref.WeakKeyDictionary()
)


def reference_turn(
    tokenizer: FishTokenizer, reference: Reference, num_codebooks: int
) -> torch.Tensor:
    """One reference: user turn with its cleaned text + assistant voice turn with its codes.

    ``<|im_start|>user\\n{clean(text)}<|im_end|><|im_start|>assistant\\n<|voice|>{codes}<|im_end|>``
    (spec §3.3); codes are cut to their first ``num_codebooks`` rows.

    Returns:
        int64 ``(1 + num_codebooks, T)``.

    Raises:
        ValueError: ``reference.codes`` is not ``(>= num_codebooks, T)`` with codes in [0, 1024).
    """
    user = _message_array(tokenizer, "user", [clean_text(reference.text)], num_codebooks)
    voice = _message_array(tokenizer, "assistant", [VOICE, reference.codes], num_codebooks)
    return torch.from_numpy(np.concatenate([user, voice], axis=1))


def reference_prefix(
    tokenizer: FishTokenizer, references: Sequence[Reference], num_codebooks: int
) -> torch.Tensor:
    """The fixed prompt prefix: system message + every reference turn (spec §3.3).

    Returns:
        int64 ``(1 + num_codebooks, T)``; an empty ``(1 + num_codebooks, 0)`` tensor when there
        are no references (the system message is then not sent, §9.10).

    Raises:
        ValueError: a reference's codes have a bad shape or values; ``num_codebooks < 1``.
    """
    if not references:
        return torch.from_numpy(_text_array([], num_codebooks))
    pieces = [system_message(tokenizer, num_codebooks)]
    pieces += [reference_turn(tokenizer, ref, num_codebooks) for ref in references]
    return torch.cat(pieces, dim=1)


def prefix_budget_length(
    tokenizer: FishTokenizer, references: Sequence[Reference], num_codebooks: int
) -> int:
    """Length the history budget subtracts: system message + all reference turns (spec §6.2).

    The system message is counted even when it is not sent (no references), as in the reference.

    Raises:
        ValueError: as :func:`reference_prefix`.
    """
    length = _system_array(tokenizer, num_codebooks).shape[1]
    return length + sum(reference_turn(tokenizer, r, num_codebooks).shape[1] for r in references)


def user_turn(tokenizer: FishTokenizer, text: str, num_codebooks: int) -> torch.Tensor:
    """The turn for one text chunk, after which the model speaks (spec §3.3).

    ``<|im_start|>user\\n{clean(text)}<|im_end|><|im_start|>assistant\\n<|voice|>`` (no final
    ``<|im_end|>``). Special tokens typed inside ``text`` are live, as in the reference (§9.9).

    Returns:
        int64 ``(1 + num_codebooks, T)`` with zero codebook rows.

    Raises:
        TypeError: ``text`` is not a ``str``.
        ValueError: ``num_codebooks < 1``.
    """
    user = _message_array(tokenizer, "user", [clean_text(text)], num_codebooks)
    assistant = _message_array(tokenizer, "assistant", [VOICE], num_codebooks, add_end=False)
    return torch.from_numpy(np.concatenate([user, assistant], axis=1))


def select_history_indices(
    lengths: Sequence[int], max_length: int, prefix_length: int, *, exact_reference: bool = True
) -> list[int]:
    """Indices of the history items to keep; see :func:`select_history` for the rule (§6.2).

    Raises:
        ValueError: ``lengths`` is empty.
    """
    if not lengths:
        raise ValueError("history must contain at least the current chunk's user turn")
    budget = max_length - HISTORY_RESERVE - prefix_length
    count = 0
    i = len(lengths) - 1  # value left by a walk that never stops early
    for k, length in enumerate(reversed(lengths)):
        count += length
        if count + length > budget:  # the newest-so-far item is counted twice (reference)
            i = k
            break
    if i != 0 and i % 2 == 0:
        i -= 1
    n = len(lengths)
    if i >= n - 2:
        return list(range(n))
    if i == 0:  # Python's h[-0:] is the whole list: the reference repeats h[0], h[1]
        return [0, 1, *range(n)] if exact_reference else [0, 1, n - 1]
    return [0, 1, *range(n - i, n)]


def select_history(
    history: Sequence[torch.Tensor],
    max_length: int,
    prefix_length: int,
    *,
    exact_reference: bool = True,
) -> list[torch.Tensor]:
    """Window the history list H before each chunk, exactly as the reference (spec §6.2, §9.11).

    H alternates ``[user_0, gen_0, user_1, gen_1, ..., user_k]``: the user turns of the chunks
    and the frames generated for them (all of them, im_end frame included); the newest item is
    the current chunk's user turn. With ``budget = max_length - 1024 - prefix_length``:

    1. walk H from the newest item backwards (k = 0, 1, ...), adding each length to ``count``,
       and stop at the first k where ``count + length_k > budget``. ``count`` already includes
       ``length_k``, so the item that is being tested counts twice; if the walk never stops,
       k ends at ``len(H) - 1``. Call the result i.
    2. if i is even and non-zero, decrement it (an odd suffix starts at a user turn).
    3. if ``i < len(H) - 2`` keep ``H[0], H[1]`` (first chunk and its audio, "to avoid drift")
       plus the last i items; otherwise keep all of H.

    Quirk: when i = 0 (the newest item alone exceeds the budget) and ``len(H) > 2``, the
    reference's ``H[-0:]`` is the whole list, so it sends ``H[0], H[1], *H`` (H[0] and H[1] twice).
    ``exact_reference=True`` reproduces that; ``False`` keeps ``H[0], H[1], H[-1]`` instead.

    Worked example: lengths ``[10, 20, 5, 8, 6, 7, 4]``, ``max_length=1046``,
    ``prefix_length=0``, so budget = 22. Walk: k=0 (len 4): count 4, 4+4=8 <= 22; k=1 (len 7):
    count 11, 18 <= 22; k=2 (len 6): count 17, 17+6=23 > 22, stop at i=2. 2 is even: i=1.
    1 < 7-2, so keep H[0], H[1], H[6] -> lengths ``[10, 20, 4]``. With ``max_length=1054``
    (budget 30) the walk stops at k=3 (count 25, 33 > 30), i=3 stays odd, and the kept lengths
    are ``[10, 20, 6, 7, 4]``.

    Args:
        history: tensors ``(1 + nc, T_j)``; only ``shape[1]`` is read.
        max_length: the reference's ``max_length`` (the model context, e.g. 2048).
        prefix_length: :func:`prefix_budget_length` of the request.
        exact_reference: see the quirk above.

    Returns:
        The kept items (same tensor objects), in prompt order.

    Raises:
        ValueError: ``history`` is empty.
    """
    lengths = [int(item.shape[1]) for item in history]
    keep = select_history_indices(
        lengths, max_length, prefix_length, exact_reference=exact_reference
    )
    return [history[j] for j in keep]


def build_prompt(prefix: torch.Tensor, kept_history: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate the prefix and the kept history along time (spec §3.3, §6.2).

    Args:
        prefix: ``(1 + nc, P)`` from :func:`reference_prefix` (may have P = 0).
        kept_history: tensors ``(1 + nc, T_j)`` from :func:`select_history`.

    Returns:
        int64 ``(1 + nc, P + sum(T_j))``.

    Raises:
        ValueError: the row counts differ or a piece is not 2-D.
    """
    pieces = [prefix, *kept_history]
    rows = {p.shape[0] if p.ndim == 2 else -1 for p in pieces}
    if len(rows) != 1 or -1 in rows:
        raise ValueError(
            f"prompt pieces must be 2-D with equal rows, got {[p.shape for p in pieces]}"
        )
    if len(pieces) > 1 and all(p.dtype == torch.long for p in pieces):  # no casts to call
        return torch.cat(pieces, dim=1)
    return torch.cat([p.to(torch.long) for p in pieces], dim=1)


def _check_num_codebooks(num_codebooks: int) -> None:
    if num_codebooks < 1:
        raise ValueError(f"num_codebooks must be >= 1, got {num_codebooks}")
