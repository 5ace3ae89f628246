"""The loaded models and worker threads behind the HTTP routes, and how to build them.

The routes talk to a `ServingRuntime`: either a `Runtime` (models, engine thread and decoder
thread in this process) or a `RemoteRuntime` (`core_client`), which forwards to an engine-core
process holding a `Runtime`, so that the engine loop never competes with HTTP work for the GIL.
`build_runtime` picks one from the `engine_process` setting.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import torch

from fishserve.audio.decoder_runner import (
    DecoderRunner,
    decoder_batch_buckets,
    frame_buckets_for,
    resolve_kernels,
)
from fishserve.audio.references import ReferenceEncoder
from fishserve.audio.streaming import ChunkPolicy
from fishserve.engine.async_engine import AsyncEngine
from fishserve.engine.engine import EngineConfig, EngineStats, GenerationRequest, LLMEngine
from fishserve.engine.gpu_turns import GpuTurns
from fishserve.engine.memory import configure_cuda_allocator
from fishserve.engine.runner import ASYNC_STEP_STREAM_PRIORITY, STEP_STREAM_PRIORITY
from fishserve.engine.sizes import parse_memory_size
from fishserve.engine.sm_partition import (
    NO_CUDA_BINDINGS,
    SMPartition,
    cuda_bindings_installed,
    make_disjoint_partitions,
)
from fishserve.engine.step_profiler import StepProfiler
from fishserve.engine.warmup import warm_up_general_path
from fishserve.models.firefly import FireflyGenerator
from fishserve.models.loading import load_text2semantic, resolve_device, resolve_dtype
from fishserve.server.config import ServerConfig, check_model_files
from fishserve.server.decode_worker import DecodeWorker
from fishserve.server.gc_control import FULL_COLLECTIONS, GC_PAUSES, freeze_after_startup
from fishserve.server.gil_probe import GilProbe
from fishserve.server.pipeline import EARLY_CHUNK_S, AudioChunk, synthesize
from fishserve.server.relay import RelaySpec
from fishserve.synthesis import load_decoder

log = logging.getLogger(__name__)
# Free device memory below this fraction of the total makes the server refuse new work (503).
CRITICAL_FREE_FRACTION = 0.02
# Reference voices decoded and encoded at once (each up to ~100 MB of host memory and a second
# of CPU for a 30 s file of 8 channels at 384 kHz); more wait their turn, counted as waiting.
REFERENCE_WORKERS = 2


@dataclass
class RuntimeInfo:
    """What the routes need to know of the loaded models (fixed while they are loaded).

    Attributes:
        sample_rate: output sample rate in Hz (44,100 for the release).
        max_seq_len: positions of the model's context (prompt + generated frames of a segment).
        device: where the models run, e.g. ``cuda:0``.
        weight_dtype: weight dtype name, e.g. ``bfloat16``.
        kv_cache_dtype: KV cache dtype name (``bf16``, ``int8``, ...).
        block_size: positions per KV block.
        decoder_kernels: the GPU decoder head's kernels in use, ``triton`` or ``torch``.
        gpu_sharing: ``overlap`` or ``turns`` (how engine steps and decoder calls share the
            GPU; `ServerConfig.gpu_sharing`).
        decoder_sms: SMs of the decoder's partition (`ServerConfig.decoder_sms`); None: all.
        engine_sms: SMs of the engine's partition (`ServerConfig.engine_sms`, disjoint from
            the decoder's); None: all.
        max_num_seqs: sequences the engine runs at once (0: unknown).
        relay: set by an engine-core process whose streams' pipelines run in the HTTP
            process (`ServerConfig.stream_pipeline` "http"; `relay`); None: in the core, or
            no core.
    """

    sample_rate: int
    max_seq_len: int
    device: str
    weight_dtype: str
    kv_cache_dtype: str
    block_size: int
    decoder_kernels: str = "torch"
    gpu_sharing: str = "overlap"
    decoder_sms: int | None = None
    engine_sms: int | None = None
    max_num_seqs: int = 0
    relay: RelaySpec | None = None


@dataclass
class RuntimeStatus:
    """A snapshot of the engine and decoder counters and of device memory (health, metrics).

    Attributes:
        engine: the engine's counters as of its last step.
        alive: whether the engine and decoder threads (and, for a remote runtime, the engine
            process) are running.
        gpu_memory: ``used_bytes``/``total_bytes``/``budget_bytes`` of the device; None on CPU.
        memory_critical: device free memory below `CRITICAL_FREE_FRACTION` of the total.
        decoder_busy_seconds, decoder_calls, decoder_frames, decoder_jobs: decoder totals
            (device seconds, batched calls, new code frames decoded, audio chunks decoded).
        decoder_lag_seconds: how far behind its deadlines the decoder is
            (`DecodeWorker.lag_seconds`).
        gil_wait_seconds, gil_wakeups: the engine process's GIL probe totals (`GilProbe`;
            0 without one).
    """

    engine: EngineStats
    alive: bool
    gpu_memory: dict[str, int] | None
    memory_critical: bool
    decoder_busy_seconds: float
    decoder_calls: int
    decoder_frames: int
    decoder_jobs: int = 0
    decoder_lag_seconds: float = 0.0
    gil_wait_seconds: float = 0.0
    gil_wakeups: int = 0


class ServingRuntime(Protocol):
    """What the HTTP side uses of a runtime, local or in the engine-core process."""

    info: RuntimeInfo

    @property
    def sample_rate(self) -> int:
        """Output sample rate in Hz."""
        ...

    @property
    def max_seq_len(self) -> int:
        """Positions of the model's context (prompt + generated frames of one segment)."""
        ...

    restartable: bool  # the engine runs in its own process, which can be replaced

    def status(self) -> RuntimeStatus:
        """Counters and device memory now."""
        ...

    def needs_restart(self) -> bool:
        """True when the engine process is gone or its engine thread stopped (replace it)."""
        ...

    def memory_critical(self) -> bool:
        """True when the device is nearly out of memory (never on CPU)."""
        ...

    def decoder_lag(self) -> float:
        """Seconds the audio decoder is behind its streams' deadlines (0 when on time)."""
        ...

    def synthesize(
        self, request: GenerationRequest, timeout: float, arrival: float | None = None
    ) -> AsyncIterator[AudioChunk]:
        """The request's audio chunks; `timeout` in seconds from `arrival` (``time.monotonic``
        seconds, None: now)."""
        ...

    async def encode_reference(self, audio: bytes) -> torch.Tensor:
        """``(G, L)`` int64 CPU codes of reference audio.

        Raises:
            ReferenceAudioError: undecodable, empty, silent or too long audio.
        """
        ...

    def pending(self) -> int:
        """Requests waiting for admission now, as the engine's queue bound counts them (an
        upper estimate where the engine is in another process)."""
        ...

    def shutdown(self) -> None:
        """Stop the engine and decoder (and the engine process, if any)."""
        ...


