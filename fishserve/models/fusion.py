"""Kernel fusion of small elementwise chains on the GPU (torch.compile / inductor).

At batch 1 a decode step is thousands of tiny kernels (an RMSNorm alone is seven); launching
them costs more than their arithmetic. `gpu_fused` compiles a pure tensor function once, with
dynamic shapes, and uses the compiled version whenever its first argument lives on a CUDA
device; on the CPU (and with FISHSERVE_FUSION=0) the plain PyTorch function runs, so CPU
results, and the parity tests, are untouched. The math is the same; only the rounding order of
reductions inside a fused kernel can differ.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import TypeVar

import torch

log = logging.getLogger(__name__)
# One compiled graph per dtype and per size-1 specialisation; evaluation runs many dtypes.
RECOMPILE_LIMIT = 64

F = TypeVar("F", bound=Callable)


def fusion_enabled() -> bool:
    """False when FISHSERVE_FUSION=0 is set."""
    return os.environ.get("FISHSERVE_FUSION", "1") != "0"


def gpu_fused(fn: F) -> F:
    """Decorator: `torch.compile(fn, dynamic=True, fullgraph=True)` for CUDA inputs.

    The device is the first tensor argument's. Called while another function is being
    compiled, `fn` is traced inline (one graph, no nested compilation).
    """
    compiled: Callable | None = None
    failed = False

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal compiled, failed
        if torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if failed or not (first is not None and first.is_cuda and fusion_enabled()):
            return fn(*args, **kwargs)
        if compiled is None:
            torch._dynamo.config.recompile_limit = max(
                torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT
            )  # imported here: torch._dynamo costs ~1.5 s of start-up on CPU-only runs
            compiled = torch.compile(fn, dynamic=True, fullgraph=True)
        try:
            return compiled(*args, **kwargs)
        except Exception as exc:  # a compiler bug must not take the server down
            failed = True
            log.warning(
                "fusing %s failed (%s: %s); it runs unfused",
                fn.__name__,
                type(exc).__name__,
                str(exc).splitlines()[0][:200],
            )
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
