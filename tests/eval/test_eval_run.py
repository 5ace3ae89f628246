"""`fishserve eval` on the tiny fixtures: the table, exact fp32-vs-fp32 agreement and zero MCD,
a damaged configuration that scores worse, and the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY_DECODER, TINY_T2S
from rich.console import Console
from typer.testing import CliRunner

from fishserve.cli import app
from fishserve.eval.configs import parse_configs
from fishserve.eval.run import EvalOptions, first_divergence, run_eval
from fishserve.eval.variants import ModelSource

SOURCE = ModelSource(
    TINY_T2S,
    decoder_checkpoint=TINY_DECODER / "generator.pth",
    decoder_config=TINY_DECODER / "config.json",
)
# The tiny decoder runs at 44100 / 256 = 172 frames/s: 0.05 s and 0.15 s are 9 and 26 frames.
SHORT_S, LONG_S = 0.05, 0.15


@pytest.fixture(scope="module")
def one_thread():
    """The tiny model is overhead-bound: one thread avoids OpenMP spinning on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def run(tmp_path_factory, one_thread):
    out = tmp_path_factory.mktemp("eval")
    opts = EvalOptions(
        source=SOURCE,
        configs=parse_configs("fp32/fp32,fp32/int8,fp32/fp32+noise=0.3"),
        device="cpu",
        short_text="Hello there.",
        long_text="A slightly longer sentence.",
        short_seconds=SHORT_S,
        long_seconds=LONG_S,
        output_dir=out,
    )
    return {r.config: r for r in run_eval(opts, Console(quiet=True))}, out


def test_eval_writes_the_table_json_and_plot(run):
    results, out = run
    table = (out / "eval.md").read_text()
    assert "| config | load GiB | peak GiB (short/long) | ms/frame |" in table
    assert table.startswith("# fishserve eval on cpu\n")  # the device named once on a CPU
    for name in ("fp32/fp32", "fp32/int8", "fp32/fp32+noise=0.3"):
        assert f"| {name} |" in table
    data = json.loads((out / "eval.json").read_text())
    assert data["meta"]["frames"] == {"short": 9, "long": 26}
    positions = data["meta"]["prompt_positions"]
    assert f"frames {data['meta']['frames']} after prompts of {positions} positions" in table
    assert [r["config"] for r in data["results"]] == list(results)
    assert (out / "eval.png").read_bytes()[:4] == b"\x89PNG"


def test_fp32_against_itself_is_exact(run):
    r = run[0]["fp32/fp32"]
    assert r.error is None and r.fidelity is not None
    assert r.fidelity.slow_top1 == 1.0 and r.fidelity.slow_kl == 0.0
    assert r.fidelity.codebook_top1 == [1.0] * 4
    assert r.mcd_same_db == 0.0 and r.mcd_own_db == 0.0
    assert r.first_divergence == {"short": None, "long": None}
    assert r.frames == {"short": 9, "long": 26} and r.ms_per_frame > 0
    assert r.load_bytes == sum(r.load_breakdown.values()) > 0  # CPU: tensor bytes
    assert r.peak_bytes == {"short": None, "long": None}  # not measured on CPU


def test_int8_kv_is_smaller_and_close(run):
    ref, r = run[0]["fp32/fp32"], run[0]["fp32/int8"]
    assert r.load_breakdown["kv_pool"] < ref.load_breakdown["kv_pool"] / 3
    assert 0 < r.fidelity.slow_kl < 0.05
    assert r.mcd_same_db == 0.0  # same fp32 decoder on the same codes


def test_damaged_configuration_scores_worse(run):
    r = run[0]["fp32/fp32+noise=0.3"]
    assert r.fidelity.slow_top1 < 0.95 and r.fidelity.slow_kl > 0.01
    assert r.mcd_own_db > 0 and r.first_divergence["long"] is not None


def test_first_divergence():
    a = torch.zeros(2, 5, dtype=torch.long)
    b = a.clone()
    assert first_divergence(a, b) is None
    b[1, 3] = 7
    assert first_divergence(a, b) == 3
    assert first_divergence(a, a[:, :4]) == 4


def test_cli_eval(tmp_path, one_thread):
    args = [
        "eval", "--checkpoint", str(TINY_T2S),
        "--decoder-checkpoint", str(TINY_DECODER / "generator.pth"),
        "--decoder-config", str(TINY_DECODER / "config.json"),
        "--device", "cpu", "--configs", "fp32/fp32", "--short-text", "Hi.",
        "--long-text", "Hello.", "--short-seconds", "0.03", "--long-seconds", "0.05",
        "--output-dir", str(tmp_path),
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "| fp32/fp32 |" in (tmp_path / "eval.md").read_text()
    bad = CliRunner().invoke(app, [*args[:-2], "--configs", "fp64/fp32"])
    assert bad.exit_code == 2 and "fp64/fp32" in bad.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--checkpoint", str(TINY_T2S)], "no decoder weights: pass --decoder-checkpoint"),
        (["--checkpoint", "/nonexistent"], "checkpoint folder not found: /nonexistent"),
        (
            ["--checkpoint", str(TINY_T2S), "--decoder-checkpoint", "/nope.pth"],
            "decoder checkpoint not found: /nope.pth",
        ),
    ],
)
def test_cli_eval_checks_its_files_before_loading(tmp_path, monkeypatch, args, message):
    import fishserve.eval.run as run_module

    monkeypatch.setattr(run_module, "run_eval", lambda *a: pytest.fail("loaded"))
    result = CliRunner().invoke(app, ["eval", *args, "--output-dir", str(tmp_path)])
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_without_matplotlib_eval_writes_its_reports_and_removes_a_stale_plot(
    tmp_path, monkeypatch, one_thread
):
    import io

    import fishserve.eval.report as report

    def no_matplotlib(*args: object, **kwargs: object) -> None:
        raise ImportError("plots need matplotlib: pip install -e '.[bench]'")

    monkeypatch.setattr(report, "plot_results", no_matplotlib)
    (tmp_path / "eval.png").write_bytes(b"\x89PNG an earlier run's")
    opts = EvalOptions(
        source=SOURCE,
        configs=parse_configs("fp32/fp32"),
        device="cpu",
        short_seconds=0.02,
        long_seconds=0.03,
        output_dir=tmp_path,
    )
    out = io.StringIO()
    results = run_eval(opts, Console(file=out, width=200))
    assert [r.config for r in results] == ["fp32/fp32"]
    assert (tmp_path / "eval.json").exists() and (tmp_path / "eval.md").exists()
    assert not (tmp_path / "eval.png").exists()
    text = out.getvalue()
    assert "plot skipped (plots need matplotlib" in text
    assert "removed the eval.png of an earlier run there" in text
