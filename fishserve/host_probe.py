"""How fast this machine's CPU runs a server's kind of host work: a fixed probe, timed.

Under load the engine's process is host-bound in part (scheduling, step inputs, frame
bookkeeping, the decoder thread's planning: Python and small NumPy operations, one core), so
capacity depends on the host as well as the GPU (docs/benchmarks.md §6.25: the same code
served far fewer streams on other leases of the same GPU). The server's `/health` (taken at
start-up), `fishserve bench` and `bench-engine-load` record this probe so that runs on
different machines can be told apart: a higher `host_probe_ms` means a slower host.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass
class _Row:
    slot: int
    frames: int
    budget: int


def _workload(rows: list[_Row], table: np.ndarray) -> int:
    """One round: attribute reads into arrays, a gather, small per-row NumPy writes."""
    slots = np.fromiter((r.slot for r in rows), np.int64, len(rows))
    frames = np.fromiter((r.frames for r in rows), np.int64, len(rows))
    gathered = table[slots]
    for i, r in enumerate(rows):
        r.frames += 1
        gathered[i, r.frames % gathered.shape[1]] = i
    return int(frames.sum() + gathered[:, 0].sum())


def host_probe_ms(rounds: int = 40, repeats: int = 5) -> float:
    """Milliseconds (fastest of `repeats`) of `rounds` rounds of a fixed host workload over
    512 rows (single-threaded Python and NumPy; about 9 ms in all on the development CPU).

    Raises:
        ValueError: rounds or repeats < 1.
    """
    if rounds < 1 or repeats < 1:
        raise ValueError(f"rounds and repeats must be >= 1, got {rounds}, {repeats}")
    rows = [_Row(i, 0, 216) for i in range(512)]
    table = np.zeros((1024, 16), dtype=np.int64)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(rounds):
            _workload(rows, table)
        best = min(best, time.perf_counter() - start)
    return best * 1e3
