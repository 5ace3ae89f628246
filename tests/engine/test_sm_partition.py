"""Disjoint SM partitions for the engine and the decoder (`fishserve.engine.sm_partition`).

The driver calls run against a fake of `cuda.bindings.driver` on the CPU; on a GPU with
`cuda-bindings`, a Triton kernel reads the SM each program ran on (`%smid`) to check that work
launched on each partition's stream, and a CUDA graph captured on it, stays on its SMs (and
that a graph captured elsewhere does not: what `confine_graphs` is for).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch

from fishserve.engine import sm_partition
from fishserve.engine.sm_partition import (
    GroupPlan,
    SMPartitionError,
    make_disjoint_partitions,
    plan_disjoint_groups,
)

CUDA = torch.device("cuda", 0)


def test_plan_gives_the_engine_the_first_groups_and_the_decoder_the_rest() -> None:
    assert plan_disjoint_groups(8, 15, 56, None) == GroupPlan(
        tuple(range(7)), tuple(range(7, 15)), True
    )
    assert plan_disjoint_groups(8, 15, 57, None) == GroupPlan(
        tuple(range(8)), tuple(range(8, 15)), True
    )
    assert plan_disjoint_groups(8, 15, 1, 60) == GroupPlan((0,), tuple(range(1, 9)), False)
    assert plan_disjoint_groups(8, 15, 64, 56) == GroupPlan(
        tuple(range(8)), tuple(range(8, 15)), False
    )


@pytest.mark.parametrize(
    ("engine", "decoder", "message"),
    [
        (120, None, r"leaves too few SMs for the decoder \(none left\)"),
        (200, None, "leaves too few SMs"),
        (64, 64, r"leaves too few SMs for the decoder \(64 asked\)"),
        (0, None, "must be >= 1"),
        (8, 0, "must be >= 1"),
    ],
)
def test_plan_refuses_counts_that_do_not_fit(
    engine: int, decoder: int | None, message: str
) -> None:
    with pytest.raises(SMPartitionError, match=message):
        plan_disjoint_groups(8, 15, engine, decoder)


def test_disjoint_partitions_need_cuda() -> None:
    with pytest.raises(SMPartitionError, match="needs a CUDA device"):
        make_disjoint_partitions(torch.device("cpu"), 8, None)


# --------------------------------------------------------------------------- fake driver
@dataclass
class FakeSM:
    smCount: int  # noqa: N815 (the driver's field names)
    minSmPartitionSize: int = 0  # noqa: N815


@dataclass
class FakeResource:
    sm: FakeSM
    ids: tuple[int, ...] = ()  # the SMs it holds (the fake's own bookkeeping)


@dataclass(frozen=True)
class FakeStream:
    """Like `cuda.bindings.driver.CUstream`: int() gives the stream's address."""

    address: int

    def __int__(self) -> int:
        return self.address