@dataclass
class Runtime:
    """Everything a request needs, in this process: engine thread, decoder thread, reference
    encoder."""

    engine: AsyncEngine
    decoder: FireflyGenerator
    decode_worker: DecodeWorker
    references: ReferenceEncoder
    chunk_policy: ChunkPolicy
    device: torch.device
    weight_dtype: torch.dtype
    engine_sms: int | None = None  # SMs of the engine's partition (setting engine_sms)
    first_chunk_deadline: float | None = None  # seconds after arrival (ServerConfig)
    early_chunk_margin: float = EARLY_CHUNK_S  # seconds (ServerConfig)
    gil_probe: GilProbe | None = None  # ServerConfig.gil_probe
    # streams decoded continuing each layer's state instead of re-decoding left context
    # (fishserve.models.firefly.streaming): on the CPU, where calls run eagerly
    stateful_decoder: bool = False
    # Reference audio is decoded and encoded here, off asyncio's default pool (which parses
    # bodies): a burst of large references waits its turn instead of taking every worker.
    reference_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(REFERENCE_WORKERS, "fishserve-reference")
    )
    restartable = False  # the engine shares this process: a dead engine thread stays dead

    def needs_restart(self) -> bool:
        """Always False: an in-process engine is never replaced."""
        return False

    @property
    def info(self) -> RuntimeInfo:
        """The fixed facts the routes need (see `RuntimeInfo`)."""
        layout = self.engine.engine.cache.layout
        partition = self.decode_worker.runner.partition
        return RuntimeInfo(
            sample_rate=self.sample_rate,
            max_seq_len=self.max_seq_len,
            device=str(self.device),
            weight_dtype=str(self.weight_dtype).removeprefix("torch."),
            kv_cache_dtype=layout.dtype,
            block_size=layout.block_size,
            decoder_kernels=self.decode_worker.runner.kernels,
            gpu_sharing="overlap" if self.decode_worker.gpu_turns is None else "turns",
            decoder_sms=None if partition is None else partition.num_sms,
            engine_sms=self.engine_sms,
            max_num_seqs=self.engine.engine.config.max_num_seqs,
        )

    @property
    def sample_rate(self) -> int:
        """Output sample rate in Hz (44100 for the release)."""
        return self.decoder.config.sample_rate

    @property
    def max_seq_len(self) -> int:
        """Positions of the model's context (prompt + generated frames of one segment)."""
        return self.engine.engine.model.config.max_seq_len

    def synthesize(
        self, request: GenerationRequest, timeout: float, arrival: float | None = None
    ) -> AsyncIterator[AudioChunk]:
        """The request's audio chunks (`pipeline.synthesize`; `timeout` in seconds from
        `arrival`, the ``time.monotonic()`` seconds of its HTTP arrival, None: now)."""
        return synthesize(self, request, timeout, arrival)

    async def encode_reference(self, audio: bytes) -> torch.Tensor:
        """``(G, L)`` int64 CPU codes of reference audio, encoded off the event loop.

        Raises:
            ReferenceAudioError: undecodable, empty, silent or too long audio.
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.reference_pool, self.references.encode, audio)

    def idle(self) -> bool:
        """Whether nothing is being served: the engine has nothing running or waiting (as of
        its last step) and the decoder has no chunk queued or in progress."""
        stats = self.engine.stats()
        busy = stats.running or stats.waiting or self.engine.pending()
        return not busy and not self.decode_worker.has_work

    def shutdown(self) -> None:
        """Stop both threads (and the GIL probe); full garbage collections go back to
        CPython."""
        FULL_COLLECTIONS.stop()
        self.engine.shutdown()
        self.decode_worker.shutdown()
        self.reference_pool.shutdown(wait=False, cancel_futures=True)
        if self.gil_probe is not None:
            self.gil_probe.stop()

    def memory_critical(self) -> bool:
        """True when the device is nearly out of memory (never on CPU)."""
        if self.device.type != "cuda":
            return False
        free, total = torch.cuda.mem_get_info(self.device)
        return _critical(free, total)

    def decoder_lag(self) -> float:
        """Seconds the audio decoder is behind its streams' deadlines (0 when on time)."""
        return self.decode_worker.lag_seconds

    def gpu_memory(self) -> dict[str, int] | None:
        """Bytes of the device: used (all processes) and total (`cudaMemGetInfo`), the memory
        budget, and what PyTorch's caching allocator holds in this process (allocated to
        tensors, and reserved from the device); None on CPU."""
        if self.device.type != "cuda":
            return None
        free, total = torch.cuda.mem_get_info(self.device)
        return {
            "used_bytes": total - free,
            "total_bytes": total,
            "budget_bytes": self.engine.engine.memory.budget,
            "allocated_bytes": torch.cuda.memory_allocated(self.device),
            "reserved_bytes": torch.cuda.memory_reserved(self.device),
        }

    def pending(self) -> int:
        """Requests waiting for admission now (`AsyncEngine.pending`)."""
        return self.engine.pending()

    def status(self) -> RuntimeStatus:
        """Counters and device memory now (one `cudaMemGetInfo`)."""
        runner, gpu = self.decode_worker.runner, self.gpu_memory()
        critical = gpu is not None and _critical(
            gpu["total_bytes"] - gpu["used_bytes"], gpu["total_bytes"]
        )
        gil_wait, gil_wakeups = (0.0, 0) if self.gil_probe is None else self.gil_probe.totals()
        return RuntimeStatus(
            engine=self.engine.stats(),
            alive=self.engine.alive and self.decode_worker.alive,
            gpu_memory=gpu,
            memory_critical=critical,
            decoder_busy_seconds=runner.busy_seconds,
            decoder_calls=runner.calls,
            decoder_frames=runner.frames_decoded,
            decoder_jobs=runner.jobs_decoded,
            decoder_lag_seconds=self.decode_worker.lag_seconds,
            gil_wait_seconds=gil_wait,
            gil_wakeups=gil_wakeups,
        )


