"""Server settings: one name per setting for flags, YAML and environment, documented defaults,
readable validation errors."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import typer

from fishserve.cli import app
from fishserve.cli.serving import default_text
from fishserve.server.config import ServerConfig
from tests.conftest import tiny_server_config

README = Path(__file__).parents[2] / "README.md"


def serve_options() -> dict[str, typer.core.TyperOption]:
    """`fishserve serve`'s options by parameter name (without --config)."""
    command = typer.main.get_command(app).commands["serve"]
    return {p.name: p for p in command.params if p.name not in ("config", "help")}


def test_every_flag_is_a_setting_of_the_same_name():
    options = serve_options()
    assert set(options) == set(ServerConfig.model_fields)
    for name, option in options.items():
        assert "--" + name.replace("_", "-") in option.opts
        assert "[default: " in option.help, name


def test_every_setting_works_as_yaml_key_and_environment_variable(tmp_path, caplog):
    values = {
        "gpu_memory_budget": "6GiB",
        "threads": "2",
        "default_max_new_tokens": "100",
        "request_timeout": "5",
        "max_body_bytes": "4096",
        "first_chunk_frames": "3",
    }
    env = {"FISHSERVE_" + k.upper(): v for k, v in values.items()}
    from_env = ServerConfig.load(environ=env)
    yaml_file = tmp_path / "serve.yaml"
    yaml_file.write_text("".join(f"{k.replace('_', '-')}: '{v}'\n" for k, v in values.items()))
    from_yaml = ServerConfig.load(yaml_file, environ={})
    for key, value in values.items():
        assert (
            str(getattr(from_env, key))
            == str(getattr(from_yaml, key))
            == str(type(getattr(from_env, key))(value))
        )
    assert not caplog.records  # nothing unknown


def test_memory_budget_alias_and_precedence(tmp_path):
    yaml_file = tmp_path / "serve.yaml"
    yaml_file.write_text("gpu_memory_budget: 2GiB\n")
    env = {"FISHSERVE_MEMORY_BUDGET": "3GiB"}
    assert ServerConfig.load(yaml_file, environ=env).gpu_memory_budget == "3GiB"
    flags = {"gpu_memory_budget": "4GiB"}
    assert ServerConfig.load(yaml_file, flags, environ=env).gpu_memory_budget == "4GiB"
    yaml_file.write_text("memory_budget: 0.5\n")
    assert ServerConfig.load(yaml_file, environ={}).gpu_memory_budget == "0.5"


def test_unknown_environment_variables_are_warned_about(caplog):
    env = {"FISHSERVE_PROT": "9000", "FISHSERVE_FUSION": "0", "FISHSERVE_PORT": "9001"}
    with caplog.at_level(logging.WARNING):
        config = ServerConfig.load(environ=env)
    assert config.port == 9001
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "ignoring unknown environment variable FISHSERVE_PROT; did you mean FISHSERVE_PORT?"
    ]


def test_validation_errors_are_one_line_per_setting(tmp_path):
    yaml_file = tmp_path / "serve.yaml"
    yaml_file.write_text("block_size: 0\nportt: 1\n")
    with pytest.raises(ValueError) as info:
        ServerConfig.load(
            yaml_file,
            {"port": 70000, "gpu_memory_budget": "10XB"},
            environ={"FISHSERVE_DTYPE": "fp64"},
        )
    lines = str(info.value).splitlines()
    assert lines[0] == "invalid server settings:"
    assert sorted(lines[1:]) == [
        f"  block_size = 0 (from {yaml_file}): Input should be greater than or equal to 1",
        "  dtype = 'fp64' (from FISHSERVE_DTYPE): Input should be 'auto', 'fp32', 'bf16' or 'fp16'",
        "  gpu_memory_budget = '10XB' (from --gpu-memory-budget): not a memory size: '10XB' "
        "(use e.g. 4GiB, 512MiB or 0.9)",
        "  port = 70000 (from --port): Input should be less than or equal to 65535",
        f"  portt (from {yaml_file}): unknown setting; did you mean port?",
    ]
    assert "pydantic" not in str(info.value)


