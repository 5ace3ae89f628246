"""Tests for fishserve.audio.streaming: streaming decode equals one-shot decode, bounded memory.

Measured on the tiny fixture decoder (CPU fp32, 2 threads, torch 2.13), 200 random frames pushed
one at a time, default left context (25 frames):

    policy (first, max chunk, growth)   max |stream - one-shot|   SNR
    (1, 7, 2.0)                         5.1e-8                    130.7 dB
    (4, 16, 1.0)                        5.1e-8                    130.7 dB
    (10, 64, 2.0)  default              5.1e-8                    131.2 dB
    (10, 32, 1e9)                       4.8e-8                    131.3 dB

i.e. float32 rounding only. Asserted: max abs <= 1e-6 and SNR >= 100 dB. With less left context
(default policy otherwise): 20 frames 5.2e-8 / 131.3 dB (frames 20-24 back still matter, but
below float32 resolution), 16 frames 4.1e-6 / 108 dB, 8 frames 2.6e-3 / 52 dB, none 0.06 / 20 dB.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import RecordingDecoder, one_shot, random_codes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fishserve.audio.streaming import ChunkPolicy, StreamingDecoder, receptive_field_frames
from fishserve.models.firefly import FireflyConfig, FireflyGenerator

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_decoder"
MAX_ABS_TOL = 1e-6  # measured ~5e-8
MIN_SNR_DB = 100.0  # measured ~131 dB
FRAMES = 200


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """``10 log10(sum(ref^2) / sum((test - ref)^2))`` in dB (inf when identical)."""
    noise = float(np.sum((test.astype(np.float64) - reference) ** 2))
    signal = float(np.sum(reference.astype(np.float64) ** 2))
    return float("inf") if noise == 0 else float(10 * np.log10(signal / noise))


def stream_all(
    decoder, codes: np.ndarray, policy: ChunkPolicy, stateful: bool = False
) -> list[np.ndarray]:
    """Push ``codes`` one frame at a time, collecting chunks as they become ready, then flush."""
    stream = StreamingDecoder(decoder, policy, stateful)
    chunks: list[np.ndarray] = []
    for t in range(codes.shape[1]):
        stream.push(codes[:, t])
        chunks.extend(stream.ready_chunks())
    chunks.extend(stream.flush())
    assert stream.finished
    return chunks


def test_receptive_field_matches_spec_and_fixture(tiny_decoder: FireflyGenerator) -> None:
    assert receptive_field_frames(FireflyConfig.released()) == 15  # spec §4.3: "about 15"
    assert receptive_field_frames(tiny_decoder.config) == 25


def test_decode_is_causal_and_receptive_field_is_tight(tiny_decoder: FireflyGenerator) -> None:
    """Changing frame j never changes audio before frame j (so no right context is needed),
    and changes nothing from frame j + receptive_field on; frame j + rf - 1 does change."""
    frame, rf, j = tiny_decoder.config.frame_samples, 25, 40
    codes = random_codes(tiny_decoder.config.n_groups, 100, seed=1)
    changed = codes.copy()
    changed[:, j] = (changed[:, j] + 500) % 1000
    diff = np.abs(one_shot(tiny_decoder, changed) - one_shot(tiny_decoder, codes))
    assert not diff[: j * frame].any()
    assert not diff[(j + rf) * frame :].any()
    assert diff[(j + rf - 1) * frame : (j + rf) * frame].any()


@pytest.mark.parametrize(
    "policy",
    [
        ChunkPolicy(first_chunk_frames=1, chunk_frames=7),
        ChunkPolicy(first_chunk_frames=4, chunk_frames=16, growth=1.0),
        ChunkPolicy(),
        ChunkPolicy(first_chunk_frames=10, chunk_frames=32, growth=1e9),
    ],
    ids=lambda p: f"first{p.first_chunk_frames}-max{p.chunk_frames}-growth{p.growth:g}",
)
@pytest.mark.parametrize("stateful", [False, True], ids=["context", "stateful"])
def test_stream_equals_one_shot(
    tiny_decoder: FireflyGenerator, policy: ChunkPolicy, stateful: bool
) -> None:
    codes = random_codes(tiny_decoder.config.n_groups, FRAMES, seed=0)
    reference = one_shot(tiny_decoder, codes)
    chunks = stream_all(tiny_decoder, codes, policy, stateful)
    streamed = np.concatenate(chunks)
    assert streamed.dtype == np.float32 and streamed.shape == reference.shape
    assert np.abs(streamed - reference).max() <= MAX_ABS_TOL
    assert snr_db(reference, streamed) >= MIN_SNR_DB
    frame = tiny_decoder.config.frame_samples
    assert len(chunks[0]) == policy.first_chunk_frames * frame
    assert (
        max(len(c) for c in chunks) <= max(policy.first_chunk_frames, policy.chunk_frames) * frame
    )


def test_too_little_context_is_measurably_worse(tiny_decoder: FireflyGenerator) -> None:
    codes = random_codes(tiny_decoder.config.n_groups, FRAMES, seed=0)
    reference = one_shot(tiny_decoder, codes)
    streamed = np.concatenate(stream_all(tiny_decoder, codes, ChunkPolicy(left_context=8)))
    assert np.abs(streamed - reference).max() > 1e-4  # measured ~2e-3


def test_memory_is_bounded_by_chunk_not_clip(tiny_decoder: FireflyGenerator) -> None:
    """The longest decoder input for a 60 s clip equals that of a 10 s clip: context + chunk.

    Clip lengths are counted in code frames of the released model (21.53 frames/s: 1292 frames
    for 60 s), which is what the server streams; the tiny decoder just renders them faster.
    """
    cfg = tiny_decoder.config
    policy = ChunkPolicy()
    released = FireflyConfig.released()
    frames_per_second = released.sample_rate / released.frame_samples  # 21.53
    longest = {}
    for seconds in (10, 60):
        frames = round(seconds * frames_per_second)
        recorder = RecordingDecoder(tiny_decoder)
        stream = StreamingDecoder(recorder, policy)
        stream.push(random_codes(cfg.n_groups, frames, seed=seconds))
        total = sum(len(chunk) for chunk in stream.flush())
        assert total == frames * cfg.frame_samples
        assert all(shape[0] == 1 for shape in recorder.calls)
        longest[seconds] = max(shape[2] for shape in recorder.calls)
    assert longest[60] == longest[10] == policy.max_decode_frames(cfg) == 25 + 64


@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(sizes=st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=6))
def test_push_grouping_does_not_change_chunks(
    tiny_decoder: FireflyGenerator, sizes: list[int]
) -> None:
    """Pushing frames in arbitrary groups gives bit-identical chunks to one frame at a time."""
    policy = ChunkPolicy(first_chunk_frames=3, chunk_frames=12)
    codes = random_codes(tiny_decoder.config.n_groups, sum(sizes), seed=len(sizes))
    expected = stream_all(tiny_decoder, codes, policy)
    stream, chunks, start = StreamingDecoder(tiny_decoder, policy), [], 0
    for n in sizes:
        stream.push(torch.from_numpy(codes[:, start : start + n]))
        start += n
        chunks.extend(stream.ready_chunks())
    chunks.extend(stream.flush())
    assert len(chunks) == len(expected)
    assert all(np.array_equal(a, b) for a, b in zip(chunks, expected, strict=True))


def test_chunk_schedule_grows_to_the_cap(tiny_decoder: FireflyGenerator) -> None:
    policy = ChunkPolicy()
    sizes = [policy.first_chunk_frames]
    for _ in range(4):
        sizes.append(policy.next_chunk_frames(sizes[-1]))
    assert sizes == [10, 20, 40, 64, 64]
    stream = StreamingDecoder(tiny_decoder, policy)
    stream.push(np.zeros((tiny_decoder.config.n_groups, 9), dtype=np.int64))
    assert stream.next_job() is None  # 9 < first chunk
    stream.push(np.zeros(tiny_decoder.config.n_groups, dtype=np.int32))
    job = stream.next_job()
    assert job is not None and (job.context_frames, job.new_frames) == (0, 10)


def test_flush_decodes_the_remainder(tiny_decoder: FireflyGenerator) -> None:
    groups, frame = tiny_decoder.config.n_groups, tiny_decoder.config.frame_samples
    stream = StreamingDecoder(tiny_decoder)
    assert stream.flush() == [] and stream.finished
    stream = StreamingDecoder(tiny_decoder)
    stream.push(np.full((groups, 3), 1023))  # ids past the 1000-code FSQ book are accepted
    assert stream.ready_chunks() == [] and not stream.finished
    (chunk,) = stream.flush()
    assert chunk.shape == (3 * frame,) and stream.finished


@pytest.mark.parametrize(
    ("codes", "error"),
    [
        (np.zeros((3, 2), dtype=np.int64), ValueError),
        (np.zeros((4, 2, 1), dtype=np.int64), ValueError),
        (np.zeros((4, 2), dtype=np.float32), ValueError),
        (np.full((4, 2), -1), ValueError),
    ],
)
def test_bad_pushes_are_rejected(
    tiny_decoder: FireflyGenerator, codes: np.ndarray, error: type[Exception]
) -> None:
    with pytest.raises(error):
        StreamingDecoder(tiny_decoder).push(codes)


def test_push_after_close_raises(tiny_decoder: FireflyGenerator) -> None:
    stream = StreamingDecoder(tiny_decoder)
    stream.close()
    with pytest.raises(RuntimeError, match="closed"):
        stream.push(np.zeros(tiny_decoder.config.n_groups, dtype=np.int64))


@pytest.mark.parametrize(
    "kwargs",
    [{"first_chunk_frames": 0}, {"chunk_frames": 0}, {"growth": 0.5}, {"left_context": -1}],
)
def test_policy_validation(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ChunkPolicy(**kwargs)


def test_frames_wanted_counts_down_to_the_next_chunk(tiny_decoder: FireflyGenerator) -> None:
    stream = StreamingDecoder(tiny_decoder, ChunkPolicy(first_chunk_frames=4, chunk_frames=8))
    groups = tiny_decoder.config.n_groups
    assert stream.frames_wanted() == 4
    stream.push(np.zeros((groups, 3), dtype=np.int64))
    assert stream.frames_wanted() == 1 and stream.next_job() is None
    stream.push(np.zeros((groups, 2), dtype=np.int64))
    assert stream.frames_wanted() == 1  # ready: never asks for fewer than one
    assert stream.next_job() is not None
    assert stream.frames_wanted() == 8 - 1  # next chunk is 8 frames, one already pending


def test_early_chunks_keep_the_audio_and_hold_the_schedule(tiny_decoder: FireflyGenerator) -> None:
    """Short chunks cut early (a client about to run dry) change nothing in the audio, and the
    chunk schedule does not grow past a short chunk."""
    codes = random_codes(tiny_decoder.config.n_groups, 60, seed=3)
    stream = StreamingDecoder(tiny_decoder, ChunkPolicy(first_chunk_frames=8, chunk_frames=32))
    chunks: list[np.ndarray] = []
    stream.push(codes[:, :8])
    chunks.extend(stream.ready_chunks())  # the first chunk: 8 frames; next would be 16
    stream.push(codes[:, 8:11])
    assert stream.next_job(early_frames=4) is None  # 3 pending: too few even for early
    assert stream.frames_wanted(early_frames=4) == 1
    stream.push(codes[:, 11:13])
    job = stream.next_job(early_frames=4)
    assert job is not None and job.new_frames == 5
    chunks.extend(decode_one(tiny_decoder, job))
    assert stream.frames_wanted() == 16  # still 16: an early chunk does not grow the schedule
    stream.push(codes[:, 13:])
    chunks.extend(stream.flush())
    frame = tiny_decoder.config.frame_samples
    assert [len(c) // frame for c in chunks] == [8, 5, 16, 31]
    streamed, reference = np.concatenate(chunks), one_shot(tiny_decoder, codes)
    assert np.abs(streamed - reference).max() <= MAX_ABS_TOL


def decode_one(decoder, job) -> list[np.ndarray]:
    from fishserve.audio.batching import decode_batch

    return decode_batch(decoder, [job])


def test_a_stateful_stream_decodes_no_frame_twice(tiny_decoder: FireflyGenerator) -> None:
    stream = StreamingDecoder(tiny_decoder, ChunkPolicy(first_chunk_frames=4), stateful=True)
    stream.push(random_codes(tiny_decoder.config.n_groups, 30, seed=3))
    stream.close()
    jobs = []
    while (job := stream.next_job()) is not None:
        jobs.append(job)
    assert all(job.context_frames == 0 and job.state is stream.state for job in jobs)
    assert sum(job.total_frames for job in jobs) == 30
