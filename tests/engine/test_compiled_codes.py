"""The decode step's second half compiled whole (`sample_codebooks_compiled`)."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_SEMANTIC, load_tiny_model, make_engine, run_engine
from test_engine import sampled_requests

from fishserve.engine import frame
from fishserve.engine.frame import (
    BatchSampling,
    sample_codebooks,
    sample_codebooks_by_slot,
    sample_codebooks_compiled,
)

CUDA = torch.cuda.is_available()


def codebook_inputs(model, batch: int, device: str = "cpu") -> tuple:
    """Arguments of `sample_codebooks` for `batch` rows: hidden states, semantic tokens,
    per-row settings (row-dependent seeds and frame counters) and penalty windows."""
    c = model.config
    g = torch.Generator().manual_seed(batch)
    hidden = torch.randn(batch, c.dim, generator=g)
    token = torch.randint(TINY_SEMANTIC[0], TINY_SEMANTIC[1] + 1, (batch,), generator=g)
    ints = torch.arange(batch, dtype=torch.int64)
    params = BatchSampling(
        torch.linspace(0.5, 1.0, batch),
        torch.linspace(0.6, 0.9, batch),
        torch.full((batch,), 1.2),
        ints * 7 + 5,
        ints % 2,
        ints * 3,
    )
    windows = torch.randint(0, c.codebook_size, (batch, 1 + c.num_codebooks, 16), generator=g)
    to = lambda t: t.to(device)  # noqa: E731
    params = BatchSampling(*(to(getattr(params, f)) for f in params.__dataclass_fields__))
    return model, to(hidden), to(token), params, to(windows)


def test_the_slot_path_equals_the_loop_on_the_cpu(tiny_model):
    """The codebook positions as calls of the two slot functions (the path compiled on a
    GPU, run plain here) sample the frames of the op-by-op loop."""
    with torch.inference_mode():
        for batch in (1, 3, 8):
            want = sample_codebooks(*codebook_inputs(tiny_model, batch))
            assert torch.equal(sample_codebooks_by_slot(*codebook_inputs(tiny_model, batch)), want)


def test_one_graph_per_slot_function_serves_every_slot_and_batch(tiny_model):
    """Dynamo traces each slot function whole (fullgraph) once: the slot is data and the
    batch size is dynamic, so no codebook position or batch size compiles again."""
    graphs: list[str] = []

    def backend(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    def compile_(fn):
        return torch.compile(fn.__wrapped__, backend=backend, dynamic=True, fullgraph=True)

    traced = {
        "_fast_slot": compile_(frame._fast_slot),
        "_sample_slot": compile_(frame._sample_slot),
    }
    with torch.inference_mode(), pytest.MonkeyPatch.context() as patch:
        for name, fn in traced.items():
            patch.setattr(frame, name, fn)
        for batch in (3, 5):
            want = sample_codebooks(*codebook_inputs(tiny_model, batch))
            assert torch.equal(sample_codebooks_by_slot(*codebook_inputs(tiny_model, batch)), want)
    assert len(graphs) == 2


def test_compiled_half_is_the_plain_one_on_the_cpu(tiny_model):
    with torch.inference_mode():
        for batch in (1, 4):
            want = sample_codebooks(*codebook_inputs(tiny_model, batch))
            got = sample_codebooks_compiled(*codebook_inputs(tiny_model, batch))
            assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_compiled_half_equals_the_op_by_op_one():
    """Inductor's graph (a batch of one run as two rows) samples the frames the op-by-op
    kernels sample, in fp32 without TF32."""
    torch.backends.cuda.matmul.allow_tf32 = False
    model = load_tiny_model().cuda()
    with torch.inference_mode():
        for batch in (1, 2, 7):
            want = sample_codebooks(*codebook_inputs(model, batch, "cuda"))
            got = sample_codebooks_compiled(*codebook_inputs(model, batch, "cuda"))
            assert got.shape == want.shape
            assert (got == want).all(dim=1).float().mean() >= 0.85, (batch, got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_gpu_engine_with_and_without_the_compiled_half(tiny_tokenizer):
    """CUDA-graph engines with the compiled and the op-by-op half generate the same codes
    (fp32; near-ties may flip a request)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    model = load_tiny_model().cuda()
    runs = [
        run_engine(
            make_engine(model, tiny_tokenizer, compile_fast_transformer=on), sampled_requests(4)
        )
        for on in (False, True)
    ]
    agree = [torch.equal(runs[1][rid][0], codes) for rid, (codes, _) in runs[0].items()]
    assert sum(agree) >= 3, agree
