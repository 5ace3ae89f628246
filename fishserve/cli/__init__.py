"""The `fishserve` command line: synth, encode, decode, serve, bench, eval.

Every command turns expected failures (missing files, bad shapes, bad values, a port in use)
into one red line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from fishserve import __version__, progress
from fishserve.errors import USER_ERRORS, GenerationError

# Help and tables printed to a pipe or file (not a terminal) would be cut at rich's default 80
# columns, truncating long flag names and the benchmarks' numbers; without a terminal width to
# respect, use a wider page.
PIPED_HELP_WIDTH = 120
PIPED_TABLE_WIDTH = 200
_WIDTH_SET = bool(os.environ.get("COLUMNS") or os.environ.get("TERMINAL_WIDTH"))
if not sys.stdout.isatty() and not _WIDTH_SET:
    import typer.rich_utils

    typer.rich_utils.MAX_WIDTH = PIPED_HELP_WIDTH

app = typer.Typer(
    name="fishserve",
    help="Serve and run the Fish Speech 1.5 text-to-speech model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = Console(
    stderr=True, width=None if sys.stderr.isatty() or _WIDTH_SET else PIPED_TABLE_WIDTH
)
F = TypeVar("F", bound=Callable[..., None])

DeviceOpt = Annotated[str, typer.Option(help="Torch device: auto, cpu, cuda, cuda:N.")]
DtypeOpt = Annotated[
    str, typer.Option(help="Weight dtype: auto (bf16 on GPU, fp32 on CPU), fp32, bf16, fp16.")
]
DecoderDtypeOpt = Annotated[
    str,
    typer.Option(
        "--dtype", help="Decoder weight dtype: auto (bf16 on GPU, fp32 on CPU), fp32, bf16, fp16."
    ),
]
DecoderCkptOpt = Annotated[
    Path | None,
    typer.Option(
        "--decoder-checkpoint",
        help="Firefly generator weights (firefly-gan-vq-fsq-8x1024-21hz-generator.pth). "
        "Default: the file of that name inside --checkpoint.",
    ),
]
RequiredDecoderCkptOpt = Annotated[
    Path,
    typer.Option(
        "--decoder-checkpoint",
        help="Firefly generator weights: firefly-gan-vq-fsq-8x1024-21hz-generator.pth of the "
        "checkpoint folder (e.g. checkpoints/fish-speech-1.5/).",
    ),
]
DecoderCfgOpt = Annotated[
    Path | None,
    typer.Option(
        "--decoder-config", help="Decoder config (official yaml/json); default: released."
    ),
]
# More torch threads than this fail inside OpenMP (failed to map segment, MemoryError).
MAX_THREADS = 1024
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        max=MAX_THREADS,
        help="CPU threads of torch (torch.set_num_threads); default: one per core. On a busy "
        "machine --threads 1 can be several times faster.",
    ),
]
AUDIO_OUTPUT_HELP = (
    "Output audio file; its extension picks the format: .wav (16-bit), .flac, .mp3, "
    ".ogg/.opus (Opus, 48 kHz) or .npy (float32 samples at 44.1 kHz)."
)


def user_errors(func: F) -> F:
    """Run a command, turning expected errors into one clear line: exit code 2 for bad input
    (`USER_ERRORS`), 1 for a generation the engine failed (`GenerationError`)."""

    @functools.wraps(func)
    def wrapper(*args: object, **kwargs: object) -> None:
        try:
            func(*args, **kwargs)
        except USER_ERRORS as exc:
            _print_error(exc)
            raise typer.Exit(code=2) from None
        except GenerationError as exc:
            _print_error(exc)
            raise typer.Exit(code=1) from None

    return wrapper  # type: ignore[return-value]


def _print_error(exc: Exception) -> None:
    err_console.print(
        f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True, soft_wrap=True
    )


def set_threads(threads: int | None) -> None:
    """`torch.set_num_threads(threads)` unless None (torch's default: one per core)."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def _print_version(value: bool) -> None:
    """`--version`: print the version and stop."""
    if value:
        print(f"fishserve {__version__}")
        raise typer.Exit()


def _top_p(value: float) -> float:
    """Refuse a `--top-p` outside (0, 1] (0 would keep no token)."""
    if not 0.0 < value <= 1.0:
        raise typer.BadParameter(f"must be in (0, 1], got {value}")
    return value


TopPOpt = Annotated[float, typer.Option(callback=_top_p, help="Nucleus sampling mass, in (0, 1].")]


@app.callback()
def _setup(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", show_default=False, help="Debug logging.")
    ] = False,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet", "-q", show_default=False, help="Warnings and errors only; no progress bars."
        ),
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            show_default=False,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """Options before the command: log level and version."""
    if verbose and quiet:
        raise typer.BadParameter("give --verbose or --quiet, not both")
    progress.HIDDEN = quiet
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main() -> None:
    """Console-script entry point."""
    app()


# Register the commands, in the order `--help` lists them (they import the options above).
for _module in ("model", "serving", "measure"):
    importlib.import_module(f"fishserve.cli.{_module}")
