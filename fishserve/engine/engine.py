"""The step loop: requests in, frames out, with continuous batching over a paged KV cache.

`LLMEngine` is synchronous and single-threaded: `add_request`, `abort` and `step` must be
called from one thread (`AsyncEngine` runs it on its own thread for the server).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import Tensor

from fishserve.engine.admission import StreamRateGate
from fishserve.engine.block_manager import BlockManager
from fishserve.engine.kv_cache import KVCacheLayout, PagedKVCache, resolve_kv_dtype
from fishserve.engine.long_text import DEFAULT_MAX_LENGTH, plan_long_text
from fishserve.engine.memory import (
    MemoryPlan,
    estimate_activation_bytes,
    module_bytes,
    plan_memory,
)
from fishserve.engine.persistent_batch import PersistentBatch
from fishserve.engine.profiling import profile_activation_bytes
from fishserve.engine.reference import PromptTooLongError, frame_budget
from fishserve.engine.runner import (
    ASYNC_STEP_STREAM_PRIORITY,
    STEP_STREAM_PRIORITY,
    ModelRunner,
    PendingStep,
    RowsLaunch,
)
from fishserve.engine.sampling import REPETITION_WINDOW, SamplingParams
from fishserve.engine.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from fishserve.engine.sequence import Sequence, Status, frame_counts, seq_values
from fishserve.models.dual_ar import DualARTransformer
from fishserve.models.prompt import Reference
from fishserve.models.tokenizer import FishTokenizer

log = logging.getLogger(__name__)
MiB = 2**20
# A step longer than this is logged as a warning (a step takes ~5-40 ms on a GPU; seconds
# mean a stall: kernel compilation, memory pressure, the host). On the CPU, where a full-size
# step takes seconds anyway, at debug level only.
SLOW_STEP_S = 1.0


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings.

    Attributes:
        kv_cache_dtype: auto (= weight dtype), fp32, bf16, fp16, int8, fp8.
        block_size: positions per KV block.
        max_num_seqs, max_num_batched_tokens: scheduler caps.
        memory_budget: bytes for everything the engine allocates (weights, activations,
            decoder workspace, KV pool); a float in (0, 1] is a fraction of the device's
            memory. None: on CUDA 0.9 of the device, on CPU a KV pool of `cpu_kv_cache_bytes`.
        num_kv_blocks: fixed pool size, bypassing the budget (tests, benchmarks).
        decoder_workspace_bytes: memory set aside for the audio decoder.
        enforce_eager: no CUDA graphs (decode steps run eagerly).
        static_decode: use the static-shape decode path on CPU too (it always is on CUDA).
        top_k_prefilter: the slow token's top-p looks at the k most likely ids first and falls
            back to a full sort only for rows whose nucleus is not inside them (exact either
            way; `fishserve.engine.sampling.sample_prefiltered`); 0 always sorts.
        static_prefill_tokens: prompt positions per step that run as extra rows of the static
            decode step (CUDA graphs), each row attending its own prefix; a step whose
            positions exceed max_num_seqs + this runs its prefill chunks eagerly instead
            (without asynchronous scheduling: with it, steps are capped at that size, unless
            this is 0).
        async_scheduling: schedule and launch step N+1 before step N's frames reach the host
            (`LLMEngine.step`), so the host's per-step work overlaps the device's. On the
            static path a step then holds at most max_num_seqs + static_prefill_tokens
            positions (longer prompts are prefilled in chunks, so keep static_prefill_tokens
            near a typical prompt's length), so that every step overlaps; not with
            static_prefill_tokens 0. The same frames as without it up to the rounding of
            batched matrix products (the step after an end token computes a discarded row:
            one row more than without it); `step` returns each step's events one call later.
        compile_fast_transformer: on CUDA, compile each step's second half (the fast
            transformer over the codebooks and their sampling) with torch.compile before the
            CUDA graphs are captured: fewer, fused kernels per step, one compilation at
            start-up for every batch size. Off (or `enforce_eager`): op-by-op kernels.
        confine_graphs: capture the decode graphs on `LLMEngine`'s `step_stream`, so that
            (an SM partition's stream) they run on its SMs only: a graph's kernels run in
            the context of the stream that captured them. Off: PyTorch's capture stream;
            replayed on the step stream, they may use any SM, at its priority.
        boost_frames: boost steps for young streams (0: off). A sequence in its first segment
            with fewer than this many audio frames is young: its first chunk, and the buffer its
            client starts playing from, are being made. After every full step, while at least
            `boost_min_running` other sequences run, the engine runs a step of the young
            sequences alone (and of the waiting ones it admits). Under load a full step is
            latency-bound (~1,100 kernels) and takes ~20 ms for hundreds of sequences on an
            H200 beside the decoder, while a step of a few dozen takes far less, so a new
            stream gets its first frames in fewer step periods (time to first audio) and the
            others lose the boost steps' time. With `async_scheduling` too: an old sequence's
            frame in flight from the full step is read while the boost step runs, a young
            one's is carried on the device like any other.
        boost_min_running: see `boost_frames`: boost steps only while at least this many
            running sequences are not young (and at least one: with none, a boost step would
            be a second full step); below it a full step is about as fast as a boost step,
            and boosting would only halve the others' rate.
        min_stream_frame_rate: real-time admission (`fishserve.engine.admission`): requests
            that have not run yet wait in the queue while the engine's frame rate over the
            last steps does not serve one more running sequence at this many frames per second
            (e.g. 1.15 x the audio's frame rate); 0: off (admission by the caps and free KV
            blocks only).
    """

    kv_cache_dtype: str = "auto"
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    memory_budget: int | float | None = None
    num_kv_blocks: int | None = None
    decoder_workspace_bytes: int = 512 * MiB
    cpu_kv_cache_bytes: int = 256 * MiB
    enforce_eager: bool = False
    static_decode: bool = False
    top_k_prefilter: int = 1024
    static_prefill_tokens: int = 256
    async_scheduling: bool = False
    compile_fast_transformer: bool = True
    confine_graphs: bool = False
    boost_frames: int = 0
    boost_min_running: int = 64
    min_stream_frame_rate: float = 0.0

    def __post_init__(self) -> None:
        if self.boost_frames < 0 or self.boost_min_running < 0:
            raise ValueError("boost_frames and boost_min_running must be >= 0")
        if not 0 <= self.min_stream_frame_rate < float("inf"):
            raise ValueError(
                f"min_stream_frame_rate must be finite and >= 0, got {self.min_stream_frame_rate}"
            )


