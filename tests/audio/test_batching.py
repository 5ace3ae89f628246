"""Tests for fishserve.audio.batching: one padded decode call for chunks of several streams.

Measured on the tiny fixture decoder (CPU fp32): batched vs one-job-at-a-time max abs difference
~4e-8 (float rounding of the batched convolutions); asserted <= 1e-6. Streams decoded through
``decode_streams`` match their one-shot decodes within the same 1e-6.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import RecordingDecoder, one_shot, random_codes

from fishserve.audio.batching import DecodeJob, decode_batch, decode_streams
from fishserve.audio.streaming import ChunkPolicy, StreamingDecoder
from fishserve.models.firefly import FireflyGenerator

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_decoder"
BATCH_TOL = 1e-5  # measured ~4e-8; margin for thread-count-dependent conv rounding


def make_jobs(codes: np.ndarray) -> list[DecodeJob]:
    """Jobs of different lengths and contexts cut from one code sequence."""
    spans = [(0, 10, 0), (5, 70, 25), (100, 135, 25), (200, 201, 0), (150, 160, 9)]
    return [DecodeJob(codes[:, a:b].copy(), context) for a, b, context in spans]


def test_batched_equals_alone_in_one_call(tiny_decoder: FireflyGenerator) -> None:
    jobs = make_jobs(random_codes(tiny_decoder.config.n_groups, 210, seed=3))
    recorder = RecordingDecoder(tiny_decoder)
    batched = decode_batch(recorder, jobs)
    assert recorder.calls == [(len(jobs), tiny_decoder.config.n_groups, 65)]
    frame = tiny_decoder.config.frame_samples
    for job, audio in zip(jobs, batched, strict=True):
        (alone,) = decode_batch(tiny_decoder, [job])
        assert audio.dtype == np.float32 and audio.shape == (job.new_frames * frame,)
        assert np.abs(audio - alone).max() <= BATCH_TOL


def test_decode_streams_serves_concurrent_streams(tiny_decoder: FireflyGenerator) -> None:
    """Three streams of different lengths, started at different times, one call per step."""
    groups = tiny_decoder.config.n_groups
    policy = ChunkPolicy(first_chunk_frames=4, chunk_frames=16)
    lengths, starts = [90, 37, 120], [0, 0, 12]
    codes = [random_codes(groups, n, seed=10 + i) for i, n in enumerate(lengths)]
    recorder = RecordingDecoder(tiny_decoder)
    streams = [StreamingDecoder(recorder, policy) for _ in lengths]
    outputs: list[list[np.ndarray]] = [[] for _ in lengths]
    step = 0
    while not all(s.finished for s in streams):
        for i, stream in enumerate(streams):
            t = step - starts[i]
            if 0 <= t < lengths[i]:
                stream.push(codes[i][:, t])
            elif t == lengths[i]:
                stream.close()
        for out, chunk in zip(outputs, decode_streams(recorder, streams), strict=True):
            if chunk is not None:
                out.append(chunk)
        step += 1
    assert max(shape[0] for shape in recorder.calls) > 1  # some calls really were batched
    for i, out in enumerate(outputs):
        reference = one_shot(tiny_decoder, codes[i])
        streamed = np.concatenate(out)
        assert streamed.shape == reference.shape
        assert np.abs(streamed - reference).max() <= BATCH_TOL


def test_empty_batch_makes_no_call(tiny_decoder: FireflyGenerator) -> None:
    recorder = RecordingDecoder(tiny_decoder)
    assert decode_batch(recorder, []) == []
    assert decode_streams(recorder, [StreamingDecoder(recorder)]) == [None]
    assert recorder.calls == []


def test_wrong_codebook_count_is_rejected(tiny_decoder: FireflyGenerator) -> None:
    with pytest.raises(ValueError, match="codebooks"):
        decode_batch(tiny_decoder, [DecodeJob(np.zeros((8, 3), dtype=np.int64), 0)])


@pytest.mark.parametrize(
    ("codes", "context"),
    [
        (np.zeros((4, 3), dtype=np.int32), 0),
        (np.zeros(3, dtype=np.int64), 0),
        (np.zeros((4, 3), dtype=np.int64), 3),
        (np.zeros((4, 3), dtype=np.int64), -1),
    ],
)
def test_job_validation(codes: np.ndarray, context: int) -> None:
    with pytest.raises(ValueError):
        DecodeJob(codes, context)


def test_decode_job_rejects_negative_codes() -> None:
    codes = np.zeros((4, 5), dtype=np.int64)
    codes[2, 3] = -1
    with pytest.raises(ValueError, match=">= 0"):
        DecodeJob(codes, 0)


def test_stateful_jobs_are_checked() -> None:
    from fishserve.audio.batching import decode_stateful
    from fishserve.models.firefly.streaming import StreamState

    codes = np.zeros((4, 3), dtype=np.int64)
    with pytest.raises(ValueError, match="no context frames"):
        DecodeJob(codes, context_frames=1, state=StreamState())
    state = StreamState()
    twice = [DecodeJob(codes, 0, state=state), DecodeJob(codes, 0, state=state)]
    with pytest.raises(ValueError, match="one stateful job per stream"):
        decode_stateful(None, twice)  # type: ignore[arg-type]