@pytest.mark.parametrize("key", ["ключ", "sécret", "two words"])
def test_an_api_key_no_header_can_carry_is_refused(key):
    with pytest.raises(ValueError, match="printable ASCII without spaces"):
        ServerConfig.load(overrides={"api_key": key}, environ={})


def test_an_empty_api_key_is_refused_not_read_as_no_key():
    with pytest.raises(ValueError, match=r"api_key = '' \(from --api-key\)"):
        ServerConfig.load(overrides={"api_key": ""}, environ={})


def test_readme_lists_every_setting_with_its_default():
    rows = {}
    for line in README.read_text().splitlines():
        match = re.match(r"\| `([a-z_]+)` \| `([^`]*)` \|", line)
        if match:
            rows[match.group(1)] = match.group(2)
    for name, field in ServerConfig.model_fields.items():
        assert name in rows, f"README settings table lacks {name}"
        assert rows[name] == default_text(field.default), name


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, 64),  # no checkpoint: random weights
        ({"checkpoint": "x", "load_format": "dummy"}, 64),
        ({"checkpoint": "x"}, 1024),
        ({"default_max_new_tokens": 300}, 300),
    ],
)
def test_default_frames_per_segment(settings, expected):
    assert ServerConfig(**settings).max_new_tokens == expected


def test_a_step_must_hold_every_running_sequence():
    with pytest.raises(ValueError) as info:
        ServerConfig.load(None, {"max_num_seqs": 128, "max_num_batched_tokens": 64}, environ={})
    assert "max_num_batched_tokens = 64 (from --max-num-batched-tokens)" in str(info.value)
    assert "must be >= max_num_seqs (128)" in str(info.value)
    ok = ServerConfig.load(None, {"max_num_seqs": 128, "max_num_batched_tokens": 128}, environ={})
    assert ok.max_num_batched_tokens == 128


def test_optional_numbers_take_none_and_refuse_on_off(tmp_path):
    """`none` means unset everywhere; YAML's `on` must not become 1 (one SM, one thread)."""
    assert ServerConfig.load(environ={"FISHSERVE_DECODER_SMS": "none"}).decoder_sms is None
    assert (
        ServerConfig.load(
            overrides={"first_chunk_deadline": "None"}, environ={}
        ).first_chunk_deadline
        is None
    )
    yaml_file = tmp_path / "serve.yaml"
    yaml_file.write_text("decoder_sms: 96\nthreads: null\n")
    assert ServerConfig.load(yaml_file, environ={}).decoder_sms == 96
    for name in ("decoder_sms", "engine_sms"):
        for word in ("on", "true", "off"):
            yaml_file.write_text(f"{name}: {word}\n")
            with pytest.raises(ValueError, match=rf"{name} = .*not on/off or true/false"):
                ServerConfig.load(yaml_file, environ={})
    assert ServerConfig.load(environ={"FISHSERVE_ENGINE_SMS": "none"}).engine_sms is None
    assert ServerConfig.load(environ={"FISHSERVE_ENGINE_SMS": "56"}).engine_sms == 56


@pytest.mark.parametrize(
    "name",
    [
        "early_chunk_margin",
        "decoder_batch_wait",
        "max_decoder_lag",
        "decoder_call_overhead",
        "realtime_admission",
    ],
)
def test_audio_timing_settings_refuse_on_off_and_nan(tmp_path, name):
    """YAML's `on` silently became 1.0 s; NaN was reported as out of range."""
    yaml_file = tmp_path / "serve.yaml"
    yaml_file.write_text(f"{name}: on\n")
    with pytest.raises(ValueError, match=rf"{name} = .*not on/off or true/false"):
        ServerConfig.load(yaml_file, environ={})
    with pytest.raises(ValueError, match=rf"{name} = .*finite number"):
        ServerConfig.load(overrides={name: "nan"}, environ={})


def test_rebuffer_frames_refuses_on_off_and_negative(tmp_path):
    """YAML's `on` would read as 1 frame, which is no floor at all."""
    yaml_file = tmp_path / "serve.yaml"
    yaml_file.write_text("rebuffer_frames: on\n")
    with pytest.raises(ValueError, match=r"rebuffer_frames = .*not on/off or true/false"):
        ServerConfig.load(yaml_file, environ={})
    with pytest.raises(ValueError, match=r"rebuffer_frames = -1"):
        ServerConfig.load(overrides={"rebuffer_frames": -1}, environ={})
    assert ServerConfig.load(overrides={"rebuffer_frames": "24"}, environ={}).rebuffer_frames == 24


