"""The command line: synth/encode/decode round trips and one-line errors on bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import TINY_DECODER, TINY_T2S
from safetensors.torch import load_file
from typer.testing import CliRunner

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


@pytest.mark.parametrize("loop", [[], ["--reference-loop"], ["--kv-cache-dtype", "fp32"]])
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


def test_decode_rejects_wrong_shape_and_float_codes(tmp_path):
    np.save(tmp_path / "bad.npy", np.zeros((3, 5), dtype=np.int64))
    np.save(tmp_path / "float.npy", np.zeros((4, 5), dtype=np.float32))
    for name, message in (("bad.npy", "codebooks"), ("float.npy", "integer")):
        result = invoke(
            "decode", *DECODER, "--codes", str(tmp_path / name), "--output", str(tmp_path / "x.wav")
        )
        assert result.exit_code == 2 and message in result.output, result.output


def test_synth_with_reference_audio(tmp_path):
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
        "--reference-text",
        "Hello.",
        "--max-new-tokens",
        "6",
        "--output",
        str(tmp_path / "o.wav"),
    )
    assert result.exit_code == 0, result.output
    assert sf.info(tmp_path / "o.wav").frames > 0
