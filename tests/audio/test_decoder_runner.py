"""Tests for fishserve.audio.decoder_runner: shape buckets, padding, channels_last head.

On CPU the runner decodes eagerly; with ``pad=True`` it pads every call to its (batch, frames)
bucket exactly as it does on the GPU before a CUDA-graph replay, so padding exactness is tested
here. Measured on the tiny fixture decoder (CPU fp32): padded vs alone max abs difference ~4e-8,
channels_last head vs conv1d head ~3e-8; asserted 1e-5 like tests/audio/test_batching.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import RecordingDecoder, random_codes

from fishserve.audio.batching import DecodeJob, decode_batch
from fishserve.audio.decoder_runner import (
    DecoderRunner,
    decoder_batch_buckets,
    frame_buckets_for,
    new_frame_buckets_for,
)
from fishserve.audio.streaming import ChunkPolicy, StreamingDecoder
from fishserve.engine import busy_timer
from fishserve.engine.sm_partition import SMPartitionError, check_sm_count, device_sm_count
from fishserve.models.firefly import FireflyConfig, FireflyGenerator

TOL = 1e-5


def test_released_buckets_match_the_default_schedule() -> None:
    # first chunk 10 frames (16) up to 15 + 64 (80): every multiple of 8 in between
    buckets = frame_buckets_for(ChunkPolicy(), FireflyConfig.released())
    assert buckets == (16, 24, 32, 40, 48, 56, 64, 72, 80)


def test_decoder_batch_buckets_are_exact_up_to_eight() -> None:
    assert decoder_batch_buckets(1) == [1]
    assert decoder_batch_buckets(6) == [1, 2, 3, 4, 5, 6]
    assert decoder_batch_buckets(48) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 48]


def stream_jobs(decoder: FireflyGenerator, policy: ChunkPolicy) -> list[DecodeJob]:
    """Every job of a 333-frame stream chunked by `policy`."""
    stream = StreamingDecoder(decoder, policy)
    stream.push(random_codes(decoder.config.n_groups, 333, seed=1))
    stream.close()
    jobs = []
    while (job := stream.next_job()) is not None:
        jobs.append(job)
    return jobs


@pytest.mark.parametrize(
    "policy",
    [
        ChunkPolicy(),
        ChunkPolicy(1, 4, growth=1.0),
        ChunkPolicy(7, 30, growth=1.5),
        ChunkPolicy(40, 8),
    ],
)
def test_every_job_of_a_stream_fits_a_bucket(
    tiny_decoder: FireflyGenerator, policy: ChunkPolicy
) -> None:
    buckets = frame_buckets_for(policy, tiny_decoder.config)
    lengths = [job.total_frames for job in stream_jobs(tiny_decoder, policy)]
    assert lengths and max(lengths) <= buckets[-1]
    assert all(b % 8 == 0 for b in buckets)


@pytest.mark.parametrize(
    "policy", [ChunkPolicy(), ChunkPolicy(1, 4, growth=1.0), ChunkPolicy(7, 30, growth=1.5)]
)
def test_every_chunk_fits_a_new_frame_bucket(
    tiny_decoder: FireflyGenerator, policy: ChunkPolicy
) -> None:
    buckets = new_frame_buckets_for(policy)
    new = [job.new_frames for job in stream_jobs(tiny_decoder, policy)]
    assert new and max(new) <= buckets[-1] < max(new) + 8
    assert buckets == tuple(range(8, buckets[-1] + 1, 8))


def test_runner_for_a_policy_trims_only_with_the_triton_head(
    tiny_decoder: FireflyGenerator,
) -> None:
    assert new_frame_buckets_for(ChunkPolicy()) == (8, 16, 24, 32, 40, 48, 56, 64)
    runner = DecoderRunner.for_policy(tiny_decoder, ChunkPolicy(), 4)  # CPU: the PyTorch head
    assert runner.kernels == "torch" and runner.trim_context is None
    assert runner.frame_buckets == frame_buckets_for(ChunkPolicy(), tiny_decoder.config)
    job = DecodeJob(random_codes(tiny_decoder.config.n_groups, 30, seed=2), 20)
    assert runner.job_frames(job) == 30


def jobs_of_mixed_lengths(groups: int) -> list[DecodeJob]:
    codes = random_codes(groups, 300, seed=7)
    spans = [(0, 10, 0), (5, 70, 25), (100, 135, 25), (200, 201, 0), (150, 160, 9)]
    return [DecodeJob(codes[:, a:b].copy(), context) for a, b, context in spans]


def test_padded_calls_equal_decoding_alone(tiny_decoder: FireflyGenerator) -> None:
    recorder = RecordingDecoder(tiny_decoder)
    runner = DecoderRunner(recorder, max_batch=4, frame_buckets=(16, 48, 72), pad=True)
    jobs = jobs_of_mixed_lengths(tiny_decoder.config.n_groups)
    audio = runner.decode_jobs(jobs)
    groups = tiny_decoder.config.n_groups
    # 5 jobs, at most 4 per call: a call of 4 (padded to 72 frames) and one of 1 (to 16)
    assert recorder.calls == [(4, groups, 72), (1, groups, 16)]
    assert runner.calls == 2 and runner.frames_decoded == sum(j.new_frames for j in jobs)
    for job, samples in zip(jobs, audio, strict=True):
        (alone,) = decode_batch(tiny_decoder, [job])
        assert samples.shape == alone.shape
        assert np.abs(samples - alone).max() <= TOL


def test_batch_is_padded_to_its_bucket(tiny_decoder: FireflyGenerator) -> None:
    recorder = RecordingDecoder(tiny_decoder)
    runner = DecoderRunner(recorder, max_batch=32, frame_buckets=(80,), pad=True)
    jobs = jobs_of_mixed_lengths(tiny_decoder.config.n_groups)
    runner.decode_jobs(jobs[:3])  # exact up to 8 jobs
    runner.decode_jobs(jobs * 2)  # 10 jobs: the next power of two
    groups = tiny_decoder.config.n_groups
    assert recorder.calls == [(3, groups, 80), (16, groups, 80)]


def test_job_longer_than_every_bucket_runs_unpadded(tiny_decoder: FireflyGenerator) -> None:
    recorder = RecordingDecoder(tiny_decoder)
    runner = DecoderRunner(recorder, max_batch=2, frame_buckets=(16,), pad=True)
    (job,) = jobs_of_mixed_lengths(tiny_decoder.config.n_groups)[1:2]
    (samples,) = runner.decode_jobs([job])
    assert recorder.calls == [(1, tiny_decoder.config.n_groups, 65)]
    (alone,) = decode_batch(tiny_decoder, [job])
    assert np.abs(samples - alone).max() <= TOL


def test_cpu_runner_does_not_pad_by_default(tiny_decoder: FireflyGenerator) -> None:
    recorder = RecordingDecoder(tiny_decoder)
    runner = DecoderRunner(recorder, max_batch=8, frame_buckets=(80,))
    assert runner.num_captures == 0 and runner.stream is None
    runner.decode_jobs(jobs_of_mixed_lengths(tiny_decoder.config.n_groups)[:3])
    assert recorder.calls == [(3, tiny_decoder.config.n_groups, 65)]


def test_calls_in_flight_give_what_decode_jobs_gives(tiny_decoder: FireflyGenerator) -> None:
    runner = DecoderRunner(tiny_decoder, max_batch=2, frame_buckets=(16, 72), pad=True)
    jobs = jobs_of_mixed_lengths(tiny_decoder.config.n_groups)
    first, second = runner.start_jobs(jobs[:2]), runner.start_jobs(jobs[2:4])
    with pytest.raises(RuntimeError, match="in flight"):
        runner.start_jobs(jobs[4:])
    with pytest.raises(RuntimeError, match="in flight"):
        runner.decode_jobs(jobs[4:])
    assert first.ready() and second.ready()  # the CPU decodes at launch
    later, earlier = second.result(), first.result()
    with pytest.raises(RuntimeError, match="taken already"):
        first.result()
    alone = runner.decode_jobs(jobs)
    for got, want in zip(earlier + later, alone[:4], strict=True):
        assert np.array_equal(got, want)
    assert runner.calls == 2 + 3 and runner.jobs_decoded == 4 + 5


@pytest.mark.parametrize("count", [0, 3])
def test_a_call_takes_one_to_max_batch_jobs(tiny_decoder: FireflyGenerator, count: int) -> None:
    runner = DecoderRunner(tiny_decoder, max_batch=2, frame_buckets=(16,))
    jobs = jobs_of_mixed_lengths(tiny_decoder.config.n_groups)[:count]
    with pytest.raises(ValueError, match="1 to 2 jobs"):
        runner.start_jobs(jobs)
    assert runner.calls == 0 and runner.decode_jobs(jobs[:2]) is not None  # no slot was lost


def test_channels_last_head_equals_conv1d_head(tiny_decoder: FireflyGenerator) -> None:
    codes = torch.from_numpy(random_codes(tiny_decoder.config.n_groups, 40, seed=5))[None]
    codes = codes.repeat(2, 1, 1)
    lengths = torch.tensor([40, 23])
    with torch.inference_mode():
        plain = tiny_decoder.decode_unchecked(codes, lengths)
        fast = tiny_decoder.decode_unchecked(codes, lengths, channels_last=True)
    assert fast.shape == plain.shape == (2, 1, 40 * tiny_decoder.config.frame_samples)
    assert (fast - plain).abs().max().item() <= TOL
    assert fast[1, 0, 23 * tiny_decoder.config.frame_samples :].abs().max().item() == 0.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_runner_matches_eager(tiny_decoder: FireflyGenerator, monkeypatch) -> None:
    monkeypatch.setattr(busy_timer, "SAMPLE_EVERY", 1)  # time every call: a handful here
    gpu = tiny_decoder.to("cuda")
    runner = DecoderRunner(gpu, max_batch=4, frame_buckets=(16, 72))
    assert runner.num_captures == 4 * 2 and runner.stream is not None
    jobs = jobs_of_mixed_lengths(gpu.config.n_groups)
    audio = runner.decode_jobs(jobs)
    for job, samples in zip(jobs, audio, strict=True):
        (alone,) = decode_batch(gpu, [job])
        assert np.abs(samples - alone).max() <= 1e-4  # TF32/cuDNN algorithms differ on GPU
    assert runner.busy_seconds > 0


def test_sm_partition_needs_cuda(tiny_decoder: FireflyGenerator) -> None:
    if torch.cuda.is_available():
        pytest.skip("checks the CPU's refusal")
    with pytest.raises(SMPartitionError, match="needs a CUDA device"):
        DecoderRunner(tiny_decoder, max_batch=2, frame_buckets=(16,), num_sms=8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_runner_on_an_sm_partition_matches_the_full_gpu(
    tiny_decoder: FireflyGenerator, monkeypatch
) -> None:
    """Graphs captured on a green context's stream decode the same audio."""
    monkeypatch.setattr(busy_timer, "SAMPLE_EVERY", 1)  # time every call: a handful here
    gpu = tiny_decoder.to("cuda")
    total = device_sm_count(gpu.device)
    try:
        check_sm_count(total // 2, gpu.device)
    except SMPartitionError as exc:
        pytest.skip(str(exc))
    full = DecoderRunner(gpu, max_batch=4, frame_buckets=(16, 72))
    part = DecoderRunner(gpu, max_batch=4, frame_buckets=(16, 72), num_sms=total // 2)
    assert part.partition is not None and part.stream is part.partition.stream
    jobs = jobs_of_mixed_lengths(gpu.config.n_groups)
    for a, b in zip(full.decode_jobs(jobs), part.decode_jobs(jobs), strict=True):
        assert a.shape == b.shape and np.abs(a - b).max() <= 1e-4
    assert part.busy_seconds > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_trimmed_cuda_runner_streams_the_one_shot_waveform(
    tiny_decoder: FireflyGenerator,
) -> None:
    """Graphs of the trimmed Triton decode, fed a stream's chunks, give the clip's audio."""
    from fishserve.models.firefly.triton_head import triton_head_available

    if not triton_head_available():
        pytest.skip("needs Triton")
    torch.backends.cudnn.allow_tf32 = False
    gpu = tiny_decoder.to("cuda")
    policy = ChunkPolicy(first_chunk_frames=3, chunk_frames=12, growth=2.0)
    runner = DecoderRunner.for_policy(gpu, policy, 4)
    assert runner.trim_context == policy.context_frames(gpu.config) and runner.num_captures
    codes = random_codes(gpu.config.n_groups, 70, seed=3)
    stream = StreamingDecoder(gpu, policy)
    stream.push(codes)
    stream.close()
    jobs = []
    while (job := stream.next_job()) is not None:
        jobs.append(job)
    audio = np.concatenate(runner.decode_jobs(jobs[::-1])[::-1])  # mixed lengths in one call
    whole, _ = gpu.decode(torch.from_numpy(codes)[None].cuda(), torch.tensor([70]))
    assert audio.shape == (70 * gpu.config.frame_samples,)
    assert np.abs(audio - whole[0, 0].cpu().numpy()).max() <= 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_trimmed_cuda_runner_at_full_size_in_bf16_matches_the_untrimmed_one() -> None:
    """Released-size decoder, random weights (numerical fidelity, not speech quality)."""
    from fishserve.models.firefly import build_dummy_firefly
    from fishserve.models.firefly.triton_head import triton_head_available

    if not triton_head_available():
        pytest.skip("needs Triton")
    decoder = build_dummy_firefly(device="cuda", dtype=torch.bfloat16)
    policy = ChunkPolicy(first_chunk_frames=16, chunk_frames=24)
    kw = {"use_graphs": False, "pad": True}
    trimmed = DecoderRunner.for_policy(decoder, policy, 4, **kw)
    full = DecoderRunner.for_policy(decoder, policy, 4, trim=False, **kw)
    assert trimmed.trim_context == 15 and full.trim_context is None
    codes = random_codes(decoder.config.n_groups, 60, seed=4)
    jobs = [DecodeJob(codes[:, :16].copy(), 0), DecodeJob(codes[:, 1:40].copy(), 15)]
    jobs.append(DecodeJob(codes[:, 5:60].copy(), 31))  # more context than needed: trimmed
    for a, b in zip(trimmed.decode_jobs(jobs), full.decode_jobs(jobs), strict=True):
        assert a.shape == b.shape
        assert np.linalg.norm(a - b) <= 2e-2 * np.linalg.norm(b), np.abs(a - b).max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_calls_in_flight_on_one_graph_keep_their_own_audio(
    tiny_decoder: FireflyGenerator,
) -> None:
    """Two calls of one bucket launched back to back: each reads its own inputs and audio."""
    gpu = tiny_decoder.to("cuda")
    runner = DecoderRunner(gpu, max_batch=2, frame_buckets=(72,))
    jobs = jobs_of_mixed_lengths(gpu.config.n_groups)
    want = [runner.decode_jobs([job])[0] for job in jobs[:4]]
    first, second = runner.start_jobs(jobs[:2]), runner.start_jobs(jobs[2:4])
    second.wait_gpu()
    assert first.ready() and second.ready()
    got = first.result() + second.result()
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and np.abs(a - b).max() <= 1e-4


def test_a_slot_uploads_its_arrays_at_their_offsets_in_one_copy() -> None:
    from fishserve.audio.decoder_runner import _Slot

    slot = _Slot(torch.device("cpu"))
    dst = torch.full((12,), -1, dtype=torch.int64)
    codes, lengths, skip = np.arange(6).reshape(2, 3), np.array([7, 8]), np.array([[9, 10, 11]])
    slot.upload(dst, [(0, codes), (6, lengths), (9, skip)])
    got = dst.tolist()
    assert got[:8] == [0, 1, 2, 3, 4, 5, 7, 8] and got[9:] == [9, 10, 11]
    slot.upload(dst[:8], [(0, codes + 1), (6, lengths)])  # staging reused, the rest untouched
    assert dst.tolist()[:8] == [1, 2, 3, 4, 5, 6, 7, 8] and dst.tolist()[9:] == [9, 10, 11]
    with pytest.raises(ValueError, match="3 elements at 10 do not fit a tensor of 12"):
        slot.upload(dst, [(10, skip)])


def test_graph_inputs_are_views_of_one_upload(tiny_decoder: FireflyGenerator) -> None:
    runner = DecoderRunner(tiny_decoder, max_batch=4, frame_buckets=(16,))
    shape = (3, tiny_decoder.config.n_groups, 17)  # an odd number of codes
    flat, codes, lengths, skip, lengths_at, _ = runner._graph_inputs(shape, 16)
    assert skip is None  # the PyTorch head has no skip table
    assert lengths_at % 16 == 0 and lengths_at >= codes.numel()  # 128-byte aligned views
    assert flat.numel() == lengths_at + 3
    assert lengths.tolist() == [17] * 3 and not codes.any()
    flat.copy_(torch.arange(flat.numel()))
    assert codes.flatten().tolist() == list(range(codes.numel()))
    assert lengths.tolist() == list(range(lengths_at, lengths_at + 3))


def test_graph_inputs_lay_out_a_skip_table_after_the_lengths(tiny_decoder, monkeypatch) -> None:
    from fishserve.audio.decoder_runner import _Slot

    runner = DecoderRunner(tiny_decoder, max_batch=4, frame_buckets=(16,))
    monkeypatch.setattr(runner, "_skip_rows", lambda frames, width: 5)  # a trimmed head's
    shape = (3, tiny_decoder.config.n_groups, 17)
    flat, codes, lengths, skip, lengths_at, skip_at = runner._graph_inputs(shape, 16)
    assert skip is not None and skip.shape == (5, 3) and not skip.any()
    assert skip_at % 16 == 0 and skip_at >= lengths_at + 3 and flat.numel() == skip_at + 15
    table = np.arange(15).reshape(5, 3) + 100
    host_codes = np.arange(codes.numel()).reshape(shape)
    _Slot(torch.device("cpu")).upload(
        flat, [(0, host_codes), (lengths_at, np.array([9, 8, 7])), (skip_at, table)]
    )
    assert np.array_equal(codes.cpu().numpy(), host_codes) and lengths.tolist() == [9, 8, 7]
    assert np.array_equal(skip.cpu().numpy(), table)