def decoder_behind(lag: float, max_lag: float | None) -> bool:
    """Whether a decoder `lag` seconds behind its deadlines exceeds `max_lag` (the
    `max_decoder_lag` setting; None: never)."""
    return max_lag is not None and lag > max_lag


def _critical(free: int, total: int) -> bool:
    """Free device bytes below `CRITICAL_FREE_FRACTION` of the total."""
    return free < CRITICAL_FREE_FRACTION * total


# Decoder activation bytes per output sample per byte of weight dtype, measured on an H200 with
# `fishserve bench-decoder` (bf16, 32 jobs of 79 frames: 1.85 GiB peak; docs/benchmarks.md).
DECODER_BYTES_PER_SAMPLE_PER_ELEM = 180


def decoder_workspace_bytes(
    decoder: FireflyGenerator, policy: ChunkPolicy, max_batch: int, graphs: bool = False
) -> int:
    """Decoder weights plus the activation peak of its largest batched call, in bytes; with
    `graphs` (CUDA graphs captured per bucket, `DecoderRunner`) also the float32 output each
    graph keeps: (batch x frames x frame_samples x 4) bytes per (batch, frames) bucket, 122 MiB
    for the released decoder's 72 default buckets."""
    config = decoder.config
    elem = torch.empty((), dtype=decoder.dtype).element_size()
    samples = policy.max_decode_frames(config) * config.frame_samples
    weights = sum(p.numel() * p.element_size() for p in decoder.parameters())
    total = weights + max_batch * samples * DECODER_BYTES_PER_SAMPLE_PER_ELEM * elem
    if graphs:
        frames = sum(frame_buckets_for(policy, config))
        total += sum(decoder_batch_buckets(max_batch)) * frames * config.frame_samples * 4
    return total