@dataclass
class FakeDriver:
    """The `cuda.bindings.driver` calls `make_disjoint_partitions` makes, on an H200's 132 SMs
    split into 15 groups of 8 and a remainder of 12 (as the driver split them there). As the
    real call, the split returns as many entries as asked for, those past its count empty."""

    total: int = 132
    groups: int = 15
    group_sms: int = 8  # the driver may make groups larger than asked
    min_partition: int = 0  # what the SM resource says (0: not given)
    mix_ok: bool = True  # accept a descriptor of groups and the remainder
    fail: str = ""  # the call to fail
    descs: list[list[FakeResource]] = field(default_factory=list)
    priorities: list[int] = field(default_factory=list)
    asked_min: list[int] = field(default_factory=list)

    class CUresult:
        CUDA_SUCCESS = 0
        CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION = 914

    class CUdevResourceType:
        CU_DEV_RESOURCE_TYPE_SM = 1

    class CUgreenCtxCreate_flags:  # noqa: N801
        CU_GREEN_CTX_DEFAULT_STREAM = 1

    class CUstream_flags:  # noqa: N801
        CU_STREAM_NON_BLOCKING = 1

    def _result(self, name: str, *values: object) -> tuple[object, ...]:
        return (1 if self.fail == name else 0, *values)

    def cuDeviceGet(self, index: int) -> tuple[object, ...]:  # noqa: N802
        return self._result("cuDeviceGet", f"device {index}")

    def cuDeviceGetDevResource(self, device: str, kind: int) -> tuple[object, ...]:  # noqa: N802
        assert kind == self.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
        whole = FakeResource(FakeSM(self.total, self.min_partition), tuple(range(self.total)))
        return self._result("get", whole)

    def cuDevSmResourceSplitByCount(  # noqa: N802
        self, groups: int, whole: FakeResource, flags: int, min_count: int
    ) -> tuple[object, ...]:
        assert groups == self.total // min_count
        self.asked_min.append(min_count)
        size = self.group_sms
        n = min(groups, self.groups)
        made = [
            FakeResource(FakeSM(size), tuple(range(size * i, size * i + size))) for i in range(n)
        ]
        made += [FakeResource(FakeSM(0)) for _ in range(groups - n)]
        rest = tuple(range(size * n, self.total))
        return self._result("split", made, n, FakeResource(FakeSM(len(rest)), rest))

    def cuDevResourceGenerateDesc(  # noqa: N802
        self, resources: list[FakeResource], count: int
    ) -> tuple[object, ...]:
        assert count == len(resources) and all(r.sm.smCount for r in resources)
        if not self.mix_ok and len({r.sm.smCount for r in resources}) > 1:
            return (self.CUresult.CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, None)
        self.descs.append(list(resources))
        return self._result("desc", len(self.descs) - 1)

    def cuGreenCtxCreate(self, desc: int, device: str, flags: int) -> tuple[object, ...]:  # noqa: N802
        return self._result("ctx", ("context", desc))

    def cuGreenCtxGetDevResource(  # noqa: N802
        self, context: tuple[str, int], kind: int
    ) -> tuple[object, ...]:
        held = sum(r.sm.smCount for r in self.descs[context[1]])
        return self._result("its SMs", FakeResource(FakeSM(held)))

    def cuGreenCtxStreamCreate(  # noqa: N802
        self, context: tuple[str, int], flags: int, priority: int
    ) -> tuple[object, ...]:
        assert flags == self.CUstream_flags.CU_STREAM_NON_BLOCKING
        self.priorities.append(priority)
        return self._result("stream", FakeStream(1000 + context[1]))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    driver = FakeDriver()
    monkeypatch.setattr(sm_partition, "_driver", lambda: driver)
    monkeypatch.setattr(sm_partition, "_make_current", lambda device: None)
    monkeypatch.setattr(sm_partition, "_external_stream", lambda pointer, device: pointer)
    assert sm_partition._external_stream is not None
    monkeypatch.setattr(sm_partition, "_DISJOINT", {})
    return driver


def sms(fake: FakeDriver, desc: int) -> set[int]:
    return {i for resource in fake.descs[desc] for i in resource.ids}


def test_the_engine_and_the_decoder_get_disjoint_sms(fake: FakeDriver) -> None:
    engine, decoder = make_disjoint_partitions(CUDA, 56, None, engine_priority=-1)
    assert (engine.num_sms, decoder.num_sms, engine.total_sms) == (56, 76, 132)
    assert sms(fake, 0) == set(range(56)) and sms(fake, 1) == set(range(56, 132))
    assert (engine.stream, decoder.stream) == (1000, 1001)  # each its own context's stream
    assert fake.priorities == [-1, 0] and fake.asked_min == [8]
    # made once per process: the same partitions again, no new contexts
    assert make_disjoint_partitions(CUDA, 56, None, engine_priority=-1) == (engine, decoder)
    assert len(fake.descs) == 2
    # a second, different split of the same device would overlap the first
    for asked in [(48, None, -1), (56, 64, -1), (56, None, 0)]:
        with pytest.raises(SMPartitionError, match="already split"):
            make_disjoint_partitions(CUDA, *asked[:2], engine_priority=asked[2])


