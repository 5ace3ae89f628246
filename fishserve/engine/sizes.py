"""Memory sizes as users write them (`4GiB`, `512MiB`, `0.9`), without PyTorch: the server's
settings are checked with this before anything heavy is imported."""

from __future__ import annotations

import math
import re

__all__ = ["parse_memory_size"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_memory_size(text: str | int | float) -> int | float:
    """Parse `4GiB`, `512MiB`, `6GB`, `123456` (bytes) or a fraction like `0.9`.

    Returns:
        int bytes, or a float fraction in (0, 1] of the device's memory.

    Raises:
        ValueError: not a size, or a fraction outside (0, 1].
    """
    if isinstance(text, int | float) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f"not a memory size: {text!r} (use e.g. 4GiB, 512MiB or 0.9)")
        value, unit = float(match.group(1)), match.group(2).lower()
    if not math.isfinite(value):
        raise ValueError(f"not a memory size: {text!r} (use e.g. 4GiB, 512MiB or 0.9)")
    if unit == "" and value <= 1.0:
        if value <= 0:
            raise ValueError(f"memory fraction must be in (0, 1], got {text!r}")
        return value
    return int(value * _UNITS[unit])
