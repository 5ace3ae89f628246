"""Server settings from defaults, a YAML file, environment variables and CLI flags.

Precedence, lowest first: built-in defaults < `--config serve.yaml` < `FISHSERVE_<KEY>`
environment variables < command-line flags. Every setting has the same name everywhere:
`gpu_memory_budget` (or `gpu-memory-budget`) in YAML, `FISHSERVE_GPU_MEMORY_BUDGET` in the
environment, `--gpu-memory-budget` on the command line. `memory_budget` is an accepted alias
of `gpu_memory_budget`.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from fishserve.engine.profiler_env import ENV_VARS as STEP_PROFILER_ENV_VARS
from fishserve.engine.sizes import parse_memory_size
from fishserve.models.config import check_checkpoint_folder, check_decoder_in
from fishserve.server.decode_plan import CALL_OVERHEAD_FRAMES, MAX_CALL_OVERHEAD
from fishserve.server.gc_control import MIN_FULL_INTERVAL_S

log = logging.getLogger(__name__)
ENV_PREFIX = "FISHSERVE_"
# Other names accepted for a setting (alias -> setting).
ALIASES = {"memory_budget": "gpu_memory_budget"}
# FISHSERVE_* variables read elsewhere, not settings (no "unknown variable" warning).
OTHER_ENV_VARS = frozenset({"FISHSERVE_FUSION"}) | STEP_PROFILER_ENV_VARS
# Frames per segment when a request does not say (spec §5: the reference HTTP API's 1024).
DEFAULT_MAX_NEW_TOKENS = 1024
# Random weights rarely sample <|im_end|>: cap a segment at ~3 s of audio instead.
RANDOM_WEIGHTS_MAX_NEW_TOKENS = 64


class ServerConfig(BaseModel):
    """Every setting of `fishserve serve` (see `fishserve serve --help` and the README)."""

    # YAML reads `gpu_memory_budget: 0.9` or `api_key: 1234` as numbers: take them as text.
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    # models
    checkpoint: Path | None = None
    decoder_checkpoint: Path | None = None
    decoder_config: Path | None = None
    load_format: Literal["auto", "dummy"] = "auto"
    # Random weights only: "peaked" slow logits take the sampler path real weights are expected
    # to take; "flat" (plain random init) sends every row through the exact fallback.
    dummy_logits: Literal["flat", "peaked"] = "flat"
    device: str = "auto"
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    threads: int | None = Field(None, ge=1, le=1024)  # more fail inside OpenMP
    # engine
    kv_cache_dtype: Literal["auto", "fp32", "bf16", "fp16", "int8", "fp8"] = "auto"
    block_size: int = Field(16, ge=1, le=1024)
    max_num_seqs: int = Field(64, ge=1)
    max_num_batched_tokens: int = Field(2048, ge=1)
    static_prefill_tokens: int = Field(256, ge=0, le=65536)
    gpu_memory_budget: str | None = Field(
        None, validation_alias=AliasChoices("gpu_memory_budget", "memory_budget")
    )
    num_kv_blocks: int | None = Field(None, ge=1)
    enforce_eager: bool = False
    # Launch each engine step before the previous one's frames reach the host, so the host's
    # per-step work overlaps the GPU's (EngineConfig.async_scheduling). Off by default: the
    # server runs 9-39% more engine steps/s and keeps streams at RTF <= 0.5 up to 352 streams
    # on an H200, but its extra frames load the decoder and first audio came later at 384-448
    # streams (docs/benchmarks.md §6.18); with boost_frames, which brings first audio forward,
    # it served the most real-time streams (§6.24).
    async_scheduling: bool = False
    # torch.compile each engine step's fast-transformer half on CUDA before its graphs are
    # captured (EngineConfig.compile_fast_transformer): fewer kernels per step.
    compile_fast_transformer: bool = True
    # Boost steps for young streams (EngineConfig.boost_frames): after every full step, a step
    # of the sequences with fewer than this many audio frames of their first segment, while at
    # least boost_min_running others run; 0 = off. Sync or async scheduling.
    boost_frames: int = Field(0, ge=0, le=8192)
    boost_min_running: int = Field(64, ge=0)
    # Real-time admission (EngineConfig.min_stream_frame_rate, engine.admission): a request
    # that has not run yet is admitted only while the engine's recent frame rate serves one
    # more stream at this many times the audio's frame rate (1.15: 15% headroom); others
    # wait in the queue (max_waiting and request_timeout still apply), so overload shows as
    # time to first audio and "busy" instead of gaps in every stream. 0: off.
    realtime_admission: float = Field(0.0, ge=0, le=100, allow_inf_nan=False)
    engine_process: Literal["auto", "on", "off"] = "auto"
    # With an engine process: where each stream's pipeline (chunking, playback deadlines,
    # timeouts) runs. "core": in the engine's process. "http": in the HTTP process, which
    # relays frames and chunks to decode (server.relay): the engine ran 7-22% more steps per
    # second, but the one HTTP process saturated and time to first audio suffered (p99
    # 0.57-2.0 s at 896 streams, against 0.27 in the core; docs/benchmarks.md §6.28).
    stream_pipeline: Literal["core", "http"] = "core"
    # Seconds a thread of the engine's process runs Python before another thread waiting for
    # the GIL gets it (sys.setswitchinterval; CPython's default is 0.005). Every PyTorch call
    # releases the GIL, and the engine thread waits up to this long to get it back from the
    # decoder thread and the event loop, several times per step (docs/benchmarks.md §6.15).
    gil_switch_interval: float = Field(0.0005, ge=1e-6, le=0.1, allow_inf_nan=False)
    # A thread in the engine's process that measures how long a thread waits for the GIL
    # (GilProbe; fishserve:gil_wait_seconds_total over fishserve:gil_probe_wakeups_total).
    gil_probe: bool = True
    # Seconds between full (generation-2) garbage collections at most, in each server
    # process: CPython's own are held off (each walked every live per-stream object, 50-140 ms
    # at ~700 streams, with the GIL held) and run when the process is idle or after this
    # long (gc_control.DeferredFullCollections); 0: CPython's automatic collections;
    # otherwise at least MIN_FULL_INTERVAL_S.
    gc_full_interval: float = Field(600.0, ge=0, le=86400, allow_inf_nan=False)
    default_max_new_tokens: int | None = Field(None, ge=2, le=8192)
    # audio
    first_chunk_frames: int = Field(10, ge=1)
    # Seconds after arrival by which the first chunk goes out with the frames generated so far
    # (at least half of first_chunk_frames), when the server is too slow to make all of them.
    first_chunk_deadline: float | None = Field(None, gt=0, allow_inf_nan=False)
    chunk_frames: int = Field(64, ge=1)
    # Each later chunk is this many times the previous one (up to chunk_frames): 2 gives
    # 10, 20, 40, 64 frames. Smaller grows the playing client's buffer sooner where streams
    # are generated at less than about twice real time, for a few more decoder calls.
    chunk_growth: float = Field(2.0, ge=1.0, le=16.0, allow_inf_nan=False)
    # Seconds before a playing client runs out of audio at which the frames generated so far
    # go out as a shorter chunk. Smaller: longer chunks, fewer decoder calls, more risk of a gap.
    early_chunk_margin: float = Field(0.25, gt=0, le=5.0, allow_inf_nan=False)
    # While a client playing in real time since its first chunk is out of audio (the audio
    # sent is behind that clock), its stream's early chunks wait for at least this many
    # frames (a player rebuffering) instead of half the first chunk:
    # under overload, stalled streams send fewer, longer chunks (less decoder and host work
    # per frame). 0: off. Not measured on a GPU yet (docs/benchmarks.md §6.30).
    rebuffer_frames: int = Field(0, ge=0, le=4096)
    # Small decoder calls when the decoder shares every SM with the engine: its long convolution
    # kernels hold the SMs while an engine step's short kernels wait (docs/benchmarks.md §6.3).
    # On its own SMs (decoder_sms) larger calls are better: 16 measured best (§6.7).
    max_decode_batch: int = Field(8, ge=1)
    # Seconds a queued audio chunk may wait for others to share its decoder call (chunks due
    # within 0.15 s never wait); 0: decode whatever is queued at once.
    decoder_batch_wait: float = Field(0.0, ge=0, le=1.0, allow_inf_nan=False)
    # A decoder call's fixed cost in padded job-frames, by which the decoder weighs padding
    # short chunks into one larger call against several calls (server.decode_plan). 64 is the
    # decoder's own on an idle H200 (§6.9); beside a busy engine a call costs more (§6.29).
    decoder_call_overhead: float = Field(
        CALL_OVERHEAD_FRAMES, ge=0, le=MAX_CALL_OVERHEAD, allow_inf_nan=False
    )
    # Launch the next decoder call while the host still hands out the last one's audio (and,
    # with a full call queued, behind the running call): the decoder's GPU does not wait for
    # the decoder thread's host work between calls. Ignored with gpu_sharing "turns".
    decoder_pipeline: bool = True
    # Refuse new requests (503, Retry-After) while the audio decoder is more than this many
    # seconds behind its streams' deadlines: accepted streams stay real time instead of every
    # stream degrading; None: never (e.g. for offline synthesis on a slow device).
    max_decoder_lag: float | None = Field(None, gt=0, allow_inf_nan=False)
    decoder_compile: bool = False
    # HiFi-GAN head kernels on the GPU: fused channels-last Triton convolutions or cuDNN.
    decoder_kernels: Literal["auto", "triton", "torch"] = "auto"
    # How engine steps and decoder calls share the GPU: "overlap" (at once, on two CUDA
    # streams) or "turns" (one decoder call between steps, never at once); docs/benchmarks.md
    # §6.5: a step beside decoder calls lasts two to three of them.
    gpu_sharing: Literal["overlap", "turns"] = "overlap"
    # Run the decoder on this many of the GPU's SMs (a CUDA green context), leaving the rest to
    # the engine's kernels while it is busy; None: the decoder may use every SM.
    decoder_sms: int | None = Field(None, ge=1)
    # Reserve this many SMs for the engine (green contexts): the decoder runs on decoder_sms of
    # the others (None: all of them), the engine's eager kernels only on these, its CUDA
    # graphs anywhere (see confine_engine_graphs); None: no partition. Needs NVIDIA's
    # cuda-bindings package.
    engine_sms: int | None = Field(None, ge=1)
    # With engine_sms: capture the engine's decode graphs on its partition's stream, so they
    # run on its SMs only. Off: only its eager kernels (prefill, copies) stay there and the
    # graphs may use the decoder's SMs too, at the step stream's priority (docs/benchmarks.md
    # §6.21: confined, the engine ran about a quarter fewer steps per second at 448 streams).
    confine_engine_graphs: bool = False
    max_reference_seconds: float = Field(30.0, gt=0, allow_inf_nan=False)
    # HTTP
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    # An empty key would turn authentication off without saying so: omit it for that.
    api_key: str | None = Field(None, min_length=1)
    references_dir: Path = Path("references")
    max_waiting: int = Field(256, ge=1)
    max_text_length: int = Field(10_000, ge=1)
    max_body_bytes: int = Field(32 * 2**20, ge=1024)
    request_timeout: float = Field(600.0, gt=0, allow_inf_nan=False)
    # Open connections or running requests at most (uvicorn's limit_concurrency): beyond it a
    # request gets 503 with Retry-After (a flood of slow uploads exhausted the descriptors).
    max_connections: int = Field(4096, ge=1)
    # Seconds a stopping server waits for open connections and running requests (then closes
    # them): without a bound a client stalling its upload kept the server up forever.
    shutdown_timeout: float = Field(30.0, gt=0, allow_inf_nan=False)
    lazy_load: bool = False
    idle_unload_seconds: float = Field(0.0, ge=0, allow_inf_nan=False)

    @field_validator("engine_process", mode="before")
    @classmethod
    def _on_off(cls, value: object) -> object:
        """YAML reads `on`/`off` as booleans: take them as the words."""
        if isinstance(value, bool):
            return "on" if value else "off"
        return value

    @field_validator(
        "threads",
        "num_kv_blocks",
        "default_max_new_tokens",
        "first_chunk_deadline",
        "decoder_sms",
        "engine_sms",
        "max_decoder_lag",
        "early_chunk_margin",
        "decoder_batch_wait",
        "decoder_call_overhead",
        "rebuffer_frames",
        "realtime_admission",
        "gpu_memory_budget",
        "gil_switch_interval",
        mode="before",
    )
    @classmethod
    def _number(cls, value: object) -> object:
        """`none` (the README's word for unset) means unset (refused where a setting has no
        unset state); YAML's on/off/true/false are refused (pydantic would read them as 1 and 0:
        `decoder_sms: on` as one SM, `decoder_batch_wait: on` as 1 s)."""
        if isinstance(value, str) and value.strip().lower() in ("none", "null"):
            return None
        if isinstance(value, bool):
            raise ValueError("give a number (or none), not on/off or true/false")
        return value

    @field_validator("gpu_memory_budget")
    @classmethod
    def _memory_size(cls, value: str | None) -> str | None:
        """Checked with the other settings, not once the models have loaded."""
        if value is not None:
            parse_memory_size(value)
        return value

    @field_validator("api_key")
    @classmethod
    def _header_safe(cls, value: str | None) -> str | None:
        """The key travels in an HTTP header, which carries ASCII (RFC 9110 §5.5): another
        character could never be matched."""
        if value is not None and not all("!" <= c <= "~" for c in value):
            raise ValueError("use printable ASCII without spaces (it is sent in an HTTP header)")
        return value

    @field_validator("gc_full_interval")
    @classmethod
    def _full_interval(cls, value: float) -> float:
        """Below `MIN_FULL_INTERVAL_S` the held-off collections would run more often than
        CPython's own (every poll of the collector thread)."""
        if 0 < value < MIN_FULL_INTERVAL_S:
            raise ValueError(
                f"give 0 (CPython's automatic collections) or at least {MIN_FULL_INTERVAL_S:g} "
                "seconds"
            )
        return value

    @field_validator("max_num_batched_tokens")
    @classmethod
    def _covers_a_decode_step(cls, value: int, info: ValidationInfo) -> int:
        """A step must fit one position of every running sequence."""
        seqs = info.data.get("max_num_seqs")
        if seqs is not None and value < seqs:
            raise ValueError(f"must be >= max_num_seqs ({seqs})")
        return value

    @property
    def random_weights(self) -> bool:
        """True when the server runs random weights (no checkpoint, or `load_format` dummy)."""
        return self.checkpoint is None or self.load_format == "dummy"

    @property
    def max_new_tokens(self) -> int:
        """Frames per segment for requests that do not say: `default_max_new_tokens`, else
        1024 with real weights and 64 with random weights."""
        if self.default_max_new_tokens is not None:
            return self.default_max_new_tokens
        return RANDOM_WEIGHTS_MAX_NEW_TOKENS if self.random_weights else DEFAULT_MAX_NEW_TOKENS

    @classmethod
    def load(
        cls,
        yaml_path: Path | None = None,
        overrides: dict[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> ServerConfig:
        """Merge the sources in precedence order and validate.

        Unknown `FISHSERVE_*` environment variables are logged (a warning) and ignored.

        Raises:
            FileNotFoundError: the YAML file does not exist.
            ValueError: unknown keys or invalid values, one line per bad setting naming it,
                its value and where it came from.
        """
        values: dict[str, Any] = {}
        origins: dict[str, str] = {}
        if yaml_path is not None:
            for key, value in _read_yaml(Path(yaml_path)).items():
                _put(values, origins, str(key), value, str(yaml_path))
        env = os.environ if environ is None else environ
        for name in _env_names(env):
            _put(values, origins, name[len(ENV_PREFIX) :].lower(), env[name], name)
        for key, value in (overrides or {}).items():
            if value is not None:
                _put(values, origins, key, value, "--" + key.replace("_", "-"))
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise ValueError(settings_error(exc, origins)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (the last one silently
    won: a setting changed at the top of a file was undone by an old line below)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """The mapping of `node`; a key written twice in it (spelt with `-` or `_`, or as a
        setting and its alias) is a `yaml.constructor.ConstructorError`. Keys merged in with
        ``<<`` may be overridden, as YAML means them to be."""
        seen: dict[str, str] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = str(self.construct_object(key_node))  # type: ignore[no-untyped-call]
            name = _setting_name(key)
            if name in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"setting {name!r} is given twice ({seen[name]!r}, {key!r})",
                    key_node.start_mark,
                )
            seen[name] = key
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: Path) -> dict[Any, Any]:
    """The mapping in a YAML settings file.

    Raises:
        FileNotFoundError: no such file. ValueError: not UTF-8, not YAML, not a mapping, or a
            setting given twice.
    """
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    try:
        loaded = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML: {exc}".splitlines()[0]) from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: expected a mapping of settings (key: value lines)")
    return loaded


