"""`fishserve bench-engine-load`: the engine alone under a steady load of streams.

`bench-engine` times a fixed batch that decodes in lockstep. A server's engine instead runs a
batch that streams keep joining and leaving: prompts are prefilled between decode steps,
young streams get boost steps (`EngineConfig.boost_frames`), finished ones free their rows.
This benchmark reproduces that without HTTP and without the audio decoder: for each number
N of streams, N requests of `frames` frames each (fixed length, ignore_eos; a short prompt)
are kept in flight, started `ramp` per step at first and replaced as each finishes; after a
warm-up, `duration` seconds are measured. Reported per point: engine steps/s, frames/s,
frames per step, the share of boost steps, the real-time margin (audio frames/s over the N
streams' real-time need, N x 21.53 frames/s: above 1 the engine keeps N streams ahead of
real time, before the decoder's share of the GPU; a stream of `frames` frames has
`frames - 1` audio frames, spec §6.2) and the time from submission to a stream's first audio
frame and to its first `first_chunk` audio frames (p50/p99 over the streams submitted in the
measured window; after it the same load runs on, new streams untimed, until those streams
have their first chunks, for up to max(duration, 5 s)). Boost steps run only while at least
`boost_min_running` other streams are past their boost, so a point with fewer streams has
none. The machine's host
probe (`fishserve.host_probe`) and, on a GPU, the device probe (`fishserve.bench.device_probe`)
are measured before the run and reported with it. With ``FISHSERVE_TORCH_PROFILER_DIR`` set,
a window of the steps is profiled as in the server (`fishserve.engine.step_profiler`; the step
count runs on across points); `fishserve profile-gaps` reads the trace.

It separates the engine's capacity from the server's: the same load through `fishserve
bench` adds the decoder (its GPU time, its thread's GIL share) and the HTTP process.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from rich.console import Console

from fishserve.bench import tables
from fishserve.bench.device_probe import describe, device_probe
from fishserve.bench.engine_speed import FRAMES_PER_SECOND, fixed_request, prompt_text
from fishserve.bench.stats import percentiles
from fishserve.engine.engine import EngineConfig, EngineEvent, LLMEngine
from fishserve.engine.long_text import plan_long_text
from fishserve.engine.runner import ASYNC_STEP_STREAM_PRIORITY, STEP_STREAM_PRIORITY
from fishserve.engine.sm_partition import make_disjoint_partitions
from fishserve.engine.step_profiler import StepProfiler
from fishserve.engine.warmup import warm_up_general_path
from fishserve.host_probe import host_probe_ms
from fishserve.models.dual_ar import DualARTransformer
from fishserve.models.tokenizer import FishTokenizer
from fishserve.progress import progress_bar

LOAD_MODES = ("sync", "async")


@dataclass(frozen=True)
class LoadSettings:
    """What each point runs.

    Attributes:
        frames: frames per stream (`max_new_tokens`, fixed with ignore_eos; the first is not
            audio: 216 give 215 audio frames, ~10 s).
        context: about how many prompt positions per stream (`prompt_text`; the prompt the
            engine builds can be longer: `prompt_positions`).
        duration: measured seconds per point.
        warmup: seconds run before the measurement, once every stream has started.
        ramp: new streams added per step until N are in flight (then one per finished one).
        first_chunk: audio frames of a stream's first chunk (its time to first chunk).
        boost_frames: `EngineConfig.boost_frames` (0: no boost steps).
        boost_min_running: `EngineConfig.boost_min_running`.
        kv_cache_dtype: the engine's KV dtype ("auto": the weights' dtype).
        max_num_batched_tokens: positions per step at most (`EngineConfig`).
        top_k_prefilter: the slow-token sampler's prefilter (`EngineConfig`).
        engine_sms: run the steps on a partition of this many SMs (the server's setting
            `engine_sms`; CUDA only); None: the whole device.
    """

    frames: int = 216
    context: int = 40
    duration: float = 10.0
    warmup: float = 2.0
    ramp: int = 8
    first_chunk: int = 10
    boost_frames: int = 64
    boost_min_running: int = 64
    kv_cache_dtype: str = "auto"
    max_num_batched_tokens: int = 4096
    top_k_prefilter: int = 1024
    engine_sms: int | None = None

    def check(self) -> None:
        """Raises ValueError naming the first bad setting."""
        if self.frames < 2 or self.context < 1:
            raise ValueError(
                f"frames must be >= 2 and context >= 1, got {self.frames}, {self.context}"
            )
        if not (math.isfinite(self.duration) and math.isfinite(self.warmup)):
            raise ValueError(
                f"duration and warmup must be finite, got {self.duration}, {self.warmup}"
            )
        if self.duration <= 0 or self.warmup < 0:
            raise ValueError(
                f"duration must be > 0 and warmup >= 0 seconds, got {self.duration}, {self.warmup}"
            )
        if (
            self.ramp < 1
            or self.first_chunk < 1
            or min(self.boost_frames, self.boost_min_running) < 0
        ):
            raise ValueError(
                "ramp and first_chunk must be >= 1, boost_frames and boost_min_running >= 0"
            )
        if self.first_chunk > self.frames - 1:
            raise ValueError(
                f"first_chunk {self.first_chunk} exceeds a stream's {self.frames - 1} audio "
                f"frames (frames {self.frames}: the first is not audio)"
            )


@dataclass
class LoadPoint:
    """One measured point (times in seconds).

    Attributes:
        streams, mode: streams in flight and "sync" or "async" scheduling.
        seconds: measured wall seconds.
        steps_per_s, frames_per_s: engine steps and frames (all rows that sampled, the
            prompts' first frames included) per second.
        audio_frames_per_s: audio frames per second (the streams' frames but each
            segment's first).
        frames_per_step: frames per step (with async scheduling the window reads the frames
            of its steps shifted by one step: off by at most one step's frames);
            boost_share: share of boost steps.
        realtime_margin: audio_frames_per_s / (streams x 21.53): > 1 keeps every stream
            ahead of real time on average.
        streams_started, streams_finished: in the measured window.
        first_frame_p50, first_frame_p99: submission to first audio frame, over the streams
            submitted in the window (NaN without any).
        first_chunk_p50, first_chunk_p99: the same to `first_chunk` audio frames; after the
            window the load runs on (new streams not counted) until each of those streams
            has its first chunk, for up to `max(duration, 5)` seconds.
        first_chunk_missing: streams submitted in the window still without a first chunk then.
        full_sort_share: the window's slow-token draws that the top-k prefilter left to the
            exact full sort, per frame (`EngineStats.full_sort_rows`).
    """

    streams: int
    mode: str
    seconds: float
    steps_per_s: float
    frames_per_s: float
    audio_frames_per_s: float
    frames_per_step: float
    boost_share: float
    realtime_margin: float
    streams_started: int
    streams_finished: int
    first_frame_p50: float
    first_frame_p99: float
    first_chunk_p50: float
    first_chunk_p99: float
    first_chunk_missing: int
    full_sort_share: float = 0.0


@dataclass
class _Tracker:
    """Submission times and audio frames of the streams in flight. Between `start_window`
    and `end_window`: audio frames and finishes counted, and the streams submitted then
    timed to their first frame and first chunk (also after `end_window`)."""

    first_chunk: int
    submitted: dict[str, float] = field(default_factory=dict)
    audio: dict[str, int] = field(default_factory=dict)
    first_frame: list[float] = field(default_factory=list)
    first_chunk_s: list[float] = field(default_factory=list)
    awaiting: set[str] = field(default_factory=set)  # timed streams without a first chunk
    audio_frames: int = 0
    finished: int = 0
    window_start: float = math.inf
    window_end: float = math.inf

    def start_window(self) -> None:
        self.window_start = time.perf_counter()

    def end_window(self) -> None:
        self.window_end = time.perf_counter()

    def add(self, request_id: str) -> None:
        now = time.perf_counter()
        self.submitted[request_id] = now
        self.audio[request_id] = 0
        if self.window_start <= now < self.window_end:
            self.awaiting.add(request_id)

    def on_events(self, events: list[EngineEvent]) -> None:
        now = time.perf_counter()
        in_window = self.window_start <= now < self.window_end
        for ev in events:
            rid = ev.request_id
            if ev.codes is not None and rid in self.audio:
                n = self.audio[rid] = self.audio[rid] + 1
                self.audio_frames += int(in_window)
                if n in (1, self.first_chunk) and rid in self.awaiting:
                    self._timed(rid, n, now - self.submitted[rid])
            if ev.finished and self.submitted.pop(rid, None) is not None:
                del self.audio[rid]
                self.awaiting.discard(rid)
                self.finished += int(in_window)

    def _timed(self, rid: str, n: int, waited: float) -> None:
        if n == 1:
            self.first_frame.append(waited)
        if n == self.first_chunk:
            self.first_chunk_s.append(waited)
            self.awaiting.discard(rid)


def _percentiles(values: list[float]) -> tuple[float, float]:
    """(p50, p99) of `values` (`fishserve.bench.stats.percentiles`), NaN for none."""
    found = percentiles(values)
    return tuple(math.nan if found[k] is None else found[k] for k in ("p50", "p99"))


class _Load:
    """N streams kept in flight on one engine."""

    def __init__(
        self,
        engine: LLMEngine,
        streams: int,
        text: str,
        s: LoadSettings,
        profiler: StepProfiler | None = None,
    ) -> None:
        self.engine, self.streams, self.text, self.settings = engine, streams, text, s
        self.profiler = profiler
        self.tracker = _Tracker(s.first_chunk)
        self.count = 0

    def top_up(self, at_most: int) -> None:
        """Submit up to `at_most` new streams while fewer than N are in flight."""
        for _ in range(at_most):
            if len(self.tracker.submitted) >= self.streams:
                return
            rid = f"load{self.count}"
            self.engine.add_request(fixed_request(self.text, self.count, self.settings.frames, rid))
            self.tracker.add(rid)
            self.count += 1

    def step(self, new: int) -> None:
        self.top_up(new)
        if self.profiler is not None:
            self.profiler.before_step()
        events = self.engine.step()
        if self.profiler is not None:
            self.profiler.after_step()
        self.tracker.on_events(events)

    def run_until(self, deadline: float, new: int) -> None:
        while time.perf_counter() < deadline:
            self.step(new)

    def drain(self, deadline: float) -> None:
        """Run on under the same load until the timed streams have their first chunks."""
        while self.tracker.awaiting and time.perf_counter() < deadline:
            self.step(self.streams)


def run_load_point(
    engine: LLMEngine,
    streams: int,
    text: str,
    s: LoadSettings,
    profiler: StepProfiler | None = None,
) -> LoadPoint:
    """Keep `streams` streams in flight (see the module docstring); leaves the engine empty.

    `profiler`: records a window of the steps (`StepProfiler`; its step count runs on across
    points).

    Raises:
        ValueError: streams < 1 or a bad setting.
    """
    if streams < 1:
        raise ValueError(f"streams must be >= 1, got {streams}")
    s.check()
    load = _Load(engine, streams, text, s, profiler)
    while load.count < streams:  # ramp: `ramp` new streams per step
        load.step(s.ramp)
    load.run_until(time.perf_counter() + s.warmup, streams)
    load.tracker.start_window()
    steps, frames, boosts = engine.steps, engine.frames_generated, engine.boost_steps
    sorts = engine.runner.full_sort_rows
    started, t0 = load.count, time.perf_counter()
    load.run_until(t0 + s.duration, streams)
    load.tracker.end_window()
    seconds = time.perf_counter() - t0
    counts = (
        engine.steps - steps,
        engine.frames_generated - frames,
        engine.boost_steps - boosts,
        engine.runner.full_sort_rows - sorts,
    )
    started = load.count - started
    load.drain(time.perf_counter() + max(s.duration, 5.0))
    for rid in list(engine.sequences):
        engine.abort(rid)
    return _point(load, streams, engine, seconds, counts, started)


def _point(
    load: _Load,
    streams: int,
    engine: LLMEngine,
    seconds: float,
    counts: tuple[int, int, int, int],
    started: int,
) -> LoadPoint:
    """The point from the window's (steps, frames, boost steps, full-sort draws) and the
    tracker."""
    steps, frames, boosts, sorts = counts
    tracker = load.tracker
    audio_fps = tracker.audio_frames / seconds
    ff, fc = _percentiles(tracker.first_frame), _percentiles(tracker.first_chunk_s)
    return LoadPoint(
        streams=streams,
        mode="async" if engine.config.async_scheduling else "sync",
        seconds=seconds,
        steps_per_s=steps / seconds,
        frames_per_s=frames / seconds,
        audio_frames_per_s=audio_fps,
        frames_per_step=frames / max(steps, 1),
        boost_share=boosts / max(steps, 1),
        realtime_margin=audio_fps / (streams * FRAMES_PER_SECOND),
        streams_started=started,
        streams_finished=tracker.finished,
        first_frame_p50=ff[0],
        first_frame_p99=ff[1],
        first_chunk_p50=fc[0],
        first_chunk_p99=fc[1],
        first_chunk_missing=len(tracker.awaiting),
        full_sort_share=sorts / max(frames, 1),
    )


def prompt_positions(model: DualARTransformer, tokenizer: FishTokenizer, text: str) -> int:
    """Positions of the prompt the engine builds for `text` (no references, one segment).

    Raises:
        ValueError: nothing to speak in `text` (a `--context` too small for any words).
    """
    try:
        plan = plan_long_text(tokenizer, model.config.num_codebooks, text, [], 0)
    except ValueError as exc:
        raise ValueError(f"no prompt for --context: {exc}") from exc
    return int(plan.next_prompt(0).shape[1])


def load_engine(
    model: DualARTransformer,
    tokenizer: FishTokenizer,
    mode: str,
    max_streams: int,
    s: LoadSettings,
    prompt_len: int,
) -> LLMEngine:
    """An engine for up to `max_streams` streams of `prompt_len + s.frames` positions each,
    static-shape steps as in the server (CUDA graphs on a GPU).

    Raises:
        ValueError: an unknown mode, a KV cache the device cannot hold (lower streams), or
            an SM partition that cannot be made (`engine_sms`).
    """
    if mode not in LOAD_MODES:
        raise ValueError(f"unknown mode {mode!r}; use one of {', '.join(LOAD_MODES)}")
    block = 16
    per_seq = -(-(prompt_len + s.frames + 16) // block)
    config = EngineConfig(
        kv_cache_dtype=s.kv_cache_dtype,
        block_size=block,
        max_num_seqs=max_streams,
        max_num_batched_tokens=s.max_num_batched_tokens,
        num_kv_blocks=per_seq * max_streams + 8,
        decoder_workspace_bytes=0,
        top_k_prefilter=s.top_k_prefilter,
        async_scheduling=mode == "async",
        static_decode=True,  # as the server's steps (on CUDA always; on a CPU, async needs it)
        boost_frames=s.boost_frames,
        boost_min_running=s.boost_min_running,
    )
    try:
        engine = LLMEngine(model, tokenizer, config, _step_stream(model, mode, s.engine_sms))
    except (torch.cuda.OutOfMemoryError, MemoryError) as exc:
        raise ValueError(
            f"{max_streams} streams need {config.num_kv_blocks:,} KV blocks, more than the "
            f"device holds ({str(exc).splitlines()[0][:120]}): lower --streams"
        ) from exc
    except RuntimeError as exc:  # the CPU allocator's failure is a plain RuntimeError
        if "allocate" not in str(exc):
            raise
        raise ValueError(
            f"{max_streams} streams need {config.num_kv_blocks:,} KV blocks, more than memory "
            "holds: lower --streams"
        ) from exc
    if engine.device.type == "cuda":  # as the server: no compilation inside a measurement
        warm_up_general_path(engine)
    return engine


def _step_stream(
    model: DualARTransformer, mode: str, engine_sms: int | None
) -> torch.cuda.Stream | None:
    """The stream of an SM partition of `engine_sms` SMs for the steps (None: none), as the
    server makes it (`fishserve.server.runtime.sm_partitions`; one split per device and
    process: a second mode reuses the first one's partition and stream priority).

    Raises:
        SMPartitionError (a ValueError): not a CUDA model, or the partition cannot be made.
    """
    if engine_sms is None:
        return None
    device = model.embeddings.weight.device
    priority = ASYNC_STEP_STREAM_PRIORITY if mode == "async" else STEP_STREAM_PRIORITY
    return make_disjoint_partitions(device, engine_sms, None, priority)[0].stream


def check_request(
    model: DualARTransformer, streams: list[int], modes: list[str], s: LoadSettings, prompt: int
) -> None:
    """Refuse a run that would not measure what it says.

    Raises:
        ValueError: a bad setting; no, repeated or non-positive stream counts or modes; or a
            prompt of `prompt` positions plus `s.frames` that exceeds the model's context
            (the streams would end early, with fewer frames than asked).
    """
    s.check()
    if not streams or min(streams) < 1 or len(set(streams)) != len(streams):
        raise ValueError(f"streams must be distinct numbers >= 1, got {streams}")
    if not modes or len(set(modes)) != len(modes):
        raise ValueError(f"modes must be distinct, got {modes}")
    limit = model.config.max_seq_len
    if prompt + s.frames > limit:
        raise ValueError(
            f"a prompt of {prompt} positions (--context {s.context}) + --frames {s.frames} "
            f"exceeds the model's context of {limit}: lower them"
        )


def run_engine_load(
    model: DualARTransformer,
    tokenizer: FishTokenizer,
    streams: list[int],
    modes: list[str],
    settings: LoadSettings,
    output: Path | None,
    console: Console,
) -> list[LoadPoint]:
    """Every mode at every number of streams (one engine per mode); prints a table and, with
    `output`, writes it as JSON (+ .md; NaN written as null).

    Raises:
        ValueError: what `check_request` and `load_engine` raise.
    """
    text = prompt_text(tokenizer, settings.context)
    prompt = prompt_positions(model, tokenizer, text)
    check_request(model, streams, modes, settings, prompt)
    points: list[LoadPoint] = []
    probe = host_probe_ms()  # before the run: the engine's threads would slow it
    device = model.embeddings.weight.device
    gpu = device_probe(device) if device.type == "cuda" else None  # with the device's name
    profiler = StepProfiler.from_env()  # FISHSERVE_TORCH_PROFILER_DIR: a window of steps
    with progress_bar(console=console) as progress:
        task = progress.add_task("engine under load", total=len(modes) * len(streams))
        for mode in modes:
            engine = load_engine(model, tokenizer, mode, max(streams), settings, prompt)
            for n in streams:
                points.append(run_load_point(engine, n, text, settings, profiler))
                progress.advance(task)
            del engine
    profiler.close()
    lines = notes(points, probe) + ([describe(gpu)] if gpu is not None else [])
    if profiler.written:
        lines.append(
            f"steps {profiler.start_step}..{profiler.start_step + profiler.num_steps - 1} were "
            f"profiled ({profiler.written[0]}): the point they fell in was slowed by the "
            "recording and its export; measure in a run without the profiler"
        )
    markdown = "\n".join([render_points(points, console), "", *lines])
    console.print("\n".join(lines), highlight=False, markup=False)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "settings": asdict(settings),
            "prompt_positions": prompt,
            "device": gpu["device"] if gpu is not None else str(device),
            "host_probe_ms": probe,
            "device_probe": gpu,
            "points": [_json_ready(asdict(p)) for p in points],
        }
        output.write_text(json.dumps(payload, indent=2, allow_nan=False))
        output.with_suffix(".md").write_text(markdown + "\n")
    return points


def _json_ready(row: dict) -> dict:
    """NaN (no measurement) as None: strict JSON readers refuse NaN."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}


def notes(points: list[LoadPoint], probe_ms: float) -> list[str]:
    """Lines under the table: the host probe, and the points without a first-chunk time."""
    lines = [f"host probe: {probe_ms:.1f} ms (this machine's CPU; higher is slower)"]
    empty = [f"{p.streams} {p.mode}" for p in points if math.isnan(p.first_chunk_p50)]
    if empty:
        lines.append(
            f"no stream was submitted in the window at {', '.join(empty)}: raise --duration"
        )
    late = [
        f"{p.streams} {p.mode} ({p.first_chunk_missing})" for p in points if p.first_chunk_missing
    ]
    if late:
        lines.append(
            "streams still without a first chunk after the window and a drain as long "
            f"(their times are missing from p99, which understates): {', '.join(late)}"
        )
    return lines


def render_points(points: list[LoadPoint], console: Console) -> str:
    """Print a rich table of the points and return it as markdown."""
    head = [
        "streams",
        "mode",
        "steps/s",
        "frames/s",
        "frames/step",
        "boost share",
        "full sort",
        "RT margin",
        "first frame p50/p99 s",
        "first chunk p50/p99 s",
        "finished",
    ]
    rows = [
        [
            str(p.streams),
            p.mode,
            f"{p.steps_per_s:.1f}",
            f"{p.frames_per_s:,.0f}",
            f"{p.frames_per_step:.0f}",
            f"{p.boost_share:.2f}",
            f"{p.full_sort_share:.3f}",
            f"{p.realtime_margin:.2f}",
            f"{p.first_frame_p50:.3f} / {p.first_frame_p99:.3f}",
            f"{p.first_chunk_p50:.3f} / {p.first_chunk_p99:.3f}",
            str(p.streams_finished),
        ]
        for p in points
    ]
    return tables.render_table(head, rows, console)
