"""Reading state dicts from `.pth` / `.safetensors` files (shared by the LLM and the decoder)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor


class CheckpointError(ValueError):
    """A checkpoint file exists but cannot be used (bad format, wrong or missing keys)."""


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Load a flat name -> tensor mapping from a `.pth` (pickled, weights only) or `.safetensors`.

    `.pth` files are memory-mapped, so a 1.28 GB checkpoint is not copied before it is cast.

    Raises:
        FileNotFoundError: the file does not exist.
        CheckpointError: the file cannot be read or holds no tensor dictionary.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # corrupted pickle, zip or safetensors header
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise CheckpointError(f"{path} does not hold a dictionary of tensors")
    return state


def check_keys(expected: set[str], found: set[str], what: str) -> None:
    """Raise `CheckpointError` naming a few missing and unexpected keys, if any."""
    missing, unexpected = sorted(expected - found), sorted(found - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"{what}: {len(missing)} missing keys {missing[:5]}, "
            f"{len(unexpected)} unexpected keys {unexpected[:5]}"
        )
