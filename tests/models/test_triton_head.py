"""Tests for fishserve.models.firefly.triton_head (the fused channels-last HiFi-GAN head).

* Weight packing is checked everywhere: a plain-PyTorch evaluation of the packed convolution
  (the kernel's formula, module docstring) equals the head's own conv / transposed conv.
* The kernel itself runs in Triton's CPU interpreter (``TRITON_INTERPRET=1``, float32) against
  the reference implementation's decoded waveform of the tiny fixture decoder; measured max
  |diff| 1.5e-7 (peak 0.10), the same as the PyTorch head (tests/models/test_firefly.py).
* On CUDA: the same fixture in float32, and the full-size architecture in bf16 against the
  PyTorch head in float32.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fishserve.audio.decoder_runner import DecoderRunner, resolve_kernels
from fishserve.models.firefly import build_dummy_firefly
from fishserve.models.firefly.layers import CausalConv1d, CausalConvTranspose1d
from fishserve.models.firefly.triton_head import (
    SMEM_LIMIT,
    PackedConv,
    causal_conv_cl,
    triton_head_available,
)

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_decoder"
CUDA = torch.cuda.is_available()


def packed_reference(x: torch.Tensor, conv: PackedConv) -> torch.Tensor:
    """The kernel's formula in PyTorch: ``(B, T, C_in) -> (B, T * upsample, C_out)``."""
    k, d = conv.kernel_size, conv.dilation
    padded = F.pad(x, (0, 0, (k - 1) * d, 0))  # causal: zeros before t = 0
    seq_len = x.shape[1]
    out = conv.bias.expand(x.shape[0], seq_len, -1).clone()
    for j in range(k):
        out += padded[:, j * d : j * d + seq_len] @ conv.weight[j]
    return out.reshape(x.shape[0], seq_len * conv.upsample, -1)


@pytest.mark.parametrize("kernel,dilation", [(3, 1), (7, 3), (11, 5), (13, 1)])
def test_packed_conv_equals_causal_conv(kernel: int, dilation: int) -> None:
    torch.manual_seed(kernel)
    conv = CausalConv1d(12, 20, kernel, dilation=dilation)
    x = torch.randn(2, 12, 37)
    packed = PackedConv.from_conv(conv)
    assert packed.weight.shape == (kernel, 12, 20) and packed.upsample == 1
    got = packed_reference(x.transpose(1, 2), packed).transpose(1, 2)
    assert (got - conv(x)).abs().max().item() < 1e-5


