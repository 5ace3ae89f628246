"""Stateful streaming decode (`fishserve.models.firefly.streaming`): chunk by chunk, each
causal layer continued from its last inputs, the waveform is the one-shot decode's."""

from __future__ import annotations

import pytest
import torch

from fishserve.models.firefly.streaming import StreamState, decode_chunk, decode_chunks


def _codes(decoder, batch: int, frames: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    groups = decoder.config.n_groups
    return torch.randint(0, 1000, (batch, groups, frames), generator=generator)


@pytest.mark.parametrize("chunks", [[60], [10, 20, 1, 29], [1] * 12 + [48], [7] * 8 + [4]])
def test_chunks_decoded_in_turn_give_the_one_shot_waveform(tiny_decoder, chunks):
    codes = _codes(tiny_decoder, 2, sum(chunks))
    whole, _ = tiny_decoder.decode(codes, torch.full((2,), codes.shape[-1]))
    states, parts, start = [StreamState(), StreamState()], [], 0
    for n in chunks:
        two = decode_chunks(
            tiny_decoder, codes[..., start : start + n], torch.tensor([n, n]), states
        )
        assert [p.shape for p in two] == [(n * tiny_decoder.config.frame_samples,)] * 2
        parts.append(torch.stack(two))
        start += n
    streamed = torch.cat(parts, dim=-1)
    assert [s.frames for s in states] == [codes.shape[-1]] * 2
    torch.testing.assert_close(streamed, whole[:, 0], rtol=0, atol=2e-5)


def test_the_state_does_not_grow_with_the_stream(tiny_decoder):
    codes, state = _codes(tiny_decoder, 1, 40, seed=1)[0], StreamState()
    decode_chunk(tiny_decoder, codes[:, :10], state)
    sizes = {key: tail.shape for key, tail in state.tails.items()}
    for start in range(10, 40, 10):
        decode_chunk(tiny_decoder, codes[:, start : start + 10], state)
    assert {key: tail.shape for key, tail in state.tails.items()} == sizes


def test_streams_with_chunks_of_unequal_lengths_share_a_call(tiny_decoder):
    """Three streams, each cut into its own chunk lengths, decoded in shared padded calls:
    each gets its own one-shot waveform (the padding never leaks into a stream's state)."""
    cuts = [[10, 20, 5, 25], [3, 30, 20, 7], [1, 1, 50, 8]]  # 60 frames each
    codes = _codes(tiny_decoder, 3, 60, seed=2)
    whole, _ = tiny_decoder.decode(codes, torch.full((3,), 60))
    states, parts, starts = [StreamState() for _ in cuts], [[], [], []], [0, 0, 0]
    for step in range(4):
        lengths = [cut[step] for cut in cuts]
        batch = torch.zeros(3, codes.shape[1], max(lengths), dtype=torch.long)
        for b, n in enumerate(lengths):
            batch[b, :, :n] = codes[b, :, starts[b] : starts[b] + n]
        for b, wav in enumerate(decode_chunks(tiny_decoder, batch, torch.tensor(lengths), states)):
            parts[b].append(wav)
            starts[b] += lengths[b]
    for b in range(3):
        torch.testing.assert_close(torch.cat(parts[b]), whole[b, 0], rtol=0, atol=2e-5)


@pytest.mark.parametrize(
    ("lengths", "states", "message"), [([0], 1, "lengths"), ([6], 1, "lengths"), ([5], 2, "state")]
)
def test_bad_lengths_or_states_are_refused(tiny_decoder, lengths, states, message):
    codes = _codes(tiny_decoder, 1, 5)
    with pytest.raises(ValueError, match=message):
        decode_chunks(tiny_decoder, codes, torch.tensor(lengths), [StreamState()] * states)


def test_bad_codes_are_refused(tiny_decoder):
    with pytest.raises(ValueError, match="codes must have shape"):
        decode_chunks(tiny_decoder, torch.zeros(1, 1, 5, dtype=torch.long), [5], [StreamState()])
