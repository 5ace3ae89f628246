"""Progress bars of the long CLI commands; `fishserve -q` (warnings and errors only) hides
them."""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress, ProgressColumn

HIDDEN = False  # set by the CLI's `-q/--quiet`


def progress_bar(*columns: str | ProgressColumn, console: Console) -> Progress:
    """A rich `Progress` on `console` with `columns` (rich's defaults when none), disabled
    when `HIDDEN`."""
    return Progress(*columns, console=console, disable=HIDDEN)