@pytest.mark.parametrize("stride,kernel", [(8, 16), (2, 4), (4, 8), (3, 5)])
def test_packed_transposed_conv_equals_causal_upsampling(stride: int, kernel: int) -> None:
    torch.manual_seed(stride)
    conv = CausalConvTranspose1d(16, 6, kernel, stride=stride)
    x = torch.randn(2, 16, 23)
    packed = PackedConv.from_transposed(conv)
    assert packed.upsample == stride and packed.weight.shape == (
        -(-kernel // stride),
        16,
        6 * stride,
    )
    got = packed_reference(x.transpose(1, 2), packed).transpose(1, 2)
    want = conv(x)
    assert got.shape == want.shape == (2, 6, 23 * stride)
    assert (got - want).abs().max().item() < 1e-5


def test_strided_conv_cannot_be_packed() -> None:
    with pytest.raises(ValueError, match="stride-1"):
        PackedConv.from_conv(CausalConv1d(4, 4, 3, stride=2))


def test_kernel_choice() -> None:
    assert resolve_kernels("auto", torch.device("cpu")) == "torch"
    assert resolve_kernels("torch", torch.device("cpu")) == "torch"
    with pytest.raises(ValueError, match="CUDA"):
        resolve_kernels("triton", torch.device("cpu"))
    with pytest.raises(ValueError, match="one of"):
        resolve_kernels("cudnn", torch.device("cpu"))
    decoder = build_dummy_firefly(TINY / "firefly_gan_vq_tiny.yaml")
    assert DecoderRunner(decoder, 2, (16,)).kernels == "torch"


def test_bad_kernel_inputs_are_refused_before_launch() -> None:
    packed = PackedConv.from_conv(CausalConv1d(4, 6, 3))
    x = torch.zeros(2, 9, 4)
    good = torch.zeros(2, 9, 6)
    cases = [
        ({"x": torch.zeros(9, 4)}, "x: expected a contiguous"),
        ({"x": torch.zeros(2, 4, 9).transpose(1, 2)}, "not contiguous"),
        ({"x": x.double()}, "must match"),
        ({"residual": torch.zeros(2, 6, 9).transpose(1, 2)}, "residual: expected"),
        ({"accumulate": torch.zeros(1, 9, 6)}, "accumulate: expected"),
        ({"out": torch.zeros(2, 9, 8)}, "out: expected"),
    ]
    for kwargs, message in cases:
        args = {"x": x, "residual": None, "accumulate": None, "out": None, **kwargs}
        with pytest.raises(ValueError, match=message):
            causal_conv_cl(args.pop("x"), packed, silu_in=True, **args)
    same = PackedConv.from_conv(CausalConv1d(6, 6, 3))
    with pytest.raises(ValueError, match="must not share memory with x"):
        causal_conv_cl(good, same, silu_in=True, out=good)
    buffer = torch.zeros(2 * 9 * 6 + 6)
    with pytest.raises(ValueError, match="must not share memory with x"):  # overlapping views
        causal_conv_cl(buffer[:108].view(2, 9, 6), same, silu_in=True, out=buffer[6:].view(2, 9, 6))
    act_cases = [
        ({"act_out": torch.zeros(2, 8, 6)}, "act_out: expected"),
        ({"act_out": good, "out": good}, "act_out must not share memory"),
        ({"act_out": good, "silu_out": True}, "silu_out excludes"),
        ({"tanh_out": True, "silu_out": True}, "silu_out excludes"),
    ]
    for kwargs, message in act_cases:
        with pytest.raises(ValueError, match=message):
            causal_conv_cl(x, packed, silu_in=True, **kwargs)


@pytest.mark.skipif(not triton_head_available(), reason="Triton is not installed")
def test_tiles_fit_in_shared_memory() -> None:
    from fishserve.models.firefly.triton_head import NUM_STAGES, _blocks

    for c_in, c_out in [(512, 512), (512, 2048), (256, 256), (64, 64), (16, 16), (16, 1)]:
        for elem_bytes in (2, 4):
            bt, bn, bk, _ = _blocks(c_in, c_out, elem_bytes)
            assert NUM_STAGES * (bt + bn) * bk * elem_bytes <= SMEM_LIMIT, (c_in, c_out)
            assert min(bt, bn, bk) >= 16  # tl.dot's smallest sides
    assert _blocks(256, 256, 2) == (64, 256, 32, 4)  # bf16: the tiles measured on the H200
    assert _blocks(128, 128, 2) == (64, 128, 64, 4)


@pytest.mark.skipif(not triton_head_available(), reason="Triton is not installed")
def test_triton_head_refuses_a_cpu_head_outside_the_interpreter(monkeypatch) -> None:
    from fishserve.models.firefly.triton_head import TritonHead

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="CUDA devices"):
        TritonHead(build_dummy_firefly(TINY / "firefly_gan_vq_tiny.yaml").head)


PARITY_SCRIPT = """
import torch
from safetensors.torch import load_file
from fishserve.models.firefly import FireflyConfig, load_firefly
from fishserve.models.firefly.triton_head import TritonHead
tiny = {tiny!r}
config = FireflyConfig.from_file(tiny + "/firefly_gan_vq_tiny.yaml")
model = load_firefly(tiny + "/generator.pth", config)
model = model.to({device!r})
case = load_file(tiny + "/decode_case.safetensors")
codes, lengths = case[{codes!r}].to({device!r}), case[{lengths!r}].to({device!r})
with torch.inference_mode():
    wav = model.decode_unchecked(codes, lengths, head=TritonHead(model.head)).cpu()
ref = case[{wave!r}]
assert wav.shape == ref.shape, (wav.shape, ref.shape)
diff = (wav - ref).abs().max().item()
assert diff < 1e-5, diff
print("max diff", diff)
"""


