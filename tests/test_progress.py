"""Progress bars of the long commands: `fishserve -q` hides them."""

from __future__ import annotations

import pytest
from rich.console import Console
from typer.testing import CliRunner

from fishserve import progress
from fishserve.bench.run import make_progress
from fishserve.cli import app
from fishserve.progress import progress_bar
from fishserve.synthesis import _progress as synthesis_progress


@pytest.mark.parametrize("make", [progress_bar, make_progress, synthesis_progress])
def test_progress_bars_are_hidden_with_quiet(monkeypatch, make):
    def build():
        return make(console=Console()) if make is progress_bar else make(Console())

    monkeypatch.setattr(progress, "HIDDEN", True)
    assert build().disable
    monkeypatch.setattr(progress, "HIDDEN", False)
    assert not build().disable


@pytest.mark.parametrize(("flags", "hidden"), [(["-q"], True), ([], False), (["-v"], False)])
def test_the_quiet_flag_sets_it(monkeypatch, flags, hidden):
    monkeypatch.setattr(progress, "HIDDEN", not hidden)
    result = CliRunner().invoke(app, [*flags, "synth", "--help"])
    assert result.exit_code == 0 and progress.HIDDEN is hidden