def test_groups_are_counted_as_the_driver_made_them(fake: FakeDriver) -> None:
    """The driver's minimum partition size is asked for; its groups may be larger."""
    fake.min_partition, fake.group_sms, fake.groups = 16, 24, 5
    engine, decoder = make_disjoint_partitions(CUDA, 30, None)
    assert fake.asked_min == [16]
    assert (engine.num_sms, decoder.num_sms) == (48, 132 - 48)  # 2 groups of 24; the rest
    assert sms(fake, 0) == set(range(48)) and sms(fake, 1) == set(range(48, 132))


def test_a_decoder_count_takes_whole_groups_after_the_engine(fake: FakeDriver) -> None:
    engine, decoder = make_disjoint_partitions(CUDA, 60, 40, engine_priority=0)
    assert (engine.num_sms, decoder.num_sms) == (64, 40)
    assert sms(fake, 0) == set(range(64)) and sms(fake, 1) == set(range(64, 104))


def test_the_decoder_leaves_out_the_remainder_where_the_driver_refuses_it(
    fake: FakeDriver,
) -> None:
    fake.mix_ok = False
    _, decoder = make_disjoint_partitions(CUDA, 56, None)
    assert decoder.num_sms == 64 and sms(fake, 1) == set(range(56, 120))


@pytest.mark.parametrize(
    "call", ["cuDeviceGet", "get", "split", "desc", "ctx", "its SMs", "stream"]
)
def test_a_failing_driver_call_is_a_partition_error(fake: FakeDriver, call: str) -> None:
    fake.fail = call
    with pytest.raises(SMPartitionError, match="failed"):
        make_disjoint_partitions(CUDA, 56, None)


def test_counts_that_do_not_fit_the_split_are_refused(fake: FakeDriver) -> None:
    with pytest.raises(SMPartitionError, match="15 groups of 8 SMs"):
        make_disjoint_partitions(CUDA, 100, 40)


def test_groups_of_unequal_sizes_are_refused(fake: FakeDriver, monkeypatch) -> None:
    split = fake.cuDevSmResourceSplitByCount

    def uneven(*args: object) -> tuple[object, ...]:
        result = split(*args)
        result[1][0].sm.smCount = 16
        return result

    monkeypatch.setattr(fake, "cuDevSmResourceSplitByCount", uneven)
    with pytest.raises(SMPartitionError, match=r"groups of sizes \[8, 16\]"):
        make_disjoint_partitions(CUDA, 56, None)


def test_without_cuda_bindings_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # import fails
    monkeypatch.setattr(sm_partition, "_DISJOINT", {})
    with pytest.raises(SMPartitionError, match="cuda-bindings of the CUDA major version"):
        make_disjoint_partitions(CUDA, 56, None)