def run_script(script: str, interpret: bool, timeout: float = 600) -> str:
    """Run `script` in a fresh Python (with Triton's CPU interpreter if `interpret`), assert
    it exited 0, and return its stdout."""
    env = {**os.environ, "TRITON_INTERPRET": "1"} if interpret else None
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def run_parity(device: str, batch: bool, interpret: bool = False) -> None:
    names = (
        ("codes_batch", "feature_lengths_batch", "waveform_batch")
        if batch
        else ("codes", "feature_lengths", "waveform")
    )
    script = PARITY_SCRIPT.format(
        tiny=str(TINY), device=device, codes=names[0], lengths=names[1], wave=names[2]
    )
    run_script(script, interpret)


@pytest.mark.skipif(not triton_head_available(), reason="Triton is not installed")
def test_triton_head_matches_reference_in_the_interpreter() -> None:
    run_parity("cpu", batch=False, interpret=True)


ODD_HEAD_SCRIPT = """
import torch
from fishserve.models.firefly.config import HeadConfig
from fishserve.models.firefly.layers import HiFiGANHead
from fishserve.models.firefly.triton_head import TritonHead
torch.manual_seed(0)
cfg = HeadConfig(hop_length=6, upsample_rates=(3, 2), upsample_kernel_sizes=(5, 4),
                 resblock_kernel_sizes=(3, 5), resblock_dilation_sizes=((1, 2), ()),
                 num_mels=12, upsample_initial_channel=20, pre_conv_kernel_size=5,
                 post_conv_kernel_size=3)
head = HiFiGANHead(cfg).eval()
z = torch.randn(2, 12, 7)
with torch.inference_mode():
    want, got = head(z), TritonHead(head)(z)
assert got.shape == want.shape == (2, 1, 42), got.shape
diff = (got - want).abs().max().item()
assert diff < 1e-5, diff
"""


@pytest.mark.skipif(not triton_head_available(), reason="Triton is not installed")
def test_odd_head_shapes_match_in_the_interpreter() -> None:
    """Channels that are not powers of two, kernels not a multiple of the stride, and a
    ResBlock without dilations (the identity, still counted in the mean)."""
    run_script(ODD_HEAD_SCRIPT, interpret=True, timeout=300)


@pytest.mark.gpu
@pytest.mark.skipif(not (CUDA and triton_head_available()), reason="needs CUDA and Triton")
def test_triton_head_matches_reference_on_gpu() -> None:
    torch.backends.cudnn.allow_tf32 = False
    run_parity("cuda", batch=True)


@pytest.mark.gpu
@pytest.mark.skipif(not (CUDA and triton_head_available()), reason="needs CUDA and Triton")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_head_full_size_half_precision(dtype: torch.dtype) -> None:
    """Released-size head in 16-bit vs the PyTorch head in float32: no worse than the PyTorch
    head in the same 16-bit dtype (random weights: numerical fidelity, not speech quality)."""
    from fishserve.models.firefly.triton_head import TritonHead

    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    codes = torch.randint(0, 1000, (3, 8, 40), device="cuda")
    lengths = torch.tensor([40, 31, 7], device="cuda")
    with torch.inference_mode():
        ref = build_dummy_firefly(device="cuda").decode_unchecked(codes, lengths)
        half = build_dummy_firefly(device="cuda", dtype=dtype)
        torch_half = half.decode_unchecked(codes, lengths)
        fused = half.decode_unchecked(codes, lengths, head=TritonHead(half.head))

    def rel(x: torch.Tensor) -> float:
        return ((x - ref).norm() / ref.norm()).item()

    assert rel(fused) <= max(2 * rel(torch_half), 1e-3), (rel(fused), rel(torch_half))
    tail = 7 * half.config.frame_samples
    assert fused[2, 0, tail:].abs().max().item() == 0.0


