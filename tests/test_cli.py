"""The command line: synth/encode/decode round trips and one-line errors on bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import TINY_DECODER, TINY_T2S
from safetensors.torch import load_file
from typer.testing import CliRunner

import fishserve.audio.io as audio_io
import fishserve.synthesis as synthesis
from fishserve import __version__
from fishserve.cli import app

runner = CliRunner()
DECODER = [
    "--decoder-checkpoint",
    str(TINY_DECODER / "generator.pth"),
    "--decoder-config",
    str(TINY_DECODER / "config.json"),
]
FRAME_SAMPLES = 256  # tiny decoder: hop 64 x downsample 4


def invoke(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture(scope="module")
def long_case():
    return (
        json.loads((TINY_T2S / "meta.json").read_text())["generate_long"],
        load_file(TINY_T2S / "generate_long_case.safetensors"),
    )


# `--temperature 0` (after the 1e-5 below) is greedy too, as in the HTTP API.
@pytest.mark.parametrize(
    "loop", [[], ["--reference-loop"], ["--kv-cache-dtype", "fp32"], ["--temperature", "0"]]
)
def test_synth_reproduces_fixture_codes_and_wav_length(tmp_path, long_case, loop):
    cfg, case = long_case
    ref = tmp_path / "ref.npy"
    np.save(ref, case["ref_codes"].numpy())
    out, codes_out = tmp_path / "out.wav", tmp_path / "codes.npy"
    sampling = "--chunk-length 60 --max-new-tokens 10 --top-p 0.9 --repetition-penalty 1.2"
    result = invoke(
        "synth", "--checkpoint", str(TINY_T2S), *DECODER, "--text", cfg["text"],
        *sampling.split(), "--temperature", "1e-5", "--reference-codes", str(ref),
        "--reference-text", "Hello there, this is a reference.", "--output", str(out),
        "--codes-output", str(codes_out), "--device", "cpu", *loop,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    expected = torch.cat([case["segment_0_codes"], case["segment_1_codes"]], dim=1).numpy()
    codes = np.load(codes_out)
    assert np.array_equal(codes, expected)
    audio, rate = sf.read(out)
    assert rate == 44100 and audio.ndim == 1
    assert len(audio) == expected.shape[1] * FRAME_SAMPLES


def test_decode_then_encode_round_trip_files(tmp_path):
    codes = np.random.default_rng(0).integers(0, 1000, size=(4, 12)).astype(np.int64)
    np.save(tmp_path / "c.npy", codes)
    result = invoke(
        "decode",
        *DECODER,
        "--codes",
        str(tmp_path / "c.npy"),
        "--output",
        str(tmp_path / "w.npy"),
        "--device",
        "cpu",
    )
    assert result.exit_code == 0, result.output
    wave = np.load(tmp_path / "w.npy")
    assert wave.dtype == np.float32 and wave.shape == (12 * FRAME_SAMPLES,)
    result = invoke(
        "encode",
        *DECODER,
        "--audio",
        str(tmp_path / "w.npy"),
        "--output",
        str(tmp_path / "e.npy"),
        "--device",
        "cpu",
    )
    assert result.exit_code == 0, result.output
    assert np.load(tmp_path / "e.npy").shape == (4, 12)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["synth", "--checkpoint", "/nonexistent", "--text", "hi", "--output", "x.wav"],
            "not found",
        ),
        (
            [
                "synth",
                "--checkpoint",
                str(TINY_T2S),
                *DECODER,
                "--text",
                "   ",
                "--output",
                "x.wav",
            ],
            "empty",
        ),
        (["decode", *DECODER, "--codes", "/nonexistent.npy", "--output", "x.wav"], "not found"),
        (["encode", *DECODER, "--audio", "/nonexistent.wav", "--output", "x.npy"], "not found"),
    ],
)
def test_bad_input_gives_one_clear_line(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    result = invoke(*args)
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "error:" in result.output and message in result.output


def test_decode_rejects_wrong_shape_float_and_out_of_range_codes(tmp_path):
    np.save(tmp_path / "bad.npy", np.zeros((3, 5), dtype=np.int64))
    np.save(tmp_path / "float.npy", np.zeros((4, 5), dtype=np.float32))
    np.save(tmp_path / "big.npy", np.full((4, 5), 5000, dtype=np.int64))
    np.save(tmp_path / "wraps.npy", np.full((4, 5), 2**63 + 5, dtype=np.uint64))
    (tmp_path / "audio.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt ")
    for name, message in (
        ("audio.wav", "is not a .npy file"),
        ("bad.npy", "codebooks"),
        ("float.npy", "integer"),
        ("big.npy", "codes must lie in [0, 1024), got 5000..5000"),
        ("wraps.npy", f"got {2**63 + 5}..{2**63 + 5}"),
    ):
        result = invoke(
            "decode", *DECODER, "--codes", str(tmp_path / name), "--output", str(tmp_path / "x.wav")
        )
        assert result.exit_code == 2 and message in result.output, result.output


@pytest.mark.parametrize("transcript", ["Hello.", ""])
def test_synth_with_reference_audio(tmp_path, transcript):
    t = np.arange(44100 // 2) / 44100
    sf.write(tmp_path / "ref.wav", 0.3 * np.sin(2 * np.pi * 220 * t), 44100)
    result = invoke(
        "synth",
        "--checkpoint",
        str(TINY_T2S),
        *DECODER,
        "--text",
        "Hi there.",
        "--reference-audio",
        str(tmp_path / "ref.wav"),
        *(["--reference-text", transcript] if transcript else []),
        "--max-new-tokens",
        "6",
        "--output",
        str(tmp_path / "o.wav"),
    )
    assert result.exit_code == 0, result.output
    assert sf.info(tmp_path / "o.wav").frames > 0
    assert ("no --reference-text" in result.output) == (not transcript)


@pytest.fixture
def codes_file(tmp_path):
    path = tmp_path / "c.npy"
    np.save(path, np.random.default_rng(0).integers(0, 1000, size=(4, 12)).astype(np.int64))
    return path


def decoded_samples(path) -> tuple[str, int]:
    """Container format name and sample count of an audio file (FFmpeg)."""
    with av.open(str(path)) as container:
        samples = sum(frame.samples for frame in container.decode(audio=0))
        return container.format.name, samples


@pytest.mark.parametrize(
    ("suffix", "container", "samples"),
    [
        (".wav", "wav", 12 * FRAME_SAMPLES),
        (".flac", "flac", 12 * FRAME_SAMPLES),
        (".mp3", "mp3", 12 * FRAME_SAMPLES),
        (".ogg", "ogg", round(12 * FRAME_SAMPLES * 48000 / 44100)),
        (".opus", "ogg", round(12 * FRAME_SAMPLES * 48000 / 44100)),
    ],
)
def test_decode_writes_the_format_of_the_extension(
    tmp_path, codes_file, suffix, container, samples
):
    out = tmp_path / f"out{suffix}"
    result = invoke("decode", *DECODER, "--codes", str(codes_file), "--output", str(out))
    assert result.exit_code == 0, result.output
    name, count = decoded_samples(out)
    assert container in name.split(",")
    assert abs(count - samples) <= (1152 if suffix == ".mp3" else 0)


def test_synth_writes_flac_for_a_flac_output(tmp_path):
    out = tmp_path / "o.flac"
    result = invoke(
        "synth", "--checkpoint", str(TINY_T2S), *DECODER, "--text", "Hi there.",
        "--max-new-tokens", "6", "--output", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert sf.info(out).format == "FLAC" and sf.info(out).frames == 5 * FRAME_SAMPLES


def test_synth_reports_a_failed_generation_in_one_line(tmp_path):
    """A later segment whose prompt outgrows the tiny model's 256-position context fails the
    request: one error line and exit code 1, no traceback."""
    result = invoke(
        "synth", "--checkpoint", str(TINY_T2S), *DECODER, "--text", "hello world this is longer",
        "--chunk-length", "1", "--max-new-tokens", "20", "--output", str(tmp_path / "x.npy"),
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "leaves no room in the 256-position context" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "x.npy").exists()


@pytest.fixture
def no_model_loading(monkeypatch):
    """Any model load fails the test: checks must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("models were loaded before the inputs were checked")

    monkeypatch.setattr(synthesis, "load_text2semantic", refuse)
    monkeypatch.setattr(synthesis, "load_decoder", refuse)


