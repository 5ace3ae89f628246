"""The serving process's garbage-collector settings: start-up objects frozen, pauses timed."""

from __future__ import annotations

import gc
import logging
import time
import weakref

import pytest

from fishserve.server.gc_control import (
    FULL_COLLECTIONS,
    MIN_IDLE_GAP_S,
    NO_AUTO_FULL,
    DeferredFullCollections,
    GcPauseLog,
    freeze_after_startup,
    no_automatic_full_collections,
)


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


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    yield saved
    gc.set_threshold(*saved)


class _Node:
    self: _Node


def _old_cycle() -> weakref.ref:
    """A reference cycle that reached the oldest generation, then became unreachable (only a
    full collection frees it); its weak reference."""
    node = _Node()
    node.self = node
    gc.collect(1)  # survives into the oldest generation
    return weakref.ref(node)


def test_no_automatic_full_collections_holds_off_generation_2_and_restores(thresholds) -> None:
    with no_automatic_full_collections():
        assert gc.get_threshold()[:2] == thresholds[:2]
        assert gc.get_threshold()[2] == NO_AUTO_FULL
    assert gc.get_threshold() == thresholds


def test_deferred_collections_hold_off_cpython_and_give_it_back(thresholds) -> None:
    full = DeferredFullCollections(poll_s=60)
    full.start(lambda: False, max_interval_s=600)
    try:
        assert full.active and gc.get_threshold()[2] == NO_AUTO_FULL
        full.start(lambda: True, max_interval_s=300)  # again: new settings, one thread
        assert full.max_interval_s == 300 and gc.get_threshold()[2] == NO_AUTO_FULL
    finally:
        full.stop()
    assert not full.active and gc.get_threshold() == thresholds
    full.start(lambda: True, max_interval_s=0)  # 0: CPython's own collections
    assert not full.active and gc.get_threshold() == thresholds


def test_a_full_collection_is_due_when_idle_after_the_gap_or_after_the_interval(
    thresholds,
) -> None:
    idle = [False]
    full = DeferredFullCollections(poll_s=60, min_idle_gap_s=30)
    full.start(lambda: idle[0], max_interval_s=600)
    try:
        t0 = full.last
        gc.collect(1)  # something may have reached the oldest generation
        assert not full.due(t0 + 100)  # busy, before the interval
        idle[0] = True
        assert not full.due(t0 + 10)  # idle, but within the gap
        assert full.due(t0 + 100)  # idle after the gap
        idle[0] = False
        assert full.due(t0 + 601)  # busy, but the interval has passed
    finally:
        full.stop()


def test_an_idle_check_that_raises_counts_as_busy(thresholds) -> None:
    def broken() -> bool:
        raise RuntimeError("runtime gone")

    full = DeferredFullCollections(poll_s=60, min_idle_gap_s=0)
    full.start(broken, max_interval_s=600)
    try:
        gc.collect(1)
        assert not full.due(full.last + 1)
    finally:
        full.stop()


def test_the_collector_thread_frees_old_cycles_when_the_process_is_idle(thresholds) -> None:
    full = DeferredFullCollections(poll_s=0.01, min_idle_gap_s=0)
    gc.disable()  # only explicit collections from here: the thread's, and the one below
    try:
        full.start(lambda: False, max_interval_s=600)
        probe = _old_cycle()
        gc.collect(1)  # a younger collection does not free it
        assert probe() is not None
        time.sleep(0.1)  # busy: the thread leaves it alone
        assert probe() is not None and full.collections == 0
        full.start(lambda: True, max_interval_s=600)  # now idle
        for _ in range(500):
            if full.collections:
                break
            time.sleep(0.01)
        assert full.collections >= 1 and probe() is None
    finally:
        full.stop()
        gc.enable()


def test_a_stopped_collector_keeps_nothing_of_the_server_alive(thresholds) -> None:
    class Server:
        def idle(self) -> bool:
            return False

    full = DeferredFullCollections(poll_s=60)
    server = Server()
    probe = weakref.ref(server)
    full.start(server.idle, max_interval_s=600)
    try:
        del server  # held weakly even while started: a runtime dropped without shutdown
        gc.collect()
        assert probe() is None
        gc.collect(1)
        assert full.due(full.last + MIN_IDLE_GAP_S + 1)  # its server is gone: idle
    finally:
        full.stop()
    kept = Server()
    full.start(kept.idle, max_interval_s=600)
    full.stop()
    probe = weakref.ref(kept)
    del kept
    gc.collect()
    assert probe() is None


def test_full_collections_held_off_twice_come_back_once_both_end(thresholds) -> None:
    try:
        with no_automatic_full_collections():  # a level of the load generator...
            FULL_COLLECTIONS.start(lambda: False, max_interval_s=600)  # ...and a server
        assert gc.get_threshold()[2] == NO_AUTO_FULL  # still held off: the collector is on
    finally:
        FULL_COLLECTIONS.stop()
    assert gc.get_threshold() == thresholds
