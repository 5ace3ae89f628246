"""Turning `fishserve bench` command-line values into `BenchOptions`."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from fishserve.bench.memory import MemorySource
from fishserve.bench.run import BenchOptions, Mode
from fishserve.bench.workload import (
    LANGUAGES,
    LENGTHS,
    Api,
    RequestShape,
    WorkItem,
    builtin_workload,
    read_workload,
)

MEMORY_SOURCES = ("auto", "health", "nvml", "nvidia-smi", "none")
MAX_SIZE = 65_536  # batch sizes of the speed benches: beyond any GPU's memory for these models
# Streams one `bench` keeps open at most: each holds an HTTP client (~30 KB, made before the
# first request is sent), and 16,384 is far beyond what one GPU serves in real time.
MAX_CONCURRENCY = 16_384


def parse_numbers(text: str, what: str) -> list[float]:
    """ "1,4,16" -> [1.0, 4.0, 16.0].

    Raises:
        ValueError: not a comma-separated list of positive numbers.
    """
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated numbers, got {text!r}") from None
    if not values or min(values) <= 0 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"{what}: expected positive numbers, got {text!r}")
    return values


def parse_sizes(text: str, what: str) -> list[int]:
    """ "1,8,32" -> [1, 8, 32].

    Raises:
        ValueError: not a comma-separated list of positive whole numbers.
    """
    values = parse_numbers(text, what)
    if any(v != int(v) for v in values):
        raise ValueError(f"{what}: expected positive whole numbers, got {text!r}")
    if max(values) > MAX_SIZE:
        raise ValueError(f"{what}: at most {MAX_SIZE:,}, got {text!r}")
    return [int(v) for v in values]


def parse_names(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    """ "short,long" -> ("short", "long"), each checked against `allowed`.

    Raises:
        ValueError: an unknown name.
    """
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise ValueError(f"{what}: choose from {', '.join(allowed)}; got {text!r}")
    return names


def gpu_index(device: str) -> int | None:
    """`cuda` / `cuda:N` -> the GPU index to poll; `cpu` -> None.

    Raises:
        ValueError: any other device string.
    """
    if device == "cpu":
        return None
    if device == "cuda":
        return 0
    if device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    raise ValueError(f"--device must be cpu, cuda or cuda:N, got {device!r}")


def load_workload(spec: str, lengths: str, languages: str) -> tuple[list[WorkItem], str]:
    """The workload ("builtin" or a file path) and its name for the report."""
    if spec == "builtin":
        chosen = (
            parse_names(lengths, LENGTHS, "--lengths"),
            parse_names(languages, LANGUAGES, "--languages"),
        )
        return builtin_workload(*chosen), f"builtin {'+'.join(chosen[0])} {'+'.join(chosen[1])}"
    return read_workload(Path(spec)), spec


def parse_extra_body(text: str | None) -> dict[str, Any]:
    """--extra-body JSON object (fields added to every request body).

    Raises:
        ValueError: not a JSON object.
    """
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--extra-body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("--extra-body must be a JSON object")
    return value


def read_reference_audio(path: Path | None) -> bytes | None:
    """Bytes of the reference audio file, or None.

    Raises:
        FileNotFoundError: the file does not exist.
    """
    if path is None:
        return None
    if not path.is_file():
        raise FileNotFoundError(f"reference audio not found: {path}")
    return path.read_bytes()


def check_url(url: str) -> None:
    """Refuse a server URL that is not http(s)://host[:port][/path] before any request.

    Raises:
        ValueError: another scheme, no host, or a port that is not a number.
    """
    parsed = urlsplit(url)
    try:
        parsed.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError:
        raise ValueError(f"--url: bad port in {url!r}") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"--url: expected http(s)://host[:port], got {url!r}")


def check_output_dir(path: Path) -> None:
    """Create the report folder now, so that a bad `--output-dir` fails before a long run.

    Raises:
        OSError: it cannot be created or is not writable.
    """
    path.mkdir(parents=True, exist_ok=True)
    if not os.access(path, os.W_OK):
        raise PermissionError(f"--output-dir: {path} is not writable")


def bench_options(
    *,
    url: str,
    api: str,
    mode: str,
    concurrency: str,
    rate: str,
    workload: str,
    lengths: str,
    languages: str,
    reference_audio: Path | None,
    reference_text: str,
    reference_id: str | None,
    extra_body: str | None,
    memory_source: str,
    device: str,
    **rest: Any,
) -> BenchOptions:
    """Options of one run from CLI values (`rest`: fields of RequestShape or BenchOptions).

    Raises:
        ValueError, FileNotFoundError: bad values or missing files.
    """
    if api not in ("fish", "openai"):
        raise ValueError(f"--api must be fish or openai, got {api!r}")
    if mode not in ("concurrency", "poisson"):
        raise ValueError(f"--mode must be concurrency or poisson, got {mode!r}")
    if rest.get("audio_format", "pcm") not in ("pcm", "wav"):
        raise ValueError("--format must be pcm or wav (the audio is counted from raw samples)")
    if memory_source not in MEMORY_SOURCES:
        raise ValueError(f"--memory-source must be one of {', '.join(MEMORY_SOURCES)}")
    shape_keys = set(RequestShape.__dataclass_fields__) & set(rest)
    shape = RequestShape(
        api=cast(Api, api),
        reference_audio=read_reference_audio(reference_audio),
        reference_text=reference_text,
        reference_id=reference_id,
        extra_body=parse_extra_body(extra_body),
        **{k: rest.pop(k) for k in shape_keys},
    )
    ramp = rest.get("ramp_s", 0.0)
    if not math.isfinite(ramp) or ramp < 0:
        raise ValueError(f"--ramp must be a finite number of seconds >= 0, got {ramp}")
    if ramp and mode != "concurrency":
        raise ValueError("--ramp applies to --mode concurrency only (Poisson arrivals are spread)")
    check_url(url)
    for key in ("sample_rate", "frame_rate"):
        value = rest.get(key)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"--{key.replace('_', '-')} must be a positive number, got {value}")
    if mode == "concurrency":
        levels = parse_numbers(concurrency, "--concurrency")
        if max(levels) > MAX_CONCURRENCY:
            raise ValueError(
                f"--concurrency: at most {MAX_CONCURRENCY:,} streams, got {concurrency!r}"
            )
    else:
        levels = parse_numbers(rate, "--rate")
    items, name = load_workload(workload, lengths, languages)
    check_output_dir(rest["output_dir"])  # last: a refused run leaves no folder behind
    return BenchOptions(
        url=url,
        workload=items,
        workload_name=name,
        shape=shape,
        mode=cast(Mode, mode),
        levels=levels,
        memory_source=cast(MemorySource, memory_source),
        gpu_index=gpu_index(device),
        **rest,
    )