@pytest.mark.skipif(not triton_head_available(), reason="Triton is not installed")
def test_empty_batch_gives_empty_audio(monkeypatch) -> None:
    from fishserve.models.firefly.triton_head import TritonHead

    monkeypatch.setenv("TRITON_INTERPRET", "true")  # Triton's own spellings are accepted
    head = build_dummy_firefly(TINY / "firefly_gan_vq_tiny.yaml").head
    fused = TritonHead(head)
    no_items = torch.zeros(0, 32, 5)
    assert fused(no_items).shape == head(no_items).shape == (0, 1, 5 * 64)  # hop 64
    assert fused(torch.zeros(2, 32, 0)).shape == (2, 1, 0)


@pytest.mark.skipif(not triton_head_available(), reason="Triton is not installed")
def test_skip_rows_follow_each_items_wanted_samples(monkeypatch) -> None:
    """An item wanting all samples skips nothing, a padded row (0 samples) skips every step,
    fewer samples skip more (never past a conv's length), and cached columns are reused."""
    from fishserve.models.firefly.triton_head import TritonHead

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    fused = TritonHead(build_dummy_firefly(TINY / "firefly_gan_vq_tiny.yaml").head)
    samples, steps = 20 * 64, 40  # hop 64: 20 latent steps of output out of 40
    plan = np.asarray(fused.tail_plan(samples, steps))
    table = fused.skip_rows(samples, steps, [samples, 5 * 64, 64, 0])
    assert table.shape == (plan.size, 4) and table.dtype == np.int64
    assert (table[:, 0] == 0).all() and (table[:, 3] == plan).all()
    assert (table[:, 1] <= table[:, 2]).all() and (table[:, 2] < plan).all()
    assert (table[:, 1] > 0).any()
    again = fused.skip_rows(samples, steps, [0, samples])
    assert (again == table[:, [3, 0]]).all() and len(fused._skip_cache) == 4


def test_tail_inputs_are_refused_before_launch() -> None:
    """`out_len`, a residual longer than the output, and `valid` are checked (trimmed decode)."""
    packed = PackedConv.from_conv(CausalConv1d(4, 6, 3))
    x = torch.zeros(2, 9, 4)
    with pytest.raises(ValueError, match="out_len must lie in"):
        causal_conv_cl(x, packed, silu_in=True, out_len=10)
    with pytest.raises(ValueError, match="residual: expected"):  # shorter than the output
        causal_conv_cl(x, packed, silu_in=True, out_len=5, residual=torch.zeros(2, 4, 6))
    with pytest.raises(ValueError, match="out: expected"):  # out must be out_len long
        causal_conv_cl(x, packed, silu_in=True, out_len=5, out=torch.zeros(2, 9, 6))
    for valid in (torch.tensor([3, 4], dtype=torch.int32), torch.tensor([3])):
        with pytest.raises(ValueError, match="valid: expected"):
            causal_conv_cl(x, packed, silu_in=True, valid=valid)
        with pytest.raises(ValueError, match="skip: expected"):
            causal_conv_cl(x, packed, silu_in=True, skip=valid)


