"""The decoder's share of the memory budget (`runtime.decoder_workspace_bytes`)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fishserve.audio.streaming import ChunkPolicy
from fishserve.models.firefly import FireflyConfig
from fishserve.server.runtime import decoder_workspace_bytes


def released_stub() -> SimpleNamespace:
    """What the estimate reads of a decoder: config, dtype, parameters (none here)."""
    return SimpleNamespace(config=FireflyConfig.released(), dtype=torch.bfloat16, parameters=list)


def test_captured_graphs_add_their_kept_outputs() -> None:
    policy, decoder = ChunkPolicy(), released_stub()
    eager = decoder_workspace_bytes(decoder, policy, 8)  # type: ignore[arg-type]
    graphs = decoder_workspace_bytes(decoder, policy, 8, graphs=True)  # type: ignore[arg-type]
    # batch buckets 1..8 (36 rows) x frame buckets 16..80 (432 frames) x 2048 samples x 4 bytes
    assert graphs - eager == 36 * 432 * 2048 * 4 == 127_401_984


def test_longer_chunks_and_batches_cost_more() -> None:
    decoder = released_stub()
    base = decoder_workspace_bytes(decoder, ChunkPolicy(), 8, graphs=True)  # type: ignore[arg-type]
    longer = decoder_workspace_bytes(decoder, ChunkPolicy(chunk_frames=128), 8, graphs=True)  # type: ignore[arg-type]
    wider = decoder_workspace_bytes(decoder, ChunkPolicy(), 16, graphs=True)  # type: ignore[arg-type]
    assert base < longer and base < wider
