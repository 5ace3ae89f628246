"""Start-up warm-up of the engine's general prefill path.

A step with more positions than the runner's static rows (`ModelRunner.max_rows`: decode rows
plus `static_prefill_tokens`) runs its prompt chunks eagerly (`TorchPagedAttention`, the
fused elementwise ops of `fishserve.models.fusion` through torch.compile). Under load that
first happens when many requests arrive at once, e.g. a wave of new streams as a wave of
equal-length ones ends, and the first use of that path compiles kernels while every
request of the wave waits: on the H200 a level's TTFA p99 reached 5.9 s that way
(docs/benchmarks.md §6.7, run G64 at 256 streams). Running the path once at start-up moves
that cost out of the serving path.
"""

from __future__ import annotations

import logging
import time

from .engine import GenerationRequest, LLMEngine
from .sampling import SamplingParams

log = logging.getLogger(__name__)

__all__ = ["general_path_reachable", "warm_up_general_path"]

# Requests of the warm-up: two, so that the sampling rows are not a batch of one (which
# torch.compile and Triton specialise on).
_REQUESTS = 2
_WORD = "warm up "


def general_path_reachable(engine: LLMEngine) -> bool:
    """Whether a step can ever exceed the runner's static rows (else nothing to warm up): not
    when the scheduler's budget is capped at them (asynchronous scheduling)."""
    runner = engine.runner
    return runner.static_decode and engine.scheduler.config.max_num_batched_tokens > runner.max_rows


def warm_up_general_path(engine: LLMEngine) -> float:
    """Run one step through the general prefill path, then two decode steps; return seconds.

    Two synthetic requests (ignore_eos, 2 frames each) whose prompts together exceed
    `max_rows` positions are queued and stepped to completion (real-time admission, which
    would run them one at a time, is off meanwhile); the engine's and the runner's counters
    (steps, frames, full-sort rows, busy time) are restored afterwards, the admission gate's
    measurements cleared, and every KV block is free again. Call it on the engine
    thread before serving (nothing else may be queued). Returns 0.0 without doing anything when
    `general_path_reachable` is False or the prompts could not fit the model's context or the
    KV pool.

    Raises:
        RuntimeError: requests were already queued, or the warm-up did not finish.
    """
    if engine.has_work():
        raise RuntimeError("warm up the engine before it serves requests")
    if not general_path_reachable(engine):
        return 0.0
    target = engine.runner.max_rows // _REQUESTS + 1  # positions per prompt
    words = _words_for(engine, target)
    if words is None:
        log.info("general prefill path not warmed up: no prompt of %d+ positions fits", target)
        return 0.0
    start = time.perf_counter()
    steps, frames = engine.steps, engine.frames_generated
    runner_counters = engine.runner.counter_state()
    admission = engine.scheduler.admission  # off: it would run the prompts one at a time
    engine.scheduler.admission = None
    try:
        for i in range(_REQUESTS):
            engine.add_request(_request(words, f"warm-up-{i}"))
        for _ in range(64):  # 1-2 prefill steps, then one decode step
            engine.step()
            if not engine.has_work():
                break
        else:
            raise RuntimeError("the engine's warm-up requests did not finish in 64 steps")
    finally:
        engine.scheduler.admission = admission
    if engine.admission is not None:
        engine.admission.reset()  # its steps and frame counts are the warm-up's
    engine.runner.synchronize()
    engine.steps, engine.frames_generated = steps, frames
    engine.runner.restore_counters(runner_counters)
    return time.perf_counter() - start


def _request(words: int, request_id: str) -> GenerationRequest:
    return GenerationRequest(
        _WORD * words,
        params=SamplingParams(),
        chunk_length=0,
        max_new_tokens=2,
        ignore_eos=True,
        request_id=request_id,
    )


def _words_for(engine: LLMEngine, target: int) -> int | None:
    """The fewest words of warm-up text whose prompt has >= `target` positions, if that
    prompt still fits (the context and a share of the pool); else None. A binary search: a
    prompt's length grows with its words."""
    limit = min(
        engine.model.config.max_seq_len - 4,
        engine.pool_positions // _REQUESTS - 4,
    )
    if target > limit:
        return None
    low, high = 1, target  # every word is at least one position
    if _prompt_length(engine, high) < target:
        return None
    while low < high:
        middle = (low + high) // 2
        if _prompt_length(engine, middle) >= target:
            high = middle
        else:
            low = middle + 1
    return low if _prompt_length(engine, low) <= limit else None


def _prompt_length(engine: LLMEngine, words: int) -> int:
    """Prompt positions of a warm-up request of `words` words."""
    try:
        seq = engine.prepare(_request(words, "warm-up-probe"))
    except ValueError:  # PromptTooLongError / KVPoolTooSmallError are ValueErrors
        return 1 << 30
    return seq.num_positions
