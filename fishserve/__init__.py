"""fishserve: a batched, paged-KV inference server for the Fish Speech 1.5 TTS model."""

import os

# MKL may otherwise use fewer threads when the machine is busy, which changes the rounding of
# CPU matrix products from run to run; fixed threading keeps seeded CPU output reproducible.
os.environ.setdefault("MKL_DYNAMIC", "FALSE")

__version__ = "0.1.0"
