"""Prometheus metrics, defined once, named after vLLM's (`fishserve:` prefix, units in names)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fishserve.engine.engine import EngineStats

if TYPE_CHECKING:
    from fishserve.server.runtime import ServingRuntime

_LATENCY_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
# Finer, for the parts of the time to first audio (seconds).
_FIRST_CHUNK_BUCKETS = (
    0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0
)  # fmt: skip
_FRAME_BUCKETS = (1, 2, 4, 6, 8, 10, 12, 16, 24, 32, 64, 128, 256, 512, 1024)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0)


# Set on an exception whose failure is already counted (`request_failure_total`).
COUNTED_ATTR = "_fishserve_counted"


def mark_counted(exc: BaseException) -> None:
    """Note that `exc`'s request failure has been counted."""
    setattr(exc, COUNTED_ATTR, True)


def was_counted(exc: BaseException) -> bool:
    """Whether `mark_counted(exc)` was called."""
    return getattr(exc, COUNTED_ATTR, False)


class Metrics:
    """All server metrics on a private registry (several servers may live in one process)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.running = Gauge(
            "fishserve:num_requests_running", "Requests in the running batch.", registry=r
        )
        self.waiting = Gauge(
            "fishserve:num_requests_waiting",
            "Requests waiting for admission (including those encoding their references).",
            registry=r,
        )
        self.kv_usage = Gauge(
            "fishserve:kv_cache_usage_perc", "Fraction of KV blocks in use (0-1).", registry=r
        )
        self.decoder_lag = Gauge(
            "fishserve:decoder_lag_seconds",
            "How far behind its streams' deadlines the audio decoder is (0: on time).",
            registry=r,
        )
        self.ttfa = Histogram(
            "fishserve:time_to_first_audio_seconds",
            "From request arrival to the first audio bytes.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "fishserve:e2e_request_latency_seconds",
            "From request arrival to the last audio bytes.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "fishserve:request_queue_time_seconds",
            "From arrival to the first generated frame.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.first_chunk_decode = Histogram(
            "fishserve:first_chunk_decode_seconds",
            "From a stream's first chunk handed to the decoder to its audio (queue and call).",
            buckets=_FIRST_CHUNK_BUCKETS,
            registry=r,
        )
        self.first_chunk_frames = Histogram(
            "fishserve:first_chunk_frames",
            "Code frames in a stream's first audio chunk (21.5 per second of audio).",
            buckets=_FRAME_BUCKETS,
            registry=r,
        )
        self.rtf = Histogram(
            "fishserve:real_time_factor",
            "Generation wall time / audio duration, per request.",
            buckets=_RTF_BUCKETS,
            registry=r,
        )
        self.frames = Counter(
            "fishserve:generation_frames_total",
            "Audio frames generated (21.5 per second of audio).",
            registry=r,
        )
        self.engine_steps = Counter(
            "fishserve:engine_steps_total",
            "Engine steps run; each computes one frame per decoding sequence, so "
            "generation_frames_total / engine_steps_total is the mean batch.",
            registry=r,
        )
        self.boost_steps = Counter(
            "fishserve:engine_boost_steps_total",
            "Engine steps of young streams only (setting boost_frames); included in "
            "engine_steps_total.",
            registry=r,
        )
        self.admission_held = Counter(
            "fishserve:admission_held_total",
            "Engine steps that held a new request because the engine's frame rate did not serve "
            "one more stream at setting realtime_admission's rate (0 when off).",
            registry=r,
        )
        self.stream_frame_rate = Gauge(
            "fishserve:stream_frame_rate",
            "Frames per second each running stream got over the engine's last steps, as "
            "real-time admission measures it (setting realtime_admission; 0 when off or idle).",
            registry=r,
        )
        self.full_sort_rows = Counter(
            "fishserve:sampler_full_sort_rows_total",
            "Slow-token draws the top-k prefilter could not decide, redone with a full sort "
            "over the vocabulary (exact either way, slower); compare with "
            "generation_frames_total. Rows of prompt-only eager steps are not counted.",
            registry=r,
        )
        self.audio_seconds = Counter(
            "fishserve:audio_seconds_total", "Seconds of audio produced.", registry=r
        )
        self.preemptions = Counter(
            "fishserve:num_preemptions_total",
            "Sequences preempted for lack of KV blocks.",
            registry=r,
        )
        self.gpu_busy = Counter(
            "fishserve:gpu_busy_seconds_total",
            "Time the device spent on each component's work: llm (engine steps) and decoder "
            "(audio decode calls, on their own CUDA stream), measured with CUDA events on a "
            "random one in eight units of work, each counted eight times (host wall time of "
            "every unit on CPU). Both can run at once, so their sum can exceed wall time.",
            ["component"],
            registry=r,
        )
        self.decoder_frames = Counter(
            "fishserve:decoder_frames_total", "Code frames decoded to audio.", registry=r
        )
        self.decoder_calls = Counter(
            "fishserve:decoder_calls_total", "Batched decoder calls.", registry=r
        )
        self.decoder_jobs = Counter(
            "fishserve:decoder_jobs_total",
            "Audio chunks decoded (frames / jobs is the mean chunk length in frames).",
            registry=r,
        )
        self.gil_wait = Counter(
            "fishserve:gil_wait_seconds",
            "Summed lateness of the GIL probe's wake-ups in the engine's process (setting "
            "gil_probe): divided by gil_probe_wakeups_total, the mean time a thread there waits "
            "to get Python's GIL back (every PyTorch call of the engine and decoder threads "
            "pays it; ~0.07 ms is the OS timer's own slack).",
            registry=r,
        )
        self.gil_wakeups = Counter(
            "fishserve:gil_probe_wakeups", "Wake-ups of the GIL probe.", registry=r
        )
        self._seen: dict[str, float] = {}
        self.success = Counter(
            "fishserve:request_success_total",
            "Requests that delivered all their audio, by finish reason: stop (the model ended "
            "every segment), length (a segment reached its frame budget).",
            ["finished_reason"],
            registry=r,
        )
        self.failure = Counter(
            "fishserve:request_failure_total",
            "Refused or failed requests by reason: invalid (4xx), busy (429), overloaded "
            "(503), error, timeout, cancelled (client gone).",
            ["reason"],
            registry=r,
        )

    def update_engine(self, stats: EngineStats, waiting: int) -> None:
        """Copy engine counters into the gauges (called before each scrape); `waiting`:
        requests waiting for admission, as admission counts them (`update_runtime`)."""
        self.running.set(stats.running)
        self.waiting.set(waiting)
        used = stats.blocks_total - stats.blocks_free
        self.kv_usage.set(used / stats.blocks_total if stats.blocks_total else 0.0)
        self._advance("preemptions", self.preemptions, stats.preemptions)
        self._advance("frames", self.frames, stats.frames_generated)
        self._advance("engine_steps", self.engine_steps, stats.steps)
        self._advance("boost_steps", self.boost_steps, stats.boost_steps)
        self._advance("admission_held", self.admission_held, stats.admission_held)
        self.stream_frame_rate.set(stats.stream_frame_rate or 0.0)
        self._advance("full_sort_rows", self.full_sort_rows, stats.full_sort_rows)
        self._advance("llm_busy", self.gpu_busy.labels(component="llm"), stats.busy_seconds)

    def update_decoder(self, busy_seconds: float, calls: int, frames: int, jobs: int = 0) -> None:
        """Copy the decoder runner's totals into the counters (called before each scrape)."""
        self._advance("decoder_busy", self.gpu_busy.labels(component="decoder"), busy_seconds)
        self._advance("decoder_calls", self.decoder_calls, calls)
        self._advance("decoder_frames", self.decoder_frames, frames)
        self._advance("decoder_jobs", self.decoder_jobs, jobs)

    def update_runtime(self, runtime: ServingRuntime, encoding: int = 0) -> None:
        """Copy a loaded runtime's engine and decoder totals (called before each scrape);
        `encoding`: requests encoding their references (counted as waiting)."""
        status = runtime.status()
        self.update_engine(status.engine, runtime.pending() + encoding)
        self.decoder_lag.set(status.decoder_lag_seconds)
        self._advance("gil_wait", self.gil_wait, status.gil_wait_seconds)
        self._advance("gil_wakeups", self.gil_wakeups, status.gil_wakeups)
        self.update_decoder(
            status.decoder_busy_seconds,
            status.decoder_calls,
            status.decoder_frames,
            status.decoder_jobs,
        )

    def retire_runtime(self, runtime: ServingRuntime) -> None:
        """Take a stopped runtime's final totals; the next runtime's totals start from 0."""
        self.update_runtime(runtime)
        self._seen.clear()

    def _advance(self, name: str, counter: Counter, total: float) -> None:
        """Increase `counter` by what the running total `total` gained since the last call
        (totals of one runtime never go back; NaN is ignored)."""
        seen = self._seen.get(name, 0.0)
        if total > seen:
            counter.inc(total - seen)
            self._seen[name] = total

    def refused(self, status: int) -> None:
        """Count a request answered with HTTP `status` before any audio: 408 timeout (body
        not received in time), 429 busy, 503 overloaded, other 4xx invalid, other 5xx error
        (other statuses are not failures)."""
        reason = {408: "timeout", 429: "busy", 503: "overloaded"}.get(status)
        if reason is None and 400 <= status < 600:
            reason = "invalid" if status < 500 else "error"
        if reason is not None:
            self.failure.labels(reason=reason).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
