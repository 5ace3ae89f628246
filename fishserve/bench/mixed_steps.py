"""Engine step time when new prompts keep arriving: pure decode steps vs mixed steps.

In a server, requests arrive while others decode, so most steps mix decode rows with the
prefill of a new prompt. For each batch size B: B requests with ~40-position prompts are
brought to decode, then steps are timed with 0, 1 and 4 new requests (same short prompt)
added before each step. Full-size architecture with random weights (bf16, KV bf16); no HTTP,
no audio decoder.

Run on a GPU: ``python -m fishserve.bench.mixed_steps --batch-sizes 128,384``. It prints one
JSON line per batch size: median and mean ms per step for "decode", "mixed1", "mixed4" and
"after" (the decode steps after the arrivals). `run` also works on CPU (tests).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch

from fishserve.bench.engine_speed import fill_decode, fixed_request, prompt_text
from fishserve.bench.options import parse_sizes
from fishserve.engine.engine import EngineConfig, LLMEngine
from fishserve.models.loading import load_text2semantic

EXTRA_SEQS = 80  # room for the arriving requests
PROMPT_POSITIONS = 40


def _sync(engine: LLMEngine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def timed_steps(engine: LLMEngine, steps: int, arrivals: int, text: str, ids) -> dict:
    """Median and mean ms of `steps` steps, each after `arrivals` new requests."""
    times = []
    for i in range(steps):
        for _ in range(arrivals):
            engine.add_request(fixed_request(text, i, 100, f"a{next(ids)}"))
        _sync(engine)
        start = time.perf_counter()
        engine.step()
        _sync(engine)
        times.append(time.perf_counter() - start)
    times.sort()
    return {"median_ms": 1e3 * times[len(times) // 2], "mean_ms": 1e3 * sum(times) / len(times)}


def run(batch: int, model, tokenizer) -> dict:
    """All four measurements at one batch size."""
    config = EngineConfig(
        kv_cache_dtype="bf16",
        block_size=16,
        max_num_seqs=batch + EXTRA_SEQS,
        max_num_batched_tokens=8192,
        num_kv_blocks=(batch + EXTRA_SEQS) * 12,
        decoder_workspace_bytes=0,
        top_k_prefilter=1024,
    )
    engine = LLMEngine(model, tokenizer, config)
    text, ids = prompt_text(tokenizer, PROMPT_POSITIONS), itertools.count()
    fill_decode(engine, batch, text, 120)
    timed_steps(engine, 3, 0, text, ids)  # warm-up
    timed_steps(engine, 3, 1, text, ids)
    return {
        "decode": timed_steps(engine, 20, 0, text, ids),
        "mixed1": timed_steps(engine, 20, 1, text, ids),
        "mixed4": timed_steps(engine, 8, 4, text, ids),
        "after": timed_steps(engine, 10, 0, text, ids),
    }


def main() -> None:
    """Command line entry (needs a CUDA device)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="128,384")
    args = parser.parse_args()
    try:
        batches = parse_sizes(args.batch_sizes, "--batch-sizes")
    except ValueError as exc:
        parser.error(str(exc))
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA device")
    model, tokenizer = load_text2semantic(
        None, device=torch.device("cuda"), dtype=torch.bfloat16, load_format="dummy"
    )
    for batch in batches:
        print(json.dumps({"batch": batch, **run(batch, model, tokenizer)}), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