def check_settings(config: ServerConfig) -> None:
    """Find what would make `build_runtime` fail, without loading anything: the device, the
    memory budget, the model files.

    Raises:
        ValueError: CUDA asked for but absent, a bad budget, a fraction of GPU memory on CPU,
            Triton decoder kernels where they cannot run, async_scheduling with gpu_sharing
            turns, negative boost settings, dummy_logits with real weights, engine_sms without
            cuda-bindings, confine_engine_graphs without engine_sms or with enforce_eager, bad
            step-profiler variables (`StepProfiler.from_env`).
        FileNotFoundError: a checkpoint folder, decoder weights or decoder config is missing.
        ValueError: also `references_dir` exists but is not a folder.
    """
    device = resolve_device(config.device)
    resolve_kernels(config.decoder_kernels, device, capability=False)  # no CUDA context here
    StepProfiler.from_env()  # bad profiler variables fail here, before anything loads
    if config.confine_engine_graphs and config.engine_sms is None:
        raise ValueError("confine_engine_graphs needs engine_sms (the SMs to confine them to)")
    if config.confine_engine_graphs and config.enforce_eager:
        raise ValueError("confine_engine_graphs does nothing with enforce_eager (no CUDA graphs)")
    for name in ("decoder_sms", "engine_sms"):
        if getattr(config, name) is not None and device.type != "cuda":
            found = " (--device auto found no CUDA GPU)" if config.device == "auto" else ""
            raise ValueError(f"{name} needs a CUDA device, but the device is {device}{found}")
    if config.engine_sms is not None and not cuda_bindings_installed():
        raise ValueError(NO_CUDA_BINDINGS)
    # the engine's own rules for these (EngineConfig.__post_init__), before anything loads
    EngineConfig(boost_frames=config.boost_frames, boost_min_running=config.boost_min_running)
    if config.async_scheduling and config.gpu_sharing == "turns":
        raise ValueError(
            "async_scheduling needs gpu_sharing overlap: with turns each step waits for its "
            "frames before the decoder's turn"
        )
    if config.dummy_logits != "flat" and not config.random_weights:
        raise ValueError("dummy_logits applies to random weights only (--load-format dummy)")
    if config.gpu_memory_budget is not None:
        budget = parse_memory_size(config.gpu_memory_budget)
        if isinstance(budget, float) and device.type != "cuda":
            raise ValueError(
                f"gpu_memory_budget {config.gpu_memory_budget!r} is a fraction of GPU memory, "
                f"but the device is {device}: give a size such as 4GiB"
            )
    check_model_files(config)