SYNTH = ["synth", "--checkpoint", str(TINY_T2S), *DECODER, "--text", "Hi."]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*SYNTH, "--output", "/nonexistent/x.wav"], "folder /nonexistent does not exist"),
        ([*SYNTH, "--output", "x.xyz"], "use one of .wav, .flac, .mp3, .ogg, .opus, .npy"),
        ([*SYNTH, "--output", "x"], "no extension"),
        ([*SYNTH, "--output", "."], "no extension"),
        ([*SYNTH, "--output", "dir.wav"], "is a folder"),
        ([*SYNTH, "--output", "x.wav", "--codes-output", "/nonexistent/c.npy"], "does not exist"),
        ([*SYNTH, "--output", "x.wav", "--codes-output", "c.txt"], "use one of .npy"),
        ([*SYNTH, "--output", "c.npy", "--codes-output", "./c.npy"], "is --output too"),
        ([*SYNTH, "--output", "/proc/x.wav"], "--output /proc/x.wav: cannot write there"),
        ([*SYNTH, "--output", "x.wav", "--reference-audio", "nope.wav"], "not found"),
        ([*SYNTH, "--output", "x.wav", "--max-new-tokens", "1"], ">= 2"),
        ([*SYNTH, "--output", "x.wav", "--temperature", "inf"], "--temperature must be a finite"),
        ([*SYNTH, "--output", "x.wav", "--repetition-penalty", "inf"], "must be a finite"),
        ([*SYNTH, "--output", "x.wav", "--reference-text", "Hi."], "give --reference-audio"),
        (["decode", *DECODER, "--codes", "c.npy", "--output", "/nonexistent/d/x.wav"], "exist"),
        (["decode", *DECODER, "--codes", "c.npy", "--output", "x.aac"], "extension '.aac'"),
        (["encode", *DECODER, "--audio", "c.npy", "--output", "/nonexistent/e.npy"], "exist"),
        (["encode", *DECODER, "--audio", "c.npy", "--output", "e.wav"], "use one of .npy"),
    ],
)
def test_bad_outputs_fail_before_any_model_loads(
    tmp_path, monkeypatch, no_model_loading, codes_file, args, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir.wav").mkdir()
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.output.startswith("error:") and message in result.output


def test_unwritable_output_folder(tmp_path, monkeypatch, no_model_loading):
    real_access = os.access  # a read-only folder, as non-root users see it
    monkeypatch.setattr(
        audio_io.os, "access", lambda p, mode: not mode & os.W_OK and real_access(p, mode)
    )
    result = invoke(*SYNTH, "--output", str(tmp_path / "x.wav"))
    assert result.exit_code == 2 and "no permission to write" in result.output


def test_top_p_is_an_open_interval_at_zero():
    result = invoke(*SYNTH, "--output", "x.wav", "--top-p", "0")
    assert result.exit_code == 2 and "(0, 1]" in result.output
    assert "0.0<=x<=1.0" not in invoke("synth", "--help").output


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_seeds_outside_the_api_range_are_refused(seed):
    """The API takes seeds in [0, 2^32); synth took any and wrapped them modulo 2^32."""
    result = invoke(*SYNTH, "--output", "x.wav", f"--seed={seed}")
    assert result.exit_code == 2 and "--seed" in result.output


def test_encode_and_decode_require_their_decoder_weights():
    for command in ("encode", "decode"):
        result = invoke(command, "--help")
        assert "--checkpoint" not in result.output.replace("--decoder-checkpoint", "")
        assert "--dtype" in result.output and "--threads" in result.output
        source = "--audio" if command == "encode" else "--codes"
        result = invoke(command, source, "c.npy", "--output", "x.npy")
        assert result.exit_code == 2 and "Missing option '--decoder-checkpoint'" in result.output


def test_decode_with_bf16_decoder_weights(tmp_path, codes_file):
    out = tmp_path / "w.npy"
    result = invoke("decode", *DECODER, "--codes", str(codes_file), "--output", str(out),
                    "--dtype", "bf16", "--device", "cpu")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert np.load(out).dtype == np.float32


@pytest.mark.parametrize("command", ["synth", "encode", "decode"])
def test_threads_option_sets_torch_threads(tmp_path, codes_file, command):
    args = {
        "synth": [*SYNTH, "--max-new-tokens", "3", "--output", str(tmp_path / "x.wav")],
        "encode": ["encode", *DECODER, "--audio", str(tmp_path / "w.npy")],
        "decode": ["decode", *DECODER, "--codes", str(codes_file)],
    }[command]
    np.save(tmp_path / "w.npy", np.zeros(4096, dtype=np.float32) + 0.1)
    out = ["--output", str(tmp_path / "o.npy")] if command != "synth" else []
    try:
        result = invoke(*args, *out, "--threads", "2")
        assert result.exit_code == 0, result.output
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)  # conftest's setting


