"""The serving process's garbage-collector settings: start-up objects frozen, pauses timed."""

from __future__ import annotations

import gc
import logging
import weakref

import pytest

from fishserve.server.gc_control import GcPauseLog, freeze_after_startup


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()


def test_freeze_moves_existing_objects_out_of_collections(unfrozen) -> None:
    keep = [[i] for i in range(1000)]  # tracked containers alive at "start-up"
    frozen = freeze_after_startup()
    assert frozen == gc.get_freeze_count() >= len(keep)
    tracked = {id(o) for o in gc.get_objects()}
    assert not any(id(o) in tracked for o in keep)  # frozen objects are not walked any more
    later = [1]
    assert id(later) in {id(o) for o in gc.get_objects()}  # new objects still are


def test_pause_log_times_collections_and_warns_on_slow_ones(caplog) -> None:
    pauses = GcPauseLog(slow_s=0.0).install()
    try:
        with caplog.at_level(logging.WARNING, logger="fishserve.server.gc_control"):
            gc.collect()
    finally:
        pauses.uninstall()
    assert pauses.pauses >= 1 and pauses.slow >= 1 and pauses.max_pause_s > 0
    assert "garbage collection of generation 2" in caplog.text
    before = pauses.pauses
    gc.collect()  # uninstalled: no longer timed
    assert pauses.pauses == before


def test_install_is_idempotent() -> None:
    pauses = GcPauseLog()
    pauses.install().install()
    try:
        assert gc.callbacks.count(pauses._callback) == 1
    finally:
        pauses.uninstall()
    assert pauses._callback not in gc.callbacks


def test_a_second_freeze_collects_what_the_first_froze_and_has_died(unfrozen) -> None:
    class Node:
        pass

    cycle = Node()
    cycle.self = cycle  # only the cycle collector can free it
    freeze_after_startup()  # frozen while alive (a model later unloaded)
    probe = weakref.ref(cycle)
    del cycle
    gc.collect()
    assert probe() is not None  # frozen: ordinary collections skip it
    freeze_after_startup()  # the next load
    assert probe() is None