TAIL_SCRIPT = """
import dataclasses
import numpy as np
import torch
import torch.nn.functional as F
from fishserve.audio.batching import DecodeJob, decode_batch
from fishserve.audio.decoder_runner import DecoderRunner
from fishserve.audio.streaming import receptive_field_frames
from fishserve.models.firefly import FireflyConfig, build_dummy_firefly
from fishserve.models.firefly.config import HeadConfig
from fishserve.models.firefly.layers import CausalConv1d, HiFiGANHead
from fishserve.models.firefly.triton_head import PackedConv, TritonHead, causal_conv_cl
torch.manual_seed(0)

def close(got, want, what):
    assert got.shape == want.shape, (what, got.shape, want.shape)
    diff = (got - want).abs().max().item()
    assert diff < 1e-5, (what, diff)

# 1. one convolution: the last out_len steps, a longer residual, items starting late
packed = PackedConv.from_conv(CausalConv1d(5, 6, 3, dilation=2))
x, res = torch.randn(3, 20, 5), torch.randn(3, 15, 6)
valid = torch.tensor([20, 7, 0])
got = causal_conv_cl(x, packed, silu_in=False, out_len=11, residual=res, valid=valid)
for b, v in enumerate(valid.tolist()[:2]):
    item = F.pad(x[b, 20 - v:], (0, 0, 4, 0))  # the item alone, causally padded
    full = packed.bias + sum(item[j * 2 : j * 2 + v] @ packed.weight[j] for j in range(3))
    n = min(v, 11)
    close(got[b, 11 - n:], full[v - n:] + res[b, 15 - n:], f"conv item {b}")

# 2. a head: the tail of right-aligned latents (garbage before each item's start)
cfg = HeadConfig(hop_length=6, upsample_rates=(3, 2), upsample_kernel_sizes=(5, 4),
                 resblock_kernel_sizes=(3, 5), resblock_dilation_sizes=((1, 2), ()),
                 num_mels=12, upsample_initial_channel=20, pre_conv_kernel_size=5,
                 post_conv_kernel_size=3)
head = HiFiGANHead(cfg).eval()
fused = TritonHead(head)
z = torch.randn(3, 30, 12) * 5
valid = torch.tensor([30, 12, 5])
with torch.inference_mode():
    tail = fused.decode_tail(z.contiguous(), valid, 24)
    for b, v in enumerate(valid.tolist()):
        want = head(z[b : b + 1, 30 - v :].transpose(1, 2))[0, 0]
        n = min(24, want.shape[0])
        close(tail[b, 24 - n :], want[-n:], f"head item {b}")
lengths = fused.tail_lengths(24)
assert lengths[-1] == 24 + 2 and lengths[0] < 30, lengths  # conv_post reach 2; less than all

# 2b. the plan is what the convolutions get; skip rows leave unwanted tiles unwritten and
# the wanted samples bit-identical (16-step tiles, so that whole tiles can be skipped)
import fishserve.models.firefly.triton_head as th
seen, conv_cl, blocks = [], th.causal_conv_cl, th._blocks
def spy(x, conv, **kw):
    seen.append(kw["out_len"])
    return conv_cl(x, conv, **kw)
th.causal_conv_cl = spy
with torch.inference_mode():
    fused.decode_tail(z.contiguous(), valid, 24)
th.causal_conv_cl = conv_cl
assert seen == fused.tail_plan(24, 30), (seen, fused.tail_plan(24, 30))
th._blocks = lambda c_in, c_out, e: (16, 16, 16, 4)
wanted = [24, 7, 0]
table = fused.skip_rows(24, 30, wanted)
assert table.shape == (len(seen), 3) and (table[:, 0] == 0).all(), table
assert (table[:, 2] == seen).all() and (table[:, 1] > 0).any(), table
with torch.inference_mode():
    full = fused.decode_tail(z.contiguous(), valid, 24)
    part = fused.decode_tail(z.contiguous(), valid, 24, torch.from_numpy(table))
th._blocks = blocks
for b, n in enumerate(wanted):
    if n:
        assert torch.equal(part[b, 24 - n :], full[b, 24 - n :]), f"skipped head item {b}"

# 2c. one convolution: skipped tiles keep what `out` held, the rest is computed as without
packed = PackedConv.from_conv(CausalConv1d(5, 6, 3))
x = torch.randn(3, 300, 5)
plain = causal_conv_cl(x, packed, silu_in=True)
out = torch.full_like(plain, 1234.0)
causal_conv_cl(x, packed, silu_in=True, out=out, skip=torch.tensor([0, 200, 300]))
assert torch.equal(out[0], plain[0]) and torch.equal(out[1, 128:], plain[1, 128:])
assert (out[1, :128] == 1234.0).all() and (out[2] == 1234.0).all()

# 2d. SiLU in the epilogue: silu_out writes silu(result), act_out writes it beside the result
packed = PackedConv.from_conv(CausalConv1d(5, 6, 3, dilation=2))
x, res, acc = torch.randn(2, 40, 5), torch.randn(2, 40, 6), torch.randn(2, 40, 6)
kw = dict(silu_in=True, residual=res, scale=0.5, accumulate=acc)
plain = causal_conv_cl(x, packed, **kw)
close(causal_conv_cl(x, packed, silu_out=True, **kw), F.silu(plain), "silu_out")
act = torch.full_like(plain, 1234.0)
both = causal_conv_cl(x, packed, act_out=act, **kw)
assert torch.equal(both, plain)
close(act, F.silu(plain), "act_out")

# 3. a generator: each item's new frames, decoded as the whole window would be
tiny = FireflyConfig.from_file(TINY_DIR + "/firefly_gan_vq_tiny.yaml")
small = dataclasses.replace(
    tiny,
    spec_transform=dataclasses.replace(tiny.spec_transform, hop_length=8),
    head=HeadConfig(hop_length=8, upsample_rates=(4, 2), upsample_kernel_sizes=(8, 4),
                    resblock_kernel_sizes=(3, 5), resblock_dilation_sizes=((1, 2), (1,)),
                    num_mels=tiny.quantizer.input_dim, upsample_initial_channel=16,
                    pre_conv_kernel_size=5, post_conv_kernel_size=3),
)
gen = build_dummy_firefly(small)
fs = small.frame_samples
codes = torch.randint(0, 500, (3, 4, 9))
lengths = torch.tensor([9, 6, 2])
with torch.inference_mode():
    got = gen.decode_tail_unchecked(codes, lengths, 3, TritonHead(gen.head))
    ref = gen.decode_unchecked(codes, lengths)
for b, n in enumerate(lengths.tolist()):
    k = min(n, 3)
    close(got[b, (3 - k) * fs :], ref[b, 0, (n - k) * fs : n * fs], f"generator item {b}")

# 4. the runner: trimmed jobs give the audio of decoding every frame (exact context)
context = receptive_field_frames(small)
runner = DecoderRunner(gen, 4, (4, 8), kernels="triton", trim_context=context, pad=True)
assert runner.kernels == "triton" and runner.trim_context == context
rng = np.random.default_rng(0)
shapes = [(0, 5), (context, 8), (context + 3, 2), (1, 1), (context, 11)]  # 11 > every bucket
jobs = [DecodeJob(rng.integers(0, 500, (4, c + n), dtype=np.int64), c) for c, n in shapes]
assert [runner.job_frames(job) for job in jobs] == [5, 8, 2, 1, 11]
for got, want in zip(runner.decode_jobs(jobs), decode_batch(gen, jobs), strict=True):
    close(torch.from_numpy(got), torch.from_numpy(want), "runner job")
assert runner.frames_decoded == 27 and runner.calls == 2

# 5. padded rows (9 jobs run as 16) and mixed lengths skip work, and the jobs' audio is kept
wide = DecoderRunner(gen, 16, (4, 8), kernels="triton", trim_context=context, pad=True)
assert wide.batch_bucket(9) == 16
jobs = [DecodeJob(rng.integers(0, 500, (4, context + n), dtype=np.int64), context)
        for n in (1, 8, 3, 8, 2, 5, 8, 1, 6)]
for got, want in zip(wide.decode_jobs(jobs), decode_batch(gen, jobs), strict=True):
    close(torch.from_numpy(got), torch.from_numpy(want), "padded runner job")
print("ok")
"""


