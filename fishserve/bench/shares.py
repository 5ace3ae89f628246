"""Load from several processes (`fishserve bench --processes N`).

One asyncio process reads every stream's chunks on one core: against a stand-in server on a
2-core machine it stayed clean at 640 streams but fell behind at 1,000 (send time p50 0.6 s,
event-loop lags of 0.3-0.6 s; docs/benchmarks.md §6.14). With N processes each level's load is
split into N shares: a closed-loop level of c streams into shares of c // N or c // N + 1
workers, a Poisson level of rate r into N processes of rate r / N (seeds differ per share),
and each level's requests likewise. Share k sends the level's requests k, k + N, k + 2N, ...,
so a request's text and seed are those of the one-process run. Start times are counted from
the parent's `clock_zero`: `time.perf_counter` is the system-wide monotonic clock on Linux and
macOS, so the processes' records line up.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING

import httpx

from fishserve.bench.client import RequestRecord, Target, open_clients, send_request
from fishserve.bench.load import DoneFn, LevelPlan, SendFn, run_closed_loop, run_poisson
from fishserve.bench.workload import request_body
from fishserve.server.gc_control import no_automatic_full_collections

if TYPE_CHECKING:
    from fishserve.bench.run import BenchOptions

__all__ = [
    "quiet_collector",
    "run_load",
    "run_share",
    "send_indexed",
    "share_counts",
    "share_plan",
    "share_pool",
]


def share_counts(total: int, parts: int) -> list[int]:
    """`total` split into `parts` whole shares that differ by at most one, larger first.

    Raises:
        ValueError: `parts` < 1 or `total` < 0.
    """
    if parts < 1 or total < 0:
        raise ValueError(f"cannot split {total} into {parts} shares")
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def share_plan(opts: BenchOptions, level: float, share: int, shares: int) -> LevelPlan:
    """Share `share` of `shares` of one level's load (module docstring)."""
    requests = share_counts(opts.requests_for(level), shares)[share]
    if opts.mode == "concurrency":
        workers = share_counts(int(level), shares)[share]
        return LevelPlan(workers, requests, opts.duration_s, opts.ramp_s)
    return LevelPlan(level / shares, requests, opts.duration_s, opts.ramp_s)


async def run_load(
    opts: BenchOptions,
    level: float,
    plan: LevelPlan,
    send: SendFn,
    done: DoneFn,
    share: int = 0,
    shares: int = 1,
) -> list[RequestRecord]:
    """Send share `share` of `shares` of a level (`plan`, from `share_plan`): a closed loop,
    or Poisson arrivals seeded by the level and the share; the records."""
    if opts.mode == "concurrency":
        return await run_closed_loop(plan, send, done)
    seed = opts.shape.seed + int(level * 1000) + share
    return await run_poisson(plan, send, done, seed, max(1, opts.max_inflight // shares))


def share_pool(processes: int) -> ProcessPoolExecutor:
    """Worker processes for the shares (spawned: no state of the parent's event loop)."""
    return ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"))


async def send_indexed(
    opts: BenchOptions,
    clients: list[httpx.AsyncClient],
    target: Target,
    level: float,
    index: int,
    clock_zero: float,
    t0: float | None,
) -> RequestRecord:
    """Request `index` of a level (its text and seed follow from the index), sent through
    client `index` mod their number."""
    item = opts.workload[index % len(opts.workload)]
    record = RequestRecord(index, level, item.category, 0.0, "pending")
    body = request_body(opts.shape, item, index)
    client = clients[index % len(clients)]
    return await send_request(client, target, body, record, clock_zero, t0)


def run_share(
    opts: BenchOptions, level: float, share: int, shares: int, clock_zero: float
) -> list[RequestRecord]:
    """A share process's work: its part of one level; the records of its requests.

    No full garbage collection runs during the level (`quiet_collector`)."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with quiet_collector():
        return asyncio.run(_run_share(opts, level, share, shares, clock_zero))


@contextlib.contextmanager
def quiet_collector() -> Iterator[None]:
    """Hold a load generator's full garbage collections off for a level, collect after it.

    A full collection holds the GIL while it walks every live object: in the load generator's
    processes at 350 streams each, 66-78 ms (docs/benchmarks.md §6.27), during which no chunk
    is read and every stream's arrival times are late by as much: a stall the server did not
    cause. What exists before the level is frozen (never walked); the younger generations are
    collected as usual during it, and everything after it. A process that froze objects
    already (a server's start-up freeze) keeps its freeze: nothing is frozen or unfrozen then.
    """
    ours = gc.get_freeze_count() == 0
    if ours:
        gc.collect()
        gc.freeze()
    try:
        with no_automatic_full_collections():
            yield
    finally:
        if ours:
            gc.unfreeze()
        gc.collect()


async def _run_share(
    opts: BenchOptions, level: float, share: int, shares: int, clock_zero: float
) -> list[RequestRecord]:
    plan = share_plan(opts, level, share, shares)
    if plan.num_requests == 0 or plan.level <= 0:
        return []
    closed = opts.mode == "concurrency"
    peak = int(plan.level) if closed else max(1, opts.max_inflight // shares)
    target = opts.target()
    async with contextlib.AsyncExitStack() as stack:
        clients = await open_clients(stack, peak, opts.timeout_s)

        async def send(local: int, t0: float | None) -> RequestRecord:
            index = local * shares + share
            return await send_indexed(opts, clients, target, level, index, clock_zero, t0)

        return await run_load(opts, level, plan, send, _ignore, share, shares)


def _ignore(record: RequestRecord) -> None:
    """Progress is the parent's: it counts a share's records when the share ends."""