def test_the_server_checks_for_cuda_bindings_before_loading(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    monkeypatch.setitem(sys.modules, "cuda", None)
    assert not sm_partition.cuda_bindings_installed()


# --------------------------------------------------------------------------- on the GPU
def _gpu_with_bindings() -> bool:
    return torch.cuda.is_available() and sm_partition.cuda_bindings_installed()


@pytest.mark.skipif(not _gpu_with_bindings(), reason="needs CUDA and cuda-bindings")
def test_work_on_each_partition_stays_on_its_own_sms() -> None:
    """A kernel launched on each stream, and a graph captured and replayed on the engine's
    stream (as the engine captures and replays its steps), run only on that partition's SMs."""
    from fishserve.models.firefly.triton_head import triton_head_available

    if not triton_head_available():
        pytest.skip("needs Triton")
    import triton
    import triton.language as tl

    @triton.jit
    def smid_kernel(out_ptr):  # type: ignore[no-untyped-def]
        smid = tl.inline_asm_elementwise(
            "mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
        )
        tl.store(out_ptr + tl.program_id(0), smid)

    def launch(out: torch.Tensor) -> None:
        smid_kernel[(out.numel(),)](out)

    def used(stream: torch.cuda.Stream, run: Callable[[], None], out: torch.Tensor) -> set[int]:
        out.fill_(-1)
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            for _ in range(20):
                run()
        stream.synchronize()
        return set(out.tolist())

    engine, decoder = make_disjoint_partitions(CUDA, 56, None)
    out = torch.full((4096,), -1, dtype=torch.int32, device="cuda")
    on_engine = used(engine.stream, lambda: launch(out), out)
    on_decoder = used(decoder.stream, lambda: launch(out), out)
    assert -1 not in on_engine and -1 not in on_decoder
    assert on_engine.isdisjoint(on_decoder)
    assert len(on_engine) <= engine.num_sms and len(on_decoder) <= decoder.num_sms
    assert len(on_engine) + len(on_decoder) <= sm_partition.device_sm_count(CUDA)
    launch(out)  # compiled before the capture
    torch.cuda.synchronize()
    confined, anywhere = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(confined, stream=engine.stream):
        launch(out)
    with torch.cuda.graph(anywhere):  # PyTorch's capture stream, in the primary context
        launch(out)
    replayed = used(engine.stream, confined.replay, out)
    assert -1 not in replayed and replayed.isdisjoint(on_decoder)
    assert len(replayed) <= engine.num_sms
    # Replayed on the engine's stream, a graph captured outside its context reaches the
    # decoder's SMs: what confine_graphs (off by default) is for.
    reached = used(engine.stream, anywhere.replay, out)
    assert not reached.isdisjoint(on_decoder), "the driver now confines graphs captured elsewhere"


# --------------------------------------------------------------------------- who uses them
def test_a_step_stream_needs_a_cuda_model(tiny_model, tiny_tokenizer) -> None:
    from fishserve.engine.engine import EngineConfig, LLMEngine

    config = EngineConfig(kv_cache_dtype="fp32", num_kv_blocks=16, max_num_seqs=2)
    with pytest.raises(ValueError, match="a CUDA stream for the steps needs a CUDA model"):
        LLMEngine(tiny_model, tiny_tokenizer, config, step_stream=object())  # type: ignore[arg-type]


def test_the_decoder_takes_a_count_or_a_partition_not_both(tiny_decoder) -> None:
    from fishserve.audio.decoder_runner import DecoderRunner

    partition = sm_partition.SMPartition(64, 132, object(), None)  # type: ignore[arg-type]
    with pytest.raises(SMPartitionError, match="num_sms or a partition, not both"):
        DecoderRunner(tiny_decoder, 2, (16,), num_sms=8, partition=partition)
    with pytest.raises(SMPartitionError, match="needs a CUDA decoder"):
        DecoderRunner(tiny_decoder, 2, (16,), partition=partition)


@pytest.mark.parametrize(("async_scheduling", "priority"), [(False, -1), (True, 0)])
def test_the_server_splits_the_sms_as_its_settings_say(
    tmp_path, monkeypatch: pytest.MonkeyPatch, async_scheduling: bool, priority: int
) -> None:
    from fishserve.engine.runner import ASYNC_STEP_STREAM_PRIORITY, STEP_STREAM_PRIORITY
    from fishserve.server import runtime
    from tests.conftest import tiny_server_config

    assert (STEP_STREAM_PRIORITY, ASYNC_STEP_STREAM_PRIORITY) == (-1, 0)
    calls = []

    def fake_split(device, engine_sms, decoder_sms, engine_priority):
        calls.append((device, engine_sms, decoder_sms, engine_priority))
        return (
            sm_partition.SMPartition(56, 132, "engine stream", None),  # type: ignore[arg-type]
            sm_partition.SMPartition(76, 132, "decoder stream", None),  # type: ignore[arg-type]
        )

    monkeypatch.setattr(runtime, "make_disjoint_partitions", fake_split)
    plain = tiny_server_config(tmp_path, async_scheduling=async_scheduling)
    assert runtime.sm_partitions(plain, CUDA) == (None, None) and not calls
    config = tiny_server_config(
        tmp_path, engine_sms=56, decoder_sms=70, async_scheduling=async_scheduling
    )
    engine, decoder = runtime.sm_partitions(config, CUDA)
    assert (engine.stream, decoder.stream) == ("engine stream", "decoder stream")
    assert calls == [(CUDA, 56, 70, priority)]


@pytest.mark.skipif(not _gpu_with_bindings(), reason="needs CUDA and cuda-bindings")
@pytest.mark.parametrize("confine_graphs", [False, True])
def test_an_engine_on_its_partition_generates_the_same_frames(
    tiny_tokenizer, confine_graphs: bool
) -> None:
    from fishserve.engine.engine import EngineConfig, LLMEngine
    from tests.conftest import load_tiny_model, make_engine, run_engine
    from tests.engine.test_async_scheduling import _requests, _same

    model = load_tiny_model().cuda()
    base = {"max_num_seqs": 4, "num_kv_blocks": 64}
    plain = run_engine(make_engine(model, tiny_tokenizer, **base), _requests())
    engine_part, _ = make_disjoint_partitions(CUDA, 56, None)
    config = EngineConfig(kv_cache_dtype="fp32", confine_graphs=confine_graphs, **base)
    engine = LLMEngine(model, tiny_tokenizer, config, step_stream=engine_part.stream)
    assert engine.runner.stream is engine_part.stream and engine.runner.num_captures > 0
    assert engine.runner.graphs is not None
    want = engine_part.stream if confine_graphs else None
    assert engine.runner.graphs.capture_stream is want
    _same(plain, run_engine(engine, _requests()))


def test_the_runtime_hands_each_partition_to_its_user(tmp_path, monkeypatch) -> None:
    """`build_local_runtime` with engine_sms: the engine gets the engine partition's stream,
    the decoder the decoder partition (and no `num_sms` beside it)."""
    from fishserve.audio.decoder_runner import DecoderRunner
    from fishserve.engine.engine import LLMEngine
    from fishserve.server import runtime
    from tests.conftest import tiny_server_config

    engine_part = sm_partition.SMPartition(56, 132, "engine stream", None)  # type: ignore[arg-type]
    decoder_part = sm_partition.SMPartition(64, 132, "decoder stream", None)  # type: ignore[arg-type]
    monkeypatch.setattr(
        runtime, "sm_partitions", lambda config, device: (engine_part, decoder_part)
    )
    seen: dict[str, object] = {}

    def engine(model, tokenizer, config, step_stream=None):  # type: ignore[no-untyped-def]
        seen["step_stream"], seen["confine_graphs"] = step_stream, config.confine_graphs
        return LLMEngine(model, tokenizer, config)  # on the CPU, without the stream

    class Runner:
        @staticmethod
        def for_policy(decoder, policy, max_batch, **kwargs):  # type: ignore[no-untyped-def]
            seen["num_sms"], seen["partition"] = kwargs.pop("num_sms"), kwargs.pop("partition")
            return DecoderRunner.for_policy(decoder, policy, max_batch, **kwargs)

    monkeypatch.setattr(runtime, "LLMEngine", engine)
    monkeypatch.setattr(runtime, "DecoderRunner", Runner)
    config = tiny_server_config(
        tmp_path, engine_sms=56, decoder_sms=60, num_kv_blocks=64, confine_engine_graphs=True
    )
    built = runtime.build_local_runtime(config)
    try:
        want = {"step_stream": "engine stream", "confine_graphs": True}
        assert seen == {**want, "num_sms": None, "partition": decoder_part}
        assert built.info.engine_sms == 56
    finally:
        built.shutdown()