def test_realtime_admission_becomes_the_engines_minimum_stream_rate(tmp_path):
    """The setting is a multiple of the audio's frame rate; the engine gets frames/s."""
    from fishserve.server.runtime import build_local_runtime

    loaded = ServerConfig.load(overrides={"realtime_admission": "1.1"}, environ={})
    assert loaded.realtime_admission == 1.1
    with pytest.raises(ValueError, match=r"realtime_admission = -1"):
        ServerConfig.load(overrides={"realtime_admission": -1}, environ={})
    config = tiny_server_config(tmp_path, load_format="dummy", realtime_admission=2.0)
    runtime = build_local_runtime(config)
    try:
        gate = runtime.engine.engine.admission
        assert gate is not None
        assert gate.min_rate == pytest.approx(2.0 * 44100 / 256)  # tiny decoder: 256 samples
    finally:
        runtime.shutdown()


@pytest.mark.parametrize(
    "name",
    [
        "max_reference_seconds",
        "request_timeout",
        "shutdown_timeout",
        "idle_unload_seconds",
        "first_chunk_deadline",
    ],
)
def test_seconds_must_be_finite(name):
    """`inf` turned a limit off (a reference of any length, a timeout never reached)."""
    with pytest.raises(ValueError, match=rf"{name} = 'inf' .*finite number"):
        ServerConfig.load(overrides={name: "inf"}, environ={})


def test_a_settings_file_must_be_utf8_with_each_setting_once(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("port: 8081\nblock_size: 16\nport: 8082\n")
    with pytest.raises(ValueError, match=r"not valid YAML: .*setting 'port' is given twice"):
        ServerConfig.load(twice, environ={})
    for text, shown in (
        (
            "max_waiting: 5\nmax-waiting: 6\n",
            "'max_waiting' is given twice ('max_waiting', 'max-waiting')",
        ),
        ("gpu_memory_budget: 1GiB\nmemory_budget: 2GiB\n", "'gpu_memory_budget' is given twice"),
    ):
        twice.write_text(text)
        with pytest.raises(ValueError, match=re.escape(shown)):
            ServerConfig.load(twice, environ={})
    merged = tmp_path / "merged.yaml"  # YAML merge keys may be overridden, as YAML means
    merged.write_text("<<: {port: 8081, block_size: 32}\nport: 8082\n")
    loaded = ServerConfig.load(merged, environ={})
    assert (loaded.port, loaded.block_size) == (8082, 32)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"api_key: caf\xe9\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(latin))} is not UTF-8 text \(byte 12\)"):
        ServerConfig.load(latin, environ={})


def test_a_capitalised_yaml_key_gets_the_setting_as_its_suggestion(tmp_path):
    yaml_file = tmp_path / "serve.yaml"
    yaml_file.write_text("Port: 8081\n")
    with pytest.raises(ValueError, match=r"Port .*unknown setting; did you mean port\?"):
        ServerConfig.load(yaml_file, environ={})


def test_a_references_dir_that_cannot_be_made_fails_the_file_check(tmp_path):
    from fishserve.server.config import check_model_files

    made = tmp_path / "a" / "b"
    check_model_files(ServerConfig(references_dir=made, load_format="dummy"))
    assert made.is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=r"references_dir .*file/voices cannot be created"):
        check_model_files(ServerConfig(references_dir=blocker / "voices", load_format="dummy"))


def test_full_collection_interval_is_off_or_at_least_ten_seconds():
    for good in (0, 10, 86400):
        config = ServerConfig.load(overrides={"gc_full_interval": str(good)}, environ={})
        assert config.gc_full_interval == good
    for bad in ("0.5", "-1", "inf", "abc"):
        with pytest.raises(ValueError, match=r"gc_full_interval = "):
            ServerConfig.load(overrides={"gc_full_interval": bad}, environ={})
    with pytest.raises(ValueError, match=r"at least 10 seconds"):
        ServerConfig.load(overrides={"gc_full_interval": "0.5"}, environ={})