@dataclass(frozen=True)
class GenerationRequest:
    """One text-to-speech request for the engine.

    Attributes:
        text: text to speak (cleaned and split into segments of `chunk_length` UTF-8 bytes).
        references: voice references (codes + transcript).
        params: sampling settings.
        chunk_length: segment size in UTF-8 bytes (<= 0: one segment).
        max_new_tokens: frame budget per segment (0 = until the context ends).
        max_length: history window budget (spec §6.2).
        ignore_eos: generate exactly the budget (benchmarks with random weights).
    """

    text: str
    references: list[Reference] = field(default_factory=list)
    params: SamplingParams = field(default_factory=SamplingParams)
    chunk_length: int = 200
    max_new_tokens: int = 1024
    max_length: int = DEFAULT_MAX_LENGTH
    ignore_eos: bool = False
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(slots=True)
class EngineEvent:
    """What a step produced for one request.

    Attributes:
        codes: int64 NumPy (nc,) codes of one audio frame, or None for a final event. NumPy,
            not a tensor: a `torch.from_numpy` per frame and the consumer's `.numpy()` cost
            ~7 us of the engine process's GIL per frame, ~7% of a core at 10,000 frames/s.
        finished: True on the request's last event.
        finish_reason: on the final event: "stop" (every segment ended with the model's end
            token), "length" (all segments done, at least one cut at its frame budget:
            `max_new_tokens`, the context or the KV pool; always so with `ignore_eos`),
            "cancelled" or "error".
        error: message when finish_reason is "error".
    """

    request_id: str
    codes: np.ndarray | None = None
    segment: int = 0
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class EngineStats:
    """Counters for health and metrics."""

    running: int
    waiting: int
    blocks_total: int
    blocks_free: int
    preemptions: int
    frames_generated: int
    busy_seconds: float = 0.0  # device time of the steps (ModelRunner.busy_seconds)
    steps: int = 0  # steps run (each computes one frame per decoding sequence)
    full_sort_rows: int = 0  # prefilter misses redone with a full sort (ModelRunner)
    boost_steps: int = 0  # steps of young sequences only (EngineConfig.boost_frames)
    # steps that held a new request (EngineConfig.min_stream_frame_rate)
    admission_held: int = 0
    stream_frame_rate: float | None = None  # frames/s per running sequence (same), recent
    admission_capacity: int | None = None  # running sequences real-time admission allows