@pytest.mark.parametrize(
    ("loop", "description"), [([], "generating"), (["--reference-loop"], "reference loop")]
)
def test_progress_counts_frames(tmp_path, loop, description):
    result = invoke(*SYNTH, "--max-new-tokens", "6", "--output", str(tmp_path / "x.wav"), *loop)
    assert result.exit_code == 0, result.output
    assert description in result.output and "5 frames" in result.output.split("wrote")[0]


def test_random_weights_warning_is_two_unwrapped_lines(tmp_path):
    result = runner.invoke(
        app,
        [*SYNTH, "--load-format", "dummy", "--max-new-tokens", "3", "--output",
         str(tmp_path / "x.wav")],
        env={"COLUMNS": "50"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    first = lines.index("WARNING: RANDOM weights: the audio is noise, not speech.")
    assert lines[first + 1].startswith("For speech: --checkpoint ")
    assert lines[first + 1].endswith("(README: Real weights).")
    assert all(len(line) <= 80 for line in lines[first : first + 2])


def test_version_and_log_level_flags():
    result = invoke("--version")
    assert result.exit_code == 0 and result.output.strip() == f"fishserve {__version__}"
    help_lines = invoke("--help").output.splitlines()
    verbose = [line for line in help_lines if "--verbose" in line]
    assert len(verbose) == 1 and "--quiet" not in verbose[0]  # one row each, not merged
    assert any("--quiet" in line and "-q" in line for line in help_lines)
    both = invoke("-v", "-q", "decode")
    assert both.exit_code == 2 and "not both" in both.output


def test_max_new_tokens_zero_means_until_the_context_is_full():
    opts = synthesis.SynthesisOptions(text="Hi.", output=Path("x.wav"), max_new_tokens=0)
    synthesis.check_synth_options(opts)  # no error
    assert synthesis.sampling_params(
        synthesis.SynthesisOptions(text="Hi.", output=Path("x.wav"), temperature=0)
    ).temperature == pytest.approx(1e-5)


def test_synth_reports_missing_decoder_weights_before_loading(monkeypatch):
    import fishserve.synthesis as synthesis

    monkeypatch.setattr(synthesis, "load_text2semantic", lambda *a, **k: pytest.fail("loaded"))
    result = invoke("synth", "--checkpoint", str(TINY_T2S), "--text", "hi", "--output", "x.wav")
    assert result.exit_code == 2 and "no decoder weights" in result.output


def test_synth_refuses_an_unknown_kv_cache_dtype_before_loading(monkeypatch, tmp_path):
    import fishserve.synthesis as synthesis

    monkeypatch.setattr(synthesis, "load_text2semantic", lambda *a, **k: pytest.fail("loaded"))
    output = str(tmp_path / "x.wav")
    result = invoke("synth", "--text", "hi", "--output", output, "--kv-cache-dtype", "foo")
    assert result.exit_code == 2 and "--kv-cache-dtype 'foo': use one of auto" in result.output


def test_synth_refuses_a_reference_that_is_not_audio_before_loading(monkeypatch, tmp_path):
    import fishserve.synthesis as synthesis

    monkeypatch.setattr(synthesis, "load_text2semantic", lambda *a, **k: pytest.fail("loaded"))
    (tmp_path / "ref.wav").write_text("#!/bin/sh\necho not audio\n")
    result = invoke(
        "synth", "--text", "hi", "--output", str(tmp_path / "x.wav"),
        "--reference-audio", str(tmp_path / "ref.wav"), "--reference-text", "hi",
    )  # fmt: skip
    assert result.exit_code == 2 and "error:" in result.output, result.output
    assert "Traceback" not in result.output


def test_settings_and_file_checks_do_not_import_torch(tmp_path):
    """The CLI, the server's settings and their file checks load without PyTorch (~2 s), so
    `--help`, `--version` and a wrong path answer at once."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from fishserve.cli import app\n"
        "from fishserve.server.config import ServerConfig, check_model_files\n"
        "config = ServerConfig.load(None, {'checkpoint': '/nonexistent'})\n"
        "try:\n"
        "    check_model_files(config)\n"
        "except FileNotFoundError as exc:\n"
        "    print(exc)\n"
        "print('torch' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["checkpoint folder not found: /nonexistent", "False"]
