"""Stateful streaming decode (`fishserve.models.firefly.streaming`): chunk by chunk, each
causal layer continued from its last inputs, the waveform is the one-shot decode's."""

from __future__ import annotations

import pytest
import torch

from fishserve.models.firefly.streaming import StreamState, decode_chunk


def _codes(decoder, batch: int, frames: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    groups = decoder.config.n_groups
    return torch.randint(0, 1000, (batch, groups, frames), generator=generator)


@pytest.mark.parametrize("chunks", [[60], [10, 20, 1, 29], [1] * 12 + [48], [7] * 8 + [4]])
def test_chunks_decoded_in_turn_give_the_one_shot_waveform(tiny_decoder, chunks):
    codes = _codes(tiny_decoder, 2, sum(chunks))
    whole, _ = tiny_decoder.decode(codes, torch.full((2,), codes.shape[-1]))
    state, parts, start = StreamState(), [], 0
    for n in chunks:
        part = decode_chunk(tiny_decoder, codes[..., start : start + n], state)
        assert part.shape == (2, n * tiny_decoder.config.frame_samples)
        parts.append(part)
        start += n
    streamed = torch.cat(parts, dim=-1)
    assert state.frames == codes.shape[-1]
    torch.testing.assert_close(streamed, whole[:, 0], rtol=0, atol=2e-5)


def test_the_state_does_not_grow_with_the_stream(tiny_decoder):
    codes, state = _codes(tiny_decoder, 1, 40, seed=1), StreamState()
    decode_chunk(tiny_decoder, codes[..., :10], state)
    sizes = {key: tail.shape for key, tail in state.tails.items()}
    for start in range(10, 40, 10):
        decode_chunk(tiny_decoder, codes[..., start : start + 10], state)
    assert {key: tail.shape for key, tail in state.tails.items()} == sizes


def test_streams_of_a_batch_do_not_mix(tiny_decoder):
    codes = _codes(tiny_decoder, 3, 24, seed=2)
    together, alone = StreamState(), StreamState()
    batch = torch.cat(
        [decode_chunk(tiny_decoder, codes[..., i : i + 8], together) for i in range(0, 24, 8)],
        dim=-1,
    )
    single = torch.cat(
        [decode_chunk(tiny_decoder, codes[1:2, :, i : i + 8], alone) for i in range(0, 24, 8)],
        dim=-1,
    )
    torch.testing.assert_close(batch[1:2], single, rtol=0, atol=2e-5)


def test_bad_codes_are_refused(tiny_decoder):
    with pytest.raises(ValueError, match="codes must have shape"):
        decode_chunk(tiny_decoder, torch.zeros(1, 1, 5, dtype=torch.long), StreamState())