@pytest.mark.skipif(not triton_head_available(), reason="Triton is not installed")
def test_trimmed_decode_matches_the_full_decode_in_the_interpreter() -> None:
    """The trimmed ("tail") decode at every level (one conv, the head, the generator, the
    runner) computes exactly the samples of the untrimmed decode."""
    script = TAIL_SCRIPT.replace("TINY_DIR", repr(str(TINY)))
    assert run_script(script, interpret=True).strip().endswith("ok")


ADVERSARIAL_HEAD_SCRIPT = """
import torch
torch.use_deterministic_algorithms(True)
torch.utils.deterministic.fill_uninitialized_memory = True  # unwritten rows read as NaN
import fishserve.models.firefly.triton_head as th
from fishserve.models.firefly.config import HeadConfig
from fishserve.models.firefly.layers import HiFiGANHead

def close(got, want, what):
    assert got.shape == want.shape, (what, got.shape, want.shape)
    diff = (got - want).abs().max().item()
    assert diff < 1e-5, (what, diff)  # NaN fails too

# (kernel sizes, dilations, initial channels, upsample rates, upsample kernels)
cases = [
    ((3, 5, 3), ((), (1, 2), (3,)), 10, (3, 2), (5, 4)),  # identity first
    ((3, 3, 5), ((1,), (), (2,)), 10, (3, 2), (5, 4)),  # identity in the middle
    ((3,), ((1, 3),), 10, (3, 2), (5, 4)),  # a single ResBlock
    ((3,), ((),), 10, (3, 2), (5, 4)),  # a single identity ResBlock
    ((3, 5), ((1,), ()), 14, (2, 2, 2), (3, 4, 5)),  # odd channels (14, 7, 3, 1)
    ((3,), ((1,),), 10, (), ()),  # no upsampling stage
]
for i, (rk, rd, c0, ups, uk) in enumerate(cases):
    torch.manual_seed(i)
    hop = 1
    for u in ups:
        hop *= u
    head = HiFiGANHead(HeadConfig(hop, ups, uk, rk, rd, 6, c0, 3, 3)).eval()
    for p in head.parameters():  # larger activations: a misplaced SiLU cannot hide
        p.data.mul_(2.0)
    fused = th.TritonHead(head)
    with torch.inference_mode():
        z = torch.randn(2, 6, 9)
        close(fused(z), head(z), (i, "full"))
        steps, out = 14, 5 * hop
        x, valid = torch.randn(3, steps, 6) * 3, torch.tensor([steps, 9, 4])
        tail = fused.decode_tail(x, valid, out)
        for b, v in enumerate(valid.tolist()):
            want = head(x[b : b + 1, steps - v :].transpose(1, 2))[0, 0]
            n = min(out, want.shape[0])
            close(tail[b, out - n :], want[-n:], (i, "tail", b))
        blocks, th._blocks = th._blocks, lambda c_in, c_out, e: (16, 16, 16, 4)
        for wanted in ([out, 2 * hop - 1, 0], [1, out, 3]):
            table = torch.from_numpy(fused.skip_rows(out, steps, wanted))
            part = fused.decode_tail(x, valid, out, table)
            for b, n in enumerate(wanted):
                if n:
                    close(part[b, out - n :], tail[b, out - n :], (i, "skip", wanted, b))
        th._blocks = blocks
print("ok")
"""


@pytest.mark.skipif(not triton_head_available(), reason="Triton is not installed")
def test_head_configs_with_identity_resblocks_match_in_the_interpreter() -> None:
    """Identity ResBlocks first or in the middle, a single ResBlock, odd channels and no
    stage: the whole and the trimmed decode (right-aligned items, skipped tiles, unwritten
    memory NaN) give the PyTorch head's samples."""
    assert run_script(ADVERSARIAL_HEAD_SCRIPT, interpret=True, timeout=300).strip().endswith("ok")