def uses_engine_process(config: ServerConfig) -> bool:
    """Whether the engine runs in its own process: `engine_process` on, or auto on a GPU."""
    if config.engine_process == "auto":
        return resolve_device(config.device).type == "cuda"
    return config.engine_process == "on"


def build_runtime(config: ServerConfig) -> ServingRuntime:
    """The runtime `config` asks for: in an engine-core process (`uses_engine_process`) or in
    this one.

    Raises:
        FileNotFoundError, ValueError: bad settings or paths (`check_settings`), bad model
            files or a too small budget (`build_local_runtime`).
        RuntimeError: the engine-core process died while loading.
    """
    check_settings(config)
    if config.stream_pipeline == "http" and not uses_engine_process(config):
        log.warning(
            "stream_pipeline http has no effect without an engine process (engine_process %s "
            "on this device): every stream's pipeline runs in this process",
            config.engine_process,
        )
    if uses_engine_process(config):
        from fishserve.server.core_client import start_remote_runtime

        remote = start_remote_runtime(config)
        freeze_after_startup()  # the HTTP process's own start-up objects
        GC_PAUSES.install()
        FULL_COLLECTIONS.start(remote.idle, config.gc_full_interval)
        return remote
    return build_local_runtime(config)


def sm_partitions(
    config: ServerConfig, device: torch.device
) -> tuple[SMPartition | None, SMPartition | None]:
    """The engine's and the decoder's SM partitions for setting `engine_sms` (disjoint, see
    `make_disjoint_partitions`); (None, None) without it (the decoder's runner then makes its
    own from `decoder_sms`, if set).

    Raises:
        SMPartitionError: the partitions cannot be made (a ValueError).
    """
    if config.engine_sms is None:
        return None, None
    priority = ASYNC_STEP_STREAM_PRIORITY if config.async_scheduling else STEP_STREAM_PRIORITY
    engine, decoder = make_disjoint_partitions(
        device, config.engine_sms, config.decoder_sms, priority
    )
    log.info(
        "%d SMs reserved for the engine, the decoder on %d others (of %d)",
        engine.num_sms,
        decoder.num_sms,
        engine.total_sms,
    )
    return engine, decoder