def _setting_name(key: str) -> str:
    """The setting a YAML key or flag names: `-` read as `_`, an alias as its setting."""
    key = key.replace("-", "_")
    return ALIASES.get(key, key)


def _put(
    values: dict[str, Any], origins: dict[str, str], key: str, value: Any, origin: str
) -> None:
    """Set `values[key]` (`-` read as `_`, an alias as its setting) and note where it came
    from."""
    key = _setting_name(key)
    values[key] = value
    origins[key] = origin


def _env_names(env: Mapping[str, str]) -> list[str]:
    """The `FISHSERVE_*` variables that name settings; warns about the others."""
    known = set(ServerConfig.model_fields) | set(ALIASES)
    names = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in OTHER_ENV_VARS:
            continue
        if name[len(ENV_PREFIX) :].lower() in known:
            names.append(name)
        else:
            log.warning("ignoring unknown environment variable %s%s", name, _suggest(name))
    return names


def _suggest(name: str) -> str:
    """`; did you mean X?` for a misspelt setting or variable name, else ``."""
    bare = name.removeprefix(ENV_PREFIX).lower().replace("-", "_")
    match = difflib.get_close_matches(bare, list(ServerConfig.model_fields), n=1)
    if not match:
        return ""
    env = name.startswith(ENV_PREFIX)
    return f"; did you mean {ENV_PREFIX + match[0].upper() if env else match[0]}?"


