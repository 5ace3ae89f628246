"""What the server itself did during a level, from its Prometheus counters (`GET /metrics`).

fishserve exports `fishserve:decoder_frames_total` and `fishserve:gpu_busy_seconds_total`
(component llm / decoder: device time measured with CUDA events). Reading them before and after
a level gives the decoder's frames per second and the fraction of the level's wall time each
component kept the GPU busy. A server without these counters (a peer server) gives None.
Parsing uses `prometheus_client`'s text parser.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

# Histograms whose mean over a level `rates` gives (from their _sum and _count samples).
MEANS = {
    "server_ttfa_s": "fishserve:time_to_first_audio_seconds",
    "queue_s": "fishserve:request_queue_time_seconds",
    "first_chunk_decode_s": "fishserve:first_chunk_decode_seconds",
    "first_chunk_frames": "fishserve:first_chunk_frames",
}
COUNTERS = {
    "decoder_frames": ("fishserve:decoder_frames_total", {}),
    "decoder_calls": ("fishserve:decoder_calls_total", {}),
    "decoder_jobs": ("fishserve:decoder_jobs_total", {}),
    "llm_busy_s": ("fishserve:gpu_busy_seconds_total", {"component": "llm"}),
    "decoder_busy_s": ("fishserve:gpu_busy_seconds_total", {"component": "decoder"}),
    "engine_steps": ("fishserve:engine_steps_total", {}),
    "boost_steps": ("fishserve:engine_boost_steps_total", {}),
    "frames": ("fishserve:generation_frames_total", {}),
    "full_sort_rows": ("fishserve:sampler_full_sort_rows_total", {}),
    "gil_wait_s": ("fishserve:gil_wait_seconds_total", {}),
    "gil_wakeups": ("fishserve:gil_probe_wakeups_total", {}),
    **{
        f"{short}_{part}": (f"{name}_{part}", {})
        for short, name in MEANS.items()
        for part in ("sum", "count")
    },
}


@dataclass(frozen=True)
class ServerRates:
    """Server-side rates over one level (None where the server has no such counter).

    Attributes:
        decoder_frames_per_s: code frames decoded to audio per wall second.
        llm_busy, decoder_busy: fraction of wall time the engine steps / decoder calls kept the
            GPU busy (they overlap on separate CUDA streams, so the sum can exceed 1).
        steps_per_s: engine steps per wall second (1,000 / steps_per_s is the mean step period
            in ms while the engine always has work); frames_per_step: frames generated per
            step, the mean decode batch.
        full_sort_share: the fraction of generated frames whose slow token the top-k
            prefilter left to the full sort (`fishserve:sampler_full_sort_rows_total`).
        decoder_frames_per_call: new frames per batched decoder call (small calls pay the
            call's fixed costs for few frames).
        decoder_frames_per_job: new frames per audio chunk (each chunk also decodes the
            left context again, ~15 frames, so short chunks cost the decoder most).
        gil_wait_ms: mean milliseconds a thread of the engine's process waited to get the
            GIL back (the GIL probe's `fishserve:gil_wait_seconds_total` per wake-up).
        boost_share: the fraction of engine steps that were boost steps of young streams
            (`fishserve:engine_boost_steps_total`; server setting boost_frames).
        server_ttfa_s, queue_s, first_chunk_decode_s, first_chunk_frames: means over the
            level's requests of the server's time to first audio, its arrival to first frame,
            its first chunk's decoder queue and call (seconds) and that chunk's frames: what
            is left of TTFA after the other two is generating the first chunk's other frames
            (docs/benchmarks.md §6.29).
    """

    decoder_frames_per_s: float | None = None
    llm_busy: float | None = None
    decoder_busy: float | None = None
    steps_per_s: float | None = None
    frames_per_step: float | None = None
    full_sort_share: float | None = None
    decoder_frames_per_call: float | None = None
    decoder_frames_per_job: float | None = None
    gil_wait_ms: float | None = None
    boost_share: float | None = None
    server_ttfa_s: float | None = None
    queue_s: float | None = None
    first_chunk_decode_s: float | None = None
    first_chunk_frames: float | None = None


def parse_counters(text: str) -> dict[str, float]:
    """The `COUNTERS` found in a Prometheus text exposition, by short name."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for short, (name, labels) in COUNTERS.items():
                if sample.name == name and sample.labels == labels:
                    found[short] = float(sample.value)
    return found


async def read_counters(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    """The server's counters now (empty when /metrics is missing or unreadable)."""
    try:
        response = await client.get(url.rstrip("/") + "/metrics", timeout=10.0)
        response.raise_for_status()
        return parse_counters(response.text)
    except (httpx.HTTPError, ValueError):
        return {}


def rates(before: dict[str, float], after: dict[str, float], seconds: float) -> ServerRates:
    """Per-second rates of the counters between two reads `seconds` apart."""

    def rate(name: str) -> float | None:
        if seconds <= 0 or name not in before or name not in after:
            return None
        return (after[name] - before[name]) / seconds

    steps, frames = rate("engine_steps"), rate("frames")
    per_step = frames / steps if steps and frames is not None else None
    full_sort = rate("full_sort_rows")
    share = full_sort / frames if frames and full_sort is not None else None
    decoded, calls = rate("decoder_frames"), rate("decoder_calls")
    per_call = decoded / calls if calls and decoded is not None else None
    jobs = rate("decoder_jobs")
    per_job = decoded / jobs if jobs and decoded is not None else None
    waited, wakeups = rate("gil_wait_s"), rate("gil_wakeups")
    gil_ms = 1e3 * waited / wakeups if wakeups and waited is not None else None
    boosts = rate("boost_steps")
    boost_share = boosts / steps if steps and boosts is not None else None

    def mean(short: str) -> float | None:
        total, count = rate(short + "_sum"), rate(short + "_count")
        return total / count if count and total is not None else None

    return ServerRates(
        decoded,
        rate("llm_busy_s"),
        rate("decoder_busy_s"),
        steps,
        per_step,
        share,
        per_call,
        per_job,
        gil_ms,
        boost_share,
        *(mean(short) for short in MEANS),
    )