def _frame_events(
    seqs: list[Sequence], frames: np.ndarray, audio: np.ndarray
) -> list[EngineEvent | None]:
    """One frame event per row of int64 `frames` (S, 1 + nc) (codes: a view of the row's
    codebooks), None where bool `audio` (S,) is False."""
    codes = frames[:, 1:]
    if audio.all():
        return [EngineEvent(q.request_id, c, q.segment) for q, c in zip(seqs, codes, strict=True)]
    return [
        EngineEvent(q.request_id, c, q.segment) if a else None
        for q, c, a in zip(seqs, codes, audio.tolist(), strict=True)
    ]


class KVPoolTooSmallError(ValueError):
    """A prompt needs more KV blocks than the whole pool holds."""


class LLMEngine:
    """Continuous-batching generation over the DualAR model (see module docstring)."""

    def __init__(
        self,
        model: DualARTransformer,
        tokenizer: FishTokenizer,
        config: EngineConfig | None = None,
        step_stream: torch.cuda.Stream | None = None,
    ) -> None:
        """
        Args:
            step_stream: the CUDA stream the steps run on (e.g. the engine's SM partition,
                `fishserve.engine.sm_partition.make_disjoint_partitions`); None: the
                runner's own.

        Raises:
            ValueError: `step_stream` with a model not on CUDA (and see `_plan_memory`).
        """
        self.model = model
        self.tokenizer = tokenizer
        self.config = config = config or EngineConfig()
        mc = model.config
        weight_dtype = model.embeddings.weight.dtype
        self.device = model.embeddings.weight.device
        kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, weight_dtype)
        layout = KVCacheLayout(
            mc.n_layer, mc.n_local_heads, mc.head_dim, config.block_size, 1, kv_dtype
        )
        self.memory = self._plan_memory(layout.bytes_per_token)
        # One extra block: the null block that padded rows of captured decode graphs use.
        layout = replace(layout, num_blocks=self.memory.num_blocks + 1)
        example = min(1000, mc.max_seq_len)  # a long request, within the model's context
        log.info("%s (KV %s)", self.memory.summary(example), kv_dtype)
        self.cache = PagedKVCache(layout, self.device)
        self.blocks = BlockManager(self.memory.num_blocks, config.block_size, reserved=1)
        self.runner = ModelRunner(
            model,
            self.cache,
            config.max_num_seqs,
            config.enforce_eager,
            config.static_decode,
            config.top_k_prefilter,
            config.static_prefill_tokens,
            ASYNC_STEP_STREAM_PRIORITY if config.async_scheduling else STEP_STREAM_PRIORITY,
            config.compile_fast_transformer,
            stream=step_stream,
            graphs_on_stream=config.confine_graphs,
        )
        # The running sequences' slowly changing step inputs, one row each (the scheduler
        # keeps them in step with its running list; the runner gathers a step's rows there).
        rows = PersistentBatch(config.max_num_seqs, 1 + mc.num_codebooks, self.runner.max_blocks)
        self.runner.rows = rows
        rate = config.min_stream_frame_rate
        self.admission = StreamRateGate(rate) if rate > 0 else None
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_seqs, self._step_tokens()),
            self.blocks,
            rows,
            None if self.admission is None else self.admission.admits,
        )
        self.sequences: dict[str, Sequence] = {}
        self.frames_generated = 0
        self.steps = 0
        self.boost_steps = 0
        self._boosted = False  # the last step was a boost step (EngineConfig.boost_frames)
        # Held around each step's device work, which is complete when it is released:
        # `GpuTurns.turn("engine")` when the engine takes turns on the GPU with the audio
        # decoder (server setting gpu_sharing); None: no lock, no extra synchronisation.
        self.gpu_turn: Callable[[], AbstractContextManager[object]] | None = None
        # Asynchronous scheduling: the launched step whose frames the host has not read, and
        # for each of its samplers (segment, index of the frame in the segment).
        self._pending: tuple[PendingStep, list[tuple[int, int]]] | None = None
        # ... and the step launched after it, whose second half is not queued yet.
        self._launched: tuple[RowsLaunch, list[tuple[int, int]]] | None = None

    # -- setup ---------------------------------------------------------------------------------
    def _step_tokens(self) -> int:
        """Positions per step at most: `max_num_batched_tokens`, and with asynchronous
        scheduling on the static path no more than its rows (`ModelRunner.max_rows`), so that
        every step overlaps the previous one (prompts beyond them are prefilled in chunks or
        wait a step) instead of draining the pipeline for a synchronous step with an eager
        prefill (docs/benchmarks.md §6.26). Not with `static_prefill_tokens` 0: prompts
        would then only get the rows decoding sequences leave free, a few positions a step."""
        cfg = self.config
        tokens = cfg.max_num_batched_tokens
        if cfg.async_scheduling and self.runner.static_decode and cfg.static_prefill_tokens:
            tokens = min(tokens, self.runner.max_rows)
        return tokens

    def _plan_memory(self, kv_bytes_per_token: int) -> MemoryPlan:
        cfg = self.config
        weights = module_bytes(self.model)
        activations = self._activation_bytes()
        if cfg.num_kv_blocks is not None:
            budget = (
                weights
                + activations
                + cfg.decoder_workspace_bytes
                + (cfg.num_kv_blocks * cfg.block_size * kv_bytes_per_token)
            )
        else:
            budget = self._budget_bytes(weights + activations + cfg.decoder_workspace_bytes)
        return plan_memory(
            budget,
            weights,
            activations,
            cfg.decoder_workspace_bytes,
            kv_bytes_per_token,
            cfg.block_size,
        )

    def _activation_bytes(self) -> int:
        """Measured on CUDA (a dummy largest step), an analytic estimate elsewhere."""
        cfg = self.config
        rows = cfg.max_num_seqs + cfg.static_prefill_tokens  # largest static step samples them
        estimate = estimate_activation_bytes(
            self.model.config,
            cfg.max_num_batched_tokens,
            rows,
            self.model.embeddings.weight.dtype,
        )
        if self.device.type != "cuda":
            return estimate
        kv = resolve_kv_dtype(cfg.kv_cache_dtype, self.model.embeddings.weight.dtype)
        try:
            measured = profile_activation_bytes(
                self.model, cfg.max_num_batched_tokens, rows, cfg.block_size, kv
            )
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as exc:  # keep serving with the estimate rather than not at all
            log.warning("activation profiling failed (%s); using the estimate", exc)
            return estimate
        # CUDA graph pools hold one decode step's intermediates: counted with a 25% margin.
        return int(measured * 1.25)

    def _budget_bytes(self, fixed: int) -> int:
        budget = self.config.memory_budget
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            budget = 0.9 if budget is None else budget
            return int(budget * total) if isinstance(budget, float) else int(budget)
        if budget is None:
            return fixed + self.config.cpu_kv_cache_bytes
        if isinstance(budget, float):
            raise ValueError("a fractional memory budget needs a GPU; give bytes on CPU")
        return int(budget)

    @property
    def pool_positions(self) -> int:
        """Positions the whole KV pool can hold."""
        return self.blocks.num_blocks * self.blocks.block_size

    # -- requests ------------------------------------------------------------------------------
    def prepare(self, request: GenerationRequest) -> Sequence:
        """Validate a request and build its sequence (tokenization, first prompt).

        Touches no scheduler state, so it may run on any thread.

        Raises:
            ValueError: empty text or bad references.
            PromptTooLongError / KVPoolTooSmallError: the first prompt can never run.
        """
        nc = self.model.config.num_codebooks
        plan = plan_long_text(
            self.tokenizer,
            nc,
            request.text,
            request.references,
            request.chunk_length,
            request.max_length,
        )
        seq = Sequence(
            request.request_id,
            plan,
            request.params,
            request.params.resolved_seed(),
            request.max_new_tokens,
            request.ignore_eos,
        )
        self._start_segment(seq, plan.next_prompt(0))
        return seq

    def enqueue(self, seq: Sequence) -> None:
        """Queue a prepared sequence (engine thread only).

        Raises:
            ValueError: a request with the same id is in the engine.
        """
        if seq.request_id in self.sequences:
            raise ValueError(f"duplicate request id {seq.request_id!r}")
        self.sequences[seq.request_id] = seq
        self.scheduler.add(seq)

    def add_request(self, request: GenerationRequest) -> None:
        """`prepare` then `enqueue` (single-threaded use)."""
        self.enqueue(self.prepare(request))

    def _start_segment(self, seq: Sequence, prompt: Tensor) -> None:
        length = prompt.shape[1]
        budget = frame_budget(length, seq.max_new_tokens, self.model.config.max_seq_len)
        room = self.pool_positions - length
        if room <= 0:
            raise KVPoolTooSmallError(
                f"prompt of {length} positions needs {self.blocks.blocks_for(length + 1)} KV "
                f"blocks; the pool has {self.blocks.num_blocks}"
            )
        seq.start_segment(prompt, min(budget, room))

    def abort(self, request_id: str) -> EngineEvent | None:
        """Cancel a request; its blocks are free when this returns. None if unknown."""
        seq = self.sequences.pop(request_id, None)
        if seq is None:
            return None
        self.scheduler.remove(seq)
        return EngineEvent(request_id, finished=True, finish_reason="cancelled")

    def has_work(self) -> bool:
        """Whether any request is waiting or running, or a step's frames are in flight."""
        return bool(self.sequences) or self._pending is not None or self._launched is not None

    def stats(self) -> EngineStats:
        """Current counters."""
        gate = self.admission
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            blocks_total=self.blocks.num_blocks,
            blocks_free=self.blocks.num_free,
            preemptions=self.scheduler.num_preemptions,
            frames_generated=self.frames_generated,
            busy_seconds=self.runner.busy_seconds,
            steps=self.steps,
            full_sort_rows=self.runner.full_sort_rows,
            boost_steps=self.boost_steps,
            admission_held=0 if gate is None else gate.held,
            stream_frame_rate=None if gate is None else gate.stream_rate(),
            admission_capacity=None if gate is None else gate.capacity,
        )

    # -- the step ------------------------------------------------------------------------------
    def step(self) -> list[EngineEvent]:
        """Schedule and run one batch; return the frames and completions it produced.

        With `EngineConfig.async_scheduling` (and no GPU turns), each call finishes the step
        launched by the previous call, launches this batch's first half before that step's
        frames are read, then reads them: the host's bookkeeping of step N runs while the
        device computes step N+1, and the events returned are step N's.
        """
        if self.config.async_scheduling and self.gpu_turn is None:
            return self._step_async()
        if self._launched is not None or self._pending is not None:
            return self._drain()  # asynchronous scheduling was switched off
        return self._run(self._schedule())

    def _schedule(self) -> ScheduledBatch:
        """The next step's batch: a boost step of the young sequences after a full step
        when `EngineConfig.boost_frames` calls for one, else a full step."""
        if self.admission is not None:
            self.admission.record(self.frames_generated, len(self.scheduler.running))
        if not self._boosted and self._boost_due():
            self._boosted = True
            batch = self.scheduler.schedule(only=self._young)
            if batch:
                self.boost_steps += 1
                return batch
        self._boosted = False
        return self.scheduler.schedule()

    def _young(self, seq: Sequence) -> bool:
        """Whether `seq` is in its first segment with fewer than `boost_frames` audio frames
        (its first frame is not audio, spec §6.2), the one in flight counted (asynchronous
        scheduling): else a boost step would sample its audio frame boost_frames + 1."""
        return seq.segment == 0 and seq.num_frames <= self.config.boost_frames

    def _boost_due(self) -> bool:
        """Whether a boost step should follow: some young sequence runs, or heads the waiting
        queue (a new request; not an old one's next segment or a preempted one), beside at
        least `boost_min_running` others (and at least one)."""
        if not self.config.boost_frames:
            return False
        running = self.scheduler.running
        young = sum(1 for seq in running if self._young(seq))
        others = len(running) - young
        if others < max(self.config.boost_min_running, 1):
            return False
        waiting = self.scheduler.waiting  # FCFS: only its head can be admitted first
        return young > 0 or (bool(waiting) and self._young(waiting[0]))

    def _run(self, batch: ScheduledBatch) -> list[EngineEvent]:
        """Run `batch` to its frames (synchronously) and return its events."""
        if not batch:
            return []
        self.steps += 1
        start = time.perf_counter()
        try:
            if self.gpu_turn is None:
                results = self.runner.execute(batch)
            else:
                with self.gpu_turn():
                    results = self.runner.execute(batch)
                    self.runner.synchronize()  # a step sampling nothing did not wait yet
        except Exception as exc:  # a failed step fails its requests, not the engine
            log.exception("step failed for %d sequences", len(batch.items))
            return [self._fail(seq, f"generation failed: {exc}") for seq, _ in batch.items]
        self._log_if_slow(start, batch)
        events: list[EngineEvent] = []
        self._on_frames(results.seqs, results.frames, events)
        return events

    def _log_if_slow(self, start: float, batch: ScheduledBatch) -> None:
        """Log a step that took more than `SLOW_STEP_S` since `start` (perf_counter)."""
        if (seconds := time.perf_counter() - start) > SLOW_STEP_S:
            log.log(
                logging.WARNING if self.device.type == "cuda" else logging.DEBUG,
                "slow engine step: %.2f s for %d sequences, %d positions",
                seconds,
                len(batch.items),
                batch.num_tokens,
            )

    def _step_async(self) -> list[EngineEvent]:
        """Finish the launched step, launch the next one, then read the finished step's
        frames while the next one runs (see `step`)."""
        start = time.perf_counter()
        events = self._finish() if self._launched is not None else []
        batch = self._schedule()
        if batch and not self.runner.can_overlap(batch):  # a step too large for the rows
            events += self._collect()
            batch.items = [(s, n) for s, n in batch.items if self._still_scheduled(s, n)]
            return events + self._run(batch)
        if batch:
            events += self._launch(batch)
        events += self._collect()
        self._log_if_slow(start, batch)
        return events

    def _drain(self) -> list[EngineEvent]:
        """Finish and read the steps in flight (asynchronous scheduling switched off)."""
        events = self._finish() if self._launched is not None else []
        return events + self._collect()

    def _frame_slots(self, samplers: list[Sequence]) -> list[tuple[int, int]]:
        """(segment, index of the frame in it) that each sampler's frame of a step just
        launched will have (the frame in flight before it counted)."""
        return [(seq.segment, seq.num_frames) for seq in samplers]

    def _current(self, seq: Sequence, slot: tuple[int, int]) -> bool:
        """Whether a frame launched for `slot` is still wanted: `seq` is in the engine, in the
        same segment, and has every frame before it."""
        alive = self.sequences.get(seq.request_id) is seq
        return alive and seq.segment == slot[0] and len(seq.frames) == slot[1]

    def _still_scheduled(self, seq: Sequence, n: int) -> bool:
        """Whether `seq` still wants its n scheduled positions once the frames in flight are
        read (it may have ended its segment, or been cancelled)."""
        alive = self.sequences.get(seq.request_id) is seq and seq.status is Status.RUNNING
        return alive and seq.num_pending >= n

    def _launch(self, batch: ScheduledBatch) -> list[EngineEvent]:
        """Queue `batch`'s first half, its columns in flight taken from the pending step."""
        self.steps += 1
        carry = None if self._pending is None else self._pending[0].carry
        try:
            launched = self.runner.launch(batch, carry)
        except Exception as exc:  # a failed step fails its requests, not the engine
            log.exception("step failed for %d sequences", len(batch.items))
            return [self._fail(seq, f"generation failed: {exc}") for seq, _ in batch.items]
        self._launched = (launched, self._frame_slots(launched.samplers))
        return []

    def _finish(self) -> list[EngineEvent]:
        """Queue the launched step's second half; its frames become the pending step (after
        the previous pending step's are read: `_collect` comes first)."""
        assert self._launched is not None and self._pending is None
        launched, expected = self._launched
        self._launched = None
        try:
            pending = self.runner.finish(launched)
        except Exception as exc:
            log.exception("step failed for %d sequences", len(launched.samplers))
            alive = [s for s in launched.samplers if self.sequences.get(s.request_id) is s]
            return [self._fail(seq, f"generation failed: {exc}") for seq in alive]
        for seq, slot in zip(launched.samplers, expected, strict=True):
            if self._current(seq, slot):  # not ended or restarted by the frames just read
                seq.inflight += 1
        self._pending = (pending, expected)
        return []

    def _collect(self) -> list[EngineEvent]:
        """Read the pending step's frames and turn them into events.

        A frame is dropped when its sequence ended, was cancelled or started another segment
        while it was in flight (the step after a stop computes one discarded row).
        """
        if self._pending is None:
            return []
        pending, expected = self._pending
        self._pending = None
        try:
            results = self.runner.collect(pending)
        except Exception as exc:
            log.exception("reading a step's frames failed")
            alive = [s for s in pending.samplers if self.sequences.get(s.request_id) is s]
            return [self._fail(seq, f"generation failed: {exc}") for seq in alive]
        keep = [
            i
            for i, (seq, slot) in enumerate(zip(results.seqs, expected, strict=True))
            if self._current(seq, slot) and seq.inflight > 0
        ]
        seqs = [results.seqs[i] for i in keep]
        for seq in seqs:
            seq.inflight -= 1
        frames = results.frames if len(keep) == len(results.seqs) else results.frames[keep]
        events: list[EngineEvent] = []
        self._on_frames(seqs, frames, events)
        return events

    def _on_frames(
        self, seqs: list[Sequence], frames: np.ndarray, events: list[EngineEvent]
    ) -> None:
        """Record a step's sampled frames and append their events to `events`.

        Row i of `frames` (int64 NumPy (S, 1 + nc)) is `seqs[i]`'s frame (distinct sequences).
        Events come in row order: each audio frame's event, then its sequence's end-of-request
        event when that frame ended it. Vectorised over the rows (hundreds per step): a few
        Python operations per frame.
        """
        if not seqs:
            return
        frames = np.asarray(frames, dtype=np.int64)
        n = len(seqs)
        index = frame_counts(seqs)
        self._enter_windows(seqs, frames, index)
        for seq, row in zip(seqs, frames, strict=True):  # row views: no copy per frame
            seq.frames.append(row)
        self.frames_generated += n
        audio = index >= 1  # the first frame of a segment is not audio (spec §6.2)
        stop = audio & (frames[:, 0] == self.tokenizer.im_end_id)
        if stop.any():
            stop &= ~seq_values(seqs, "ignore_eos", bool)
        budgets = seq_values(seqs, "budget")
        made = _frame_events(seqs, frames, audio)
        start = 0
        for i in np.flatnonzero(stop | (index + 1 >= budgets)).tolist():
            events.extend(filter(None, made[start : i + 1]))
            start = i + 1
            seq = seqs[i]
            seq.cut_at_budget = seq.cut_at_budget or not stop[i]
            end = self._end_segment(seq)
            if end is not None:
                events.append(end)
        events.extend(filter(None, made[start:]))

    def _enter_windows(self, seqs: list[Sequence], frames: np.ndarray, index: np.ndarray) -> None:
        """Write decode-loop frames into their sequences' penalty windows (`Sequence.add_frame`'s
        ring): one scatter into the persistent rows for the sequences holding one, a write
        each for the others (a preempted sequence receiving its frame in flight).

        Args:
            frames: int64 (S, 1 + nc) the frames; index: int64 (S,) each frame's index in its
                segment (0: the prefill frame, which enters no window).
        """
        decode = index >= 1
        column = (index - 1) % REPETITION_WINDOW
        slots = seq_values(seqs, "slot")
        held = decode & (slots >= 0)
        rows = self.scheduler.rows
        if rows is None:
            held[:] = False
        else:
            rows.windows[slots[held], :, column[held]] = frames[held]
        for i in np.flatnonzero(decode & ~held).tolist():
            seqs[i].window[:, column[i]] = frames[i]

    def _end_segment(self, seq: Sequence) -> EngineEvent | None:
        seq.plan.record(torch.from_numpy(np.stack(seq.frames, axis=1)))
        if seq.segment + 1 >= len(seq.plan.segments):
            self.sequences.pop(seq.request_id, None)
            self.scheduler.remove(seq)
            reason = "length" if seq.cut_at_budget else "stop"
            return EngineEvent(
                seq.request_id, segment=seq.segment, finished=True, finish_reason=reason
            )
        seq.segment += 1
        try:
            self._start_segment(seq, seq.plan.next_prompt(seq.segment))
        except (PromptTooLongError, KVPoolTooSmallError) as exc:
            return self._fail(seq, str(exc))
        self.scheduler.requeue(seq)
        return None

    def _fail(self, seq: Sequence, message: str) -> EngineEvent:
        self.sequences.pop(seq.request_id, None)
        self.scheduler.remove(seq)
        return EngineEvent(seq.request_id, finished=True, finish_reason="error", error=message)