def settings_error(exc: ValidationError, origins: Mapping[str, str]) -> str:
    """One readable line per bad setting: its name, value, source and what is wrong."""
    lines = ["invalid server settings:"]
    for err in exc.errors(include_url=False):
        key = str(err["loc"][0]) if err["loc"] else "settings"
        key = ALIASES.get(key, key)
        where = origins.get(key, "default")
        if err["type"] == "extra_forbidden":
            lines.append(f"  {key} (from {where}): unknown setting{_suggest(key)}")
        else:
            message = err["msg"].removeprefix("Value error, ")
            lines.append(f"  {key} = {err['input']!r} (from {where}): {message}")
    return "\n".join(lines)


def _check_references_dir(folder: Path) -> None:
    """Create `folder` (the voice store) if missing and check it is a writable folder.

    Raises:
        ValueError: not a folder, cannot be created, or not writable.
    """
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"references_dir is not a folder: {folder}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"references_dir {folder} cannot be created: {exc.strerror}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"references_dir {folder} is not writable")


def check_model_files(config: ServerConfig) -> None:
    """The files and folders `config` names exist (no PyTorch needed: the CLI checks them
    before importing it, so a wrong path fails in a second).

    Raises:
        FileNotFoundError: a checkpoint folder, decoder weights or decoder config is missing.
        ValueError: `references_dir` is not a folder, cannot be created or is not writable.
    """
    if config.checkpoint is not None:
        check_checkpoint_folder(config.checkpoint)
    for name in ("decoder_checkpoint", "decoder_config"):
        path = getattr(config, name)
        if path is not None and not path.is_file():
            raise FileNotFoundError(f"{name} file not found: {path}")
    _check_references_dir(config.references_dir)
    needs_file = config.decoder_checkpoint is None and not config.random_weights
    if needs_file and config.checkpoint is not None:
        check_decoder_in(config.checkpoint)
