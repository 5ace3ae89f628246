"""Seeded, fixed-length generation of one request through the engine (batch 1).

The request is one text segment (`chunk_length=0`) with `ignore_eos`, so every configuration
generates exactly the same number of frames and the decoded audio has the same length.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fishserve.engine.engine import GenerationRequest, LLMEngine
from fishserve.engine.long_text import plan_long_text
from fishserve.engine.sampling import SamplingParams


@dataclass(frozen=True)
class Prompt:
    """One evaluation request.

    Attributes:
        name: "short" or "long".
        text: what is spoken.
        frames: audio frames to generate (the engine adds the first, non-audio frame).
    """

    name: str
    text: str
    frames: int


@dataclass
class Generation:
    """What one request produced.

    Attributes:
        prompt: int64 (1 + nc, P) prompt columns (CPU).
        codes: int64 (nc, n) audio codes (CPU).
        engine_frames: frames the engine sampled (n + 1: the first is not audio).
        seconds: wall time of the generation (device synchronized).
    """

    prompt: Tensor
    codes: Tensor
    engine_frames: int
    seconds: float


def prompt_columns(engine: LLMEngine, text: str) -> Tensor:
    """The prompt the engine builds for `text` as one segment without references."""
    nc = engine.model.config.num_codebooks
    return plan_long_text(engine.tokenizer, nc, text, [], 0).next_prompt(0)


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def generate(engine: LLMEngine, prompt: Prompt, seed: int, params: SamplingParams) -> Generation:
    """Generate `prompt.frames` audio frames with `seed`.

    Raises:
        RuntimeError: the engine reported an error for the request.
    """
    params = SamplingParams(params.temperature, params.top_p, params.repetition_penalty, seed)
    request = GenerationRequest(
        prompt.text, [], params, chunk_length=0, max_new_tokens=prompt.frames + 1, ignore_eos=True
    )
    synchronize(engine.device)
    start = time.perf_counter()
    engine.add_request(request)
    frames: list[np.ndarray] = []
    while engine.has_work():
        for event in engine.step():
            if event.codes is not None:
                frames.append(event.codes)
            if event.finished and event.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"generation failed: {event.error or event.finish_reason}")
    synchronize(engine.device)
    seconds = time.perf_counter() - start
    nc = engine.model.config.num_codebooks
    codes = torch.zeros(nc, 0, dtype=torch.long)
    if frames:
        codes = torch.from_numpy(np.stack(frames, 1))
    return Generation(prompt_columns(engine, prompt.text), codes, len(frames) + 1, seconds)
