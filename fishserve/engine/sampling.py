"""Batched token sampling with the reference's semantics (spec §5) and counter-based noise.

One call samples a token for every row of a batch, each row with its own temperature, top-p,
repetition penalty and seed. The random draw is `argmax(p / q)` with q ~ Exponential(1) (an
exact categorical sample without a host synchronisation). Instead of a stateful generator per
request, q comes from a hash of (seed, counter, vocabulary index): the draw of a request never
depends on which other requests share the batch, on the batch order, or on the device
(integer hashing is exact everywhere), so seeded output is reproducible across batch sizes and
between the reference loop and the engine, up to the logits themselves: a matrix product can
round a row differently with another number of rows in the batch, and where two candidates'
scores nearly tie that can flip a code (measured on the CPU with the tiny fixture model: one
codebook entry in ~140 randomized runs of mixed arrivals).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch
from torch import Tensor

from fishserve.models.fusion import gpu_fused

# Spec §5: the penalty window spans the last 16 frames produced by the decode loop.
REPETITION_WINDOW = 16
# Spec §5: logits are divided by max(temperature, 1e-5); at or below it sampling is greedy.
MIN_TEMPERATURE = 1e-5
# The prefilter defers to the full sort when a cumulative mass at the cut lies this close to
# top_p: both compute the mass in float32 with different normalisers and summation orders,
# measured to differ by a few 1e-7; 1e-4 leaves a wide margin (prefix sums of ~1,000 terms).
CUT_TOLERANCE = 1e-4
_MASK32 = 0xFFFFFFFF
_GOLDEN32 = 0x9E3779B9


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings (defaults: the reference CLI's, spec §5).

    Attributes:
        temperature: > 0; at most 1e-5 means greedy.
        top_p: nucleus mass in (0, 1]; the token that crosses the threshold is dropped.
        repetition_penalty: > 0; 1.0 disables it. Applied over the last 16 frames.
        seed: 32-bit seed of the request's noise; None draws a random one per request.
    """

    temperature: float = 0.7
    top_p: float = 0.7
    repetition_penalty: float = 1.2
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    def resolved_seed(self) -> int:
        """The seed to use: `seed` masked to 32 bits, or a fresh random one."""
        return secrets.randbits(32) if self.seed is None else self.seed & _MASK32


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x * c) mod 2**32 for int64 x in [0, 2**32), without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: Tensor) -> Tensor:
    """MurmurHash3's 32-bit finaliser (fmix32) on int64 values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def noise_counter(segment: Tensor, frame: Tensor, slot: int) -> Tensor:
    """The noise stream of one draw: text segment, frame index within it, and slot.

    Works elementwise on int64 tensors (or plain ints). Slot 0 is the slow token, slot i
    (1 <= i < 16) codebook i; frames wrap after 2**20.
    """
    return (segment << 24) | ((frame & 0xFFFFF) << 4) | slot


def exponential_noise(seeds: Tensor, counters: Tensor, vocab: int) -> Tensor:
    """Exponential(1) samples from a hash of (seed, counter, index).

    A batch of one runs as two copies of its row: torch.compile specialises on a size of 1,
    and the first such call while serving (a lone row of the exact top-p fallback) compiled a
    new kernel for ~2 s on the H200 (docs/benchmarks.md §6.9). Rows are independent, so the
    values are the same.

    Args:
        seeds: int64 (B,) 32-bit seeds.
        counters: int64 (B,) draw counters (`noise_counter`).
        vocab: number of categories V.

    Returns:
        float32 (B, V), strictly positive.
    """
    if seeds.shape[0] == 1:
        return _exponential_noise(seeds.repeat(2), counters.repeat(2), vocab)[:1]
    return _exponential_noise(seeds, counters, vocab)


@gpu_fused
def _exponential_noise(seeds: Tensor, counters: Tensor, vocab: int) -> Tensor:
    ids = torch.arange(vocab, device=seeds.device)
    return _noise(seeds, counters, ids[None, :])


@gpu_fused
def exponential_noise_at(seeds: Tensor, counters: Tensor, ids: Tensor) -> Tensor:
    """`exponential_noise` at chosen indices only: ``exponential_noise(...).gather(1, ids)``.

    Args:
        seeds, counters: int64 (B,). ids: int64 (B, K) vocabulary indices.

    Returns:
        float32 (B, K), bit-identical to the gathered full-vocabulary noise.
    """
    return _noise(seeds, counters, ids)


def _noise(seeds: Tensor, counters: Tensor, ids: Tensor) -> Tensor:
    row = _mix32(_mix32(seeds & _MASK32) ^ (counters & _MASK32))
    index = _mix32(_mul32(ids, _GOLDEN32))
    return noise_from_bits(_mix32(row[:, None] ^ index))


def noise_from_bits(bits: Tensor) -> Tensor:
    """Exponential(1) values float32 from uniform 32-bit hashes (int64 in [0, 2**32)).

    23 random bits: (n + 0.5) / 2**23 is exact in float32 and lies strictly inside (0, 1), so
    the noise is never 0 (with 24 bits the top value rounds to 1.0: -log(1) = 0 would make an
    id outside the nucleus win the race as 0/0 = NaN, or an unlikely one as p/0 = inf).
    """
    uniform = ((bits >> 9).float() + 0.5) * (1.0 / (1 << 23))
    return -torch.log(uniform)


def apply_repetition_penalty(logits: Tensor, window: Tensor, penalty: Tensor) -> Tensor:
    """Penalise every id in the window once: l * rp if l < 0 else l / rp (spec §5, step 1).

    Args:
        logits: (B, V). window: int64 (B, W) ids. penalty: (B,).
    """
    scores = logits.gather(1, window)
    rp = penalty.to(logits.dtype)[:, None]
    scores = torch.where(scores < 0, scores * rp, scores / rp)
    return logits.scatter(1, window, scores)


def top_p_filter(logits: Tensor, top_p: Tensor) -> Tensor:
    """Mask (to -inf) ids outside the nucleus of the *unscaled* logits (spec §5, step 2).

    Sorted descending, an entry is removed when the cumulative probability including itself
    exceeds top_p; the most likely entry is always kept. top_p >= 1 keeps every entry (the
    float32 cumulative sum can round past 1.0, which must not drop the last one). The sort
    is stable: tied logits keep ascending id order, so which of them a cut keeps is defined
    (the lower ids) and `sample_prefiltered` can reproduce it.

    Args:
        logits: (B, V). top_p: (B,).
    """
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    limit = top_p.to(cumulative.dtype)[:, None]
    remove_sorted = (cumulative > limit) & (limit < 1.0)
    remove_sorted[:, 0] = False
    remove = torch.zeros_like(remove_sorted).scatter(1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def sample(
    logits: Tensor,
    temperature: Tensor,
    top_p: Tensor,
    penalty: Tensor,
    window: Tensor | None,
    noise: Tensor,
) -> Tensor:
    """Sample one id per row: penalty, top-p, temperature, exponential-race draw (spec §5).

    Args:
        logits: (B, V) float. Sampling runs in float32 whatever the model dtype (the
            reference samples in bf16/fp16, where logits / 1e-5 overflows fp16).
        temperature, top_p, penalty: (B,) per-row settings.
        window: int64 (B, W) ids to penalise, or None for no penalty.
        noise: float32 (B, V) Exponential(1) samples (`exponential_noise`).

    Returns:
        int64 (B,) sampled ids.
    """
    logits = logits.float()
    if window is not None:
        logits = apply_repetition_penalty(logits, window, penalty)
    logits = top_p_filter(logits, top_p)
    return _race(logits, temperature, noise)


def _race(logits: Tensor, temperature: Tensor, noise: Tensor) -> Tensor:
    """Index of argmax(softmax(logits / T) / noise) per row: the exponential-race draw."""
    scale = temperature.clamp(min=MIN_TEMPERATURE)[:, None]
    probs = torch.softmax(logits / scale, dim=-1)
    return torch.argmax(probs / noise, dim=-1)


def stable_descending(values: Tensor, ids: Tensor, vocab: int) -> tuple[Tensor, Tensor]:
    """Candidates in the order of a stable descending sort of their row: logit descending,
    tied logits by ascending id (`top_p_filter`'s order).

    Args:
        values: float32 (B, k) finite logits; ids: int64 (B, k) their distinct ids, < vocab.

    Returns:
        (values, ids) reordered, each (B, k).
    """
    bits = (values + 0.0).view(torch.int32)  # + 0.0: -0.0 becomes 0.0, one key for equals
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # IEEE float order as int32 order
    composite = key.to(torch.int64) * vocab + (vocab - 1 - ids)  # ties: the lower id first
    order = composite.argsort(dim=-1, descending=True)
    return values.gather(1, order), ids.gather(1, order)


def sample_prefiltered(
    logits: Tensor,
    temperature: Tensor,
    top_p: Tensor,
    penalty: Tensor,
    window: Tensor | None,
    seeds: Tensor,
    counters: Tensor,
    k: int,
) -> tuple[Tensor, Tensor]:
    """`sample` over the top-k candidates only, and where that is exact.

    Top-p keeps the most likely ids until their mass passes top_p. When the k most likely ids
    (`torch.topk`, no full sort) already hold more than top_p of the probability mass, the
    nucleus lies inside them and every other id would be removed anyway: sampling among the
    candidates (with the same hash noise at their indices) gives the token `sample` gives. Rows
    where the candidates hold at most top_p are flagged; the caller resamples those rows with
    `sample` (`fishserve.engine.frame.resample_rows_`). The mass of each candidate is
    ``exp(l - max) / sum(exp(l - max))``, the same probability `top_p_filter`'s softmax
    computes, up to float32 rounding of the sum; rows whose mass at the cut lies within
    `CUT_TOLERANCE` of top_p are flagged, as are rows whose nucleus may reach past the
    candidates (its last logit not above the smallest candidate's: an id left out could tie
    with it), rows whose last kept logit is zero (signed zeros may sort apart) and rows with
    top_p >= 1. The candidates are ordered as `top_p_filter`'s stable sort orders them
    (logit descending, tied logits by ascending id), so a tie across the cut is decided here
    too: with bf16 logits such ties are common (~9% of rows of Gaussian logits of std 8 over
    102,048 ids, all sent to the full sort before; docs/benchmarks.md §6.26).

    Args:
        logits: (B, V) float; temperature, top_p, penalty: (B,); window: int64 (B, W) or None.
        seeds, counters: int64 (B,) noise stream of the draw (`exponential_noise`).
        k: candidates per row, ``0 < k < V``.

    Returns:
        ``(token, exact)``: int64 (B,) sampled ids (valid where exact) and bool (B,).
    """
    logits = logits.float()
    if window is not None:
        logits = apply_repetition_penalty(logits, window, penalty)
    values, ids = torch.topk(logits, k, dim=-1, sorted=False)
    values, ids = stable_descending(values, ids, logits.shape[-1])  # (B, k)
    # softmax's arithmetic: shifted by the row's maximum, divided by the sum of exponentials
    # (a logsumexp of logits in the thousands rounds to a step larger than CUT_TOLERANCE)
    top = values[:, :1]
    mass = (torch.exp(values - top) / torch.exp(logits - top).sum(-1, keepdim=True)).cumsum(-1)
    limit = top_p.to(mass.dtype)[:, None]
    remove = mass > limit
    remove[:, 0] = False
    # Exact when the nucleus lies inside the candidates in the full sort's order (every id
    # left out has a logit below the last kept one, so it sorts after the nucleus), top_p < 1
    # (which keeps everything) and the cumulative mass on both sides of the cut is clear of
    # top_p by more than float32 rounding can move it (the full sort normalises differently).
    kept = (~remove).sum(dim=-1, keepdim=True)  # (B, 1), >= 1
    cut = kept.clamp(max=k - 1)
    last = values.gather(1, kept - 1)
    # A zero logit at the cut is left to the full sort: a sort may order -0.0 and +0.0 as
    # equal (ties by id) or not, depending on the device.
    inside = (last > values[:, -1:]) & (last != 0)
    near_cut = ((mass.gather(1, cut) - limit).abs() < CUT_TOLERANCE) | (
        (limit - mass.gather(1, kept - 1)).abs() < CUT_TOLERANCE
    )
    exact = inside & (limit < 1.0) & ~near_cut
    values = values.masked_fill(remove, float("-inf"))
    noise = exponential_noise_at(seeds, counters, ids)
    pick = _race(values, temperature, noise)
    return ids.gather(1, pick[:, None])[:, 0], exact[:, 0]
