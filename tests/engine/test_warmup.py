"""Tests for fishserve.engine.warmup: the general prefill path runs once at start-up."""

from __future__ import annotations

import pytest
from conftest import make_engine, run_engine

from fishserve.engine.engine import GenerationRequest
from fishserve.engine.sampling import SamplingParams
from fishserve.engine.warmup import general_path_reachable, warm_up_general_path


def static_engine(model, tokenizer, **overrides):
    """An engine on the static path whose steps may exceed its static rows (4 + 8)."""
    settings = {
        "static_decode": True,
        "max_num_seqs": 4,
        "static_prefill_tokens": 8,
        "max_num_batched_tokens": 256,
        "num_kv_blocks": 128,
    }
    settings.update(overrides)
    return make_engine(model, tokenizer, **settings)


@pytest.mark.parametrize("admission", [0.0, 1e9], ids=["admission off", "admission on"])
def test_warm_up_runs_the_general_prefill_path_and_leaves_the_engine_as_it_was(
    tiny_model, tiny_tokenizer, monkeypatch, admission
) -> None:
    """Real-time admission (which would run the two prompts one at a time, never together
    through the general path) is off during the warm-up and forgets it afterwards."""
    engine = static_engine(tiny_model, tiny_tokenizer, min_stream_frame_rate=admission)
    prefills: list[int] = []
    general = engine.runner._prefill
    monkeypatch.setattr(
        engine.runner, "_prefill", lambda batch: prefills.append(batch.num_tokens) or general(batch)
    )
    free = engine.blocks.num_free
    assert general_path_reachable(engine)
    assert warm_up_general_path(engine) > 0
    assert prefills and max(prefills) > engine.runner.max_rows
    assert not engine.has_work()
    assert engine.blocks.num_free == free
    assert (engine.steps, engine.frames_generated) == (0, 0)
    assert (engine.runner.full_sort_rows, engine.runner.busy_seconds) == (0, 0.0)
    if admission:
        assert engine.scheduler.admission is not None
        assert engine.stats().admission_held == 0 and engine.admission.capacity == 1


def test_warm_up_finds_a_prompt_that_fits_a_small_pool(tiny_model, tiny_tokenizer) -> None:
    """100 positions of pool, 12 static rows: prompts of 7-46 positions fit; a first guess of
    one word per position overshot and the warm-up was skipped."""
    engine = static_engine(tiny_model, tiny_tokenizer, block_size=4, num_kv_blocks=25)
    assert engine.pool_positions == 100
    assert warm_up_general_path(engine) > 0
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_a_warmed_up_engine_generates_what_a_fresh_one_does(tiny_model, tiny_tokenizer) -> None:
    request = GenerationRequest(
        "hello world", params=SamplingParams(temperature=0.7, seed=3), max_new_tokens=12
    )
    fresh = run_engine(static_engine(tiny_model, tiny_tokenizer), [request])
    warmed_engine = static_engine(tiny_model, tiny_tokenizer)
    warm_up_general_path(warmed_engine)
    warmed = run_engine(warmed_engine, [request])
    assert warmed[request.request_id][0].tolist() == fresh[request.request_id][0].tolist()


def test_nothing_to_warm_up_when_every_step_fits_the_static_rows(
    tiny_model, tiny_tokenizer
) -> None:
    engine = static_engine(tiny_model, tiny_tokenizer, max_num_batched_tokens=12)
    assert not general_path_reachable(engine)
    assert warm_up_general_path(engine) == 0.0
    assert engine.steps == 0


def test_warm_up_is_refused_once_requests_are_queued(tiny_model, tiny_tokenizer) -> None:
    engine = static_engine(tiny_model, tiny_tokenizer)
    engine.add_request(GenerationRequest("hello", max_new_tokens=4))
    with pytest.raises(RuntimeError, match="before it serves"):
        warm_up_general_path(engine)


def test_a_slow_engine_step_is_logged(tiny_model, tiny_tokenizer, monkeypatch, caplog) -> None:
    import fishserve.engine.engine as module

    monkeypatch.setattr(module, "SLOW_STEP_S", 0.0)
    engine = make_engine(tiny_model, tiny_tokenizer)
    engine.add_request(GenerationRequest("hello", max_new_tokens=2))
    with caplog.at_level("DEBUG", logger=module.__name__):
        engine.step()
    (record,) = [r for r in caplog.records if "slow engine step" in r.getMessage()]
    assert "1 sequences" in record.getMessage()
    assert record.levelname == "DEBUG"  # on the CPU, where steps take seconds anyway
