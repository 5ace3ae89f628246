"""Upper bound of a decode step without its mid-step host round trip (measurement only).

A captured decode step waits between its halves until the engine thread has read which rows
the top-k prefilter could not decide and has resampled them (`CudaGraphDecoder.finish`).
This runs `fishserve bench-engine-load` (same arguments) with the codes graph queued right
behind the token graph and no resampling: the prefilter's token is kept even where it is not
exact, so the sampling is NOT the reference's for those rows (~10% with peaked dummy logits).
It bounds what removing the round trip could gain; it is not a serving mode.
"""

from __future__ import annotations

import sys

from fishserve.cli import app
from fishserve.engine import graph_decoder as gd

_launch, _finish = gd.CudaGraphDecoder.launch, gd.CudaGraphDecoder.finish


def launch(self, host, live=None, carry=None):
    launched = _launch(self, host, live, carry)
    launched.captured.codes_graph.replay()  # the second half at once, no host round trip
    launched.fused = True
    return launched


def finish(self, launched):
    if getattr(launched, "fused", False):
        return launched.captured.frames[: launched.live].clone()
    return _finish(self, launched)


gd.CudaGraphDecoder.launch, gd.CudaGraphDecoder.finish = launch, finish
sys.exit(app(["bench-engine-load", *sys.argv[1:]]))