def build_local_runtime(config: ServerConfig) -> Runtime:
    """Load the models and start the engine and decoder threads in this process (settings
    already checked by `check_settings`, as `build_runtime` does).

    Raises:
        FileNotFoundError, ValueError: bad model files, or a memory budget too small for the
            models (`InsufficientMemoryError`).
    """
    if config.num_kv_blocks is not None and config.gpu_memory_budget is not None:
        log.warning(
            "gpu_memory_budget %s is not used: num_kv_blocks (%d) fixes the KV pool",
            config.gpu_memory_budget,
            config.num_kv_blocks,
        )
    if 0 < config.boost_frames <= config.first_chunk_frames:
        log.warning(
            "boost_frames %d ends with the first chunk (first_chunk_frames %d): boosted "
            "streams reach their next chunks with little audio in hand (docs/benchmarks.md "
            "§6.23: 12-20 frames collapsed where 32-64 helped)",
            config.boost_frames,
            config.first_chunk_frames,
        )
    # The engine, decoder and event-loop threads share one interpreter. After each blocking
    # call (every PyTorch op, a GPU synchronisation) a thread needs the GIL back, and with
    # another thread running Python it waits up to the switch interval: CPython's default 5 ms
    # was measured as a 5.25 ms median delay after a 0.2 ms wait against one busy thread
    # (CPU, Python 3.11), so the server sets a shorter one (setting gil_switch_interval).
    sys.setswitchinterval(config.gil_switch_interval)
    log.info("GIL switch interval: %g s", config.gil_switch_interval)
    device = resolve_device(config.device)
    if device.type == "cuda":
        configure_cuda_allocator()
    dummy = config.random_weights
    weight_dtype = resolve_dtype(config.dtype, device)
    model, tokenizer = load_text2semantic(
        config.checkpoint,
        device=device,
        dtype=weight_dtype,
        load_format="dummy" if dummy else "auto",
        dummy_logits=config.dummy_logits,
    )
    # bf16/fp16 decoding on the GPU: faster and half the workspace (docs/benchmarks.md).
    decoder_dtype = weight_dtype if device.type == "cuda" else torch.float32
    decoder = load_decoder(
        config.decoder_checkpoint,
        config.decoder_config,
        config.checkpoint,
        device,
        dummy,
        decoder_dtype,
    )
    policy = ChunkPolicy(
        config.first_chunk_frames,
        config.chunk_frames,
        config.chunk_growth,
        rebuffer_frames=config.rebuffer_frames,
    )
    budget = parse_memory_size(config.gpu_memory_budget) if config.gpu_memory_budget else None
    engine_partition, decoder_partition = sm_partitions(config, device)
    engine = LLMEngine(
        model,
        tokenizer,
        EngineConfig(
            kv_cache_dtype=config.kv_cache_dtype,
            block_size=config.block_size,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            static_prefill_tokens=config.static_prefill_tokens,
            memory_budget=budget,
            num_kv_blocks=config.num_kv_blocks,
            enforce_eager=config.enforce_eager,
            async_scheduling=config.async_scheduling,
            compile_fast_transformer=config.compile_fast_transformer,
            confine_graphs=config.confine_engine_graphs,
            boost_frames=config.boost_frames,
            boost_min_running=config.boost_min_running,
            min_stream_frame_rate=config.realtime_admission * decoder.config.frame_rate,
            static_decode=config.async_scheduling,  # its overlapped steps are static ones
            decoder_workspace_bytes=decoder_workspace_bytes(
                decoder,
                policy,
                config.max_decode_batch,
                graphs=device.type == "cuda" and not config.enforce_eager,
            ),
        ),
        None if engine_partition is None else engine_partition.stream,
    )
    if device.type == "cuda":  # its first use under load compiled kernels (engine/warmup.py)
        seconds = warm_up_general_path(engine)
        if seconds:
            log.info("general prefill path warmed up in %.2f s", seconds)
    turns = GpuTurns() if config.gpu_sharing == "turns" else None
    references = ReferenceEncoder(decoder, max_seconds=config.max_reference_seconds)
    if turns is not None:
        engine.gpu_turn = functools.partial(turns.turn, "engine")
        references.gpu_turn = functools.partial(turns.turn, "decoder")  # the decoder's encoder
    runtime = Runtime(
        engine=AsyncEngine(engine, max_waiting=config.max_waiting),
        decoder=decoder,
        decode_worker=DecodeWorker(
            DecoderRunner.for_policy(
                decoder,
                policy,
                config.max_decode_batch,
                use_graphs=not config.enforce_eager,
                compile=config.decoder_compile,
                kernels=config.decoder_kernels,
                num_sms=config.decoder_sms if decoder_partition is None else None,
                partition=decoder_partition,
            ),
            gpu_turns=turns,
            batch_wait=config.decoder_batch_wait,
            pipeline=config.decoder_pipeline,
            call_overhead=config.decoder_call_overhead,
        ),
        references=references,
        chunk_policy=policy,
        first_chunk_deadline=config.first_chunk_deadline,
        early_chunk_margin=config.early_chunk_margin,
        stateful_decoder=device.type == "cpu",
        device=device,
        weight_dtype=weight_dtype,
        engine_sms=None if engine_partition is None else engine_partition.num_sms,
    )
    freeze_after_startup()  # before the threads start: nothing of theirs is frozen in passing
    GC_PAUSES.install()
    runtime.engine.start()
    runtime.decode_worker.start()
    if config.gil_probe:
        runtime.gil_probe = GilProbe()
        runtime.gil_probe.start()
    FULL_COLLECTIONS.start(runtime.idle, config.gc_full_interval)  # once all has started
    return runtime
