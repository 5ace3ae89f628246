"""GpuTurns: busy parties alternate, a lone party never waits, nobody is inside at once."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from fishserve.engine.gpu_turns import GpuTurns


def test_busy_parties_alternate_and_never_overlap() -> None:
    turns, log, inside = GpuTurns(), [], []
    start = threading.Barrier(2)

    def party(name: str, rounds: int) -> None:
        start.wait()
        for _ in range(rounds):
            with turns.turn(name):
                inside.append(name)
                assert len(inside) == 1, inside  # alone on the GPU
                log.append(name)
                time.sleep(0.002)
                inside.pop()

    threads = [threading.Thread(target=party, args=(n, 20)) for n in ("engine", "decoder")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(log) == 40
    swaps = sum(a != b for a, b in itertools.pairwise(log))
    assert swaps >= 35, log  # strict alternation while both want the GPU (allowing start/end)
    assert turns.waited_seconds["engine"] > 0 and turns.waited_seconds["decoder"] > 0


def test_a_lone_party_takes_turns_back_to_back() -> None:
    turns = GpuTurns()
    done = threading.Event()

    def alone() -> None:
        for _ in range(100):
            with turns.turn("engine"):
                pass
        done.set()

    threading.Thread(target=alone, daemon=True).start()
    assert done.wait(5)  # would hang if it waited for a turn of a party that never comes


def test_a_waiting_party_gets_the_next_turn() -> None:
    turns = GpuTurns()
    order: list[str] = []
    waiting = threading.Event()

    def decoder() -> None:
        waiting.set()
        with turns.turn("decoder"):
            order.append("decoder")

    with turns.turn("engine"):
        thread = threading.Thread(target=decoder)
        thread.start()
        assert waiting.wait(5)
        time.sleep(0.05)  # the decoder is now blocked on the engine's turn
    with turns.turn("engine"):  # must come after the waiting decoder's turn
        order.append("engine")
    thread.join(5)
    assert order == ["decoder", "engine"]


def test_releasing_someone_elses_turn_is_an_error() -> None:
    turns = GpuTurns()
    turns._acquire("engine")
    with pytest.raises(RuntimeError, match="decoder released a turn held by engine"):
        turns._release("decoder")


def test_an_engine_step_holds_its_turn_until_its_device_work_is_done(
    tiny_model, tiny_tokenizer
) -> None:
    from contextlib import contextmanager

    from conftest import make_engine

    from fishserve.engine.engine import GenerationRequest

    engine = make_engine(tiny_model, tiny_tokenizer)
    order: list[str] = []

    @contextmanager
    def gpu_turn():
        order.append("enter")
        yield
        order.append("exit")

    engine.gpu_turn = gpu_turn
    engine.runner.synchronize = lambda: order.append("sync")  # type: ignore[method-assign]
    engine.add_request(GenerationRequest("Hi.", max_new_tokens=2, ignore_eos=True))
    while engine.has_work():
        engine.step()
    assert order and order == ["enter", "sync", "exit"] * (len(order) // 3)
