"""Result tables of the speed commands: a rich table on the console, markdown and JSON files."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table


def render_table(head: list[str], rows: list[list[str]], console: Console) -> str:
    """Print `rows` under `head` as a rich table; return the same table as markdown."""
    table = Table(*head)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        table.add_row(*row)
        lines.append("| " + " | ".join(row) + " |")
    console.print(table)
    return "\n".join(lines)


def write_results(output: Path | None, payload: object, markdown: str) -> None:
    """Write `payload` as JSON to `output` and `markdown` next to it (`.md`); None: nothing.

    An `output` ending in `.md` gets the JSON in the `.json` file beside it (not overwritten by
    the table).
    """
    if output is None:
        return
    if output.suffix == ".md":
        output = output.with_suffix(".json")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(payload, indent=2))
    output.with_suffix(".md").write_text(markdown + "\n")
