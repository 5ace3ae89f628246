"""Checkpoint loading for the Firefly generator (spec §4.2).

Accepted inputs: a ``.pth``/``.ckpt`` pickle (loaded with ``weights_only=True``) or a
``.safetensors`` file holding either the generator state dict, a dict with a ``state_dict`` entry,
or keys prefixed with ``generator.`` (then only those are kept, prefix stripped). Weight-normed
convs may be stored as ``parametrizations.weight.original0/1`` (g, v), as ``weight_g/weight_v`` or
already folded as ``weight``; they are folded to ``w = g * v / ||v||`` (norm over all dims but 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from fishserve.models.checkpoint import read_state_dict as read_checkpoint_file

from .config import FireflyConfig
from .layers import CausalConv1d, CausalConvTranspose1d
from .model import FireflyGenerator

__all__ = [
    "build_dummy_firefly",
    "checkpoint_param_count",
    "expected_checkpoint_shapes",
    "fold_weight_norm",
    "load_firefly",
    "read_state_dict",
    "weight_norm_keys",
]

WN_NEW = ("parametrizations.weight.original0", "parametrizations.weight.original1")
WN_OLD = ("weight_g", "weight_v")
_SHOW = 5  # how many offending keys an error message names


def weight_norm_keys(model: FireflyGenerator) -> list[str]:
    """Model state-dict keys (``....conv.weight``) that checkpoints store weight-normed."""
    kinds = (CausalConv1d, CausalConvTranspose1d)
    return [
        f"{name}.conv.weight"
        for name, module in model.named_modules()
        if isinstance(module, kinds) and module.weight_norm
    ]


def expected_checkpoint_shapes(
    model: FireflyGenerator, style: Literal["new", "old"] = "new"
) -> dict[str, tuple[int, ...]]:
    """Every key and shape an official checkpoint for ``model`` holds (spec §4.2).

    Weight-normed weights ``[d0, ...]`` become g ``[d0, 1, 1]`` + v ``[d0, ...]`` under the
    ``new`` (``parametrizations.weight.original0/1``) or ``old`` (``weight_g/weight_v``) naming.
    Works for models on the ``meta`` device.
    """
    g_name, v_name = WN_NEW if style == "new" else WN_OLD
    wn = set(weight_norm_keys(model))
    shapes: dict[str, tuple[int, ...]] = {}
    for key, tensor in model.state_dict().items():
        shape = tuple(tensor.shape)
        if key in wn:
            base = key[: -len("weight")]
            shapes[base + g_name] = (shape[0],) + (1,) * (len(shape) - 1)
            shapes[base + v_name] = shape
        else:
            shapes[key] = shape
    return shapes


def checkpoint_param_count(model: FireflyGenerator) -> int:
    """Parameter count as stored in a checkpoint (g and v counted; 47,065,218 for the release)."""
    return sum(math.prod(s) for s in expected_checkpoint_shapes(model).values())


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Read a checkpoint file into a flat ``name -> tensor`` dict (wrapper/prefix removed).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file cannot be read or does not hold a state dict.
    """
    return unwrap_state_dict(read_checkpoint_file(path))


def unwrap_state_dict(raw: object) -> dict[str, Tensor]:
    """Unwrap ``{"state_dict": ...}`` and keep/strip ``generator.``-prefixed keys if present.

    Raises:
        ValueError: ``raw`` is not a mapping of tensors.
    """
    if isinstance(raw, Mapping) and isinstance(raw.get("state_dict"), Mapping):
        raw = raw["state_dict"]
    if not isinstance(raw, Mapping) or not all(isinstance(v, Tensor) for v in raw.values()):
        raise ValueError("Firefly checkpoint is not a state dict (name -> tensor mapping)")
    prefix = "generator."
    if any(k.startswith(prefix) for k in raw):
        return {k[len(prefix) :]: v for k, v in raw.items() if k.startswith(prefix)}
    return dict(raw)


def fold_weight_norm(g: Tensor, v: Tensor) -> Tensor:
    """``w = g * v / ||v||`` with the norm over all dims except 0, computed in float32.

    Shapes: g ``[d0, 1, ..]`` (or ``[d0]``), v ``[d0, ...]`` -> w like v. For ConvTranspose1d
    ``d0`` is the input channel.
    """
    v = v.float()
    norm = torch.linalg.vector_norm(v, dim=tuple(range(1, v.ndim)), keepdim=True)
    return v * (g.float().reshape(norm.shape) / norm)


def convert_checkpoint(sd: Mapping[str, Tensor], model: FireflyGenerator) -> dict[str, Tensor]:
    """Map a checkpoint state dict onto ``model``'s keys (weight norm folded), strictly.

    Raises:
        ValueError: missing keys, unexpected keys or shape mismatches (a few of them named).
    """
    sd = dict(sd)
    out: dict[str, Tensor] = {}
    for key in weight_norm_keys(model):
        base = key[: -len("weight")]
        for g_name, v_name in (WN_NEW, WN_OLD):
            if base + g_name in sd and base + v_name in sd:
                out[key] = fold_weight_norm(sd.pop(base + g_name), sd.pop(base + v_name))
                break
        else:
            if key in sd:
                out[key] = sd.pop(key)
    expected = model.state_dict()
    out.update({k: sd.pop(k) for k in list(sd) if k in expected and k not in out})
    _check_keys(expected, out, unexpected=sorted(sd), wn=set(weight_norm_keys(model)))
    return out


def _check_keys(
    expected: Mapping[str, Tensor], got: Mapping[str, Tensor], unexpected: list[str], wn: set[str]
) -> None:
    def name(k: str) -> str:
        return k[: -len("weight")] + WN_NEW[0] + "/original1" if k in wn else k

    missing = [name(k) for k in expected if k not in got]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing key(s), e.g. {missing[:_SHOW]}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected key(s), e.g. {unexpected[:_SHOW]}")
    bad = [
        f"{k}: checkpoint {tuple(got[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in got and got[k].shape != v.shape
    ]
    if bad:
        problems.append(f"{len(bad)} shape mismatch(es), e.g. {bad[:2]}")
    if problems:
        raise ValueError(
            "Firefly checkpoint does not match the config (is the config the one this "
            "checkpoint was trained with? without one the released config is used): "
            + "; ".join(problems)
        )


def _resolve_config(config: FireflyConfig | str | Path | None) -> FireflyConfig:
    if config is None:
        return FireflyConfig.released()
    if isinstance(config, FireflyConfig):
        return config
    return FireflyConfig.from_file(config)


def load_firefly(
    checkpoint: str | Path | None,
    config: FireflyConfig | str | Path | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    load_format: Literal["auto", "dummy"] = "auto",
    seed: int = 0,
) -> FireflyGenerator:
    """Load a Firefly generator ready for inference (eval mode, no grad).

    Args:
        checkpoint: generator checkpoint (``.pth``/``.ckpt``/``.safetensors``); ignored (may be
            None) when ``load_format="dummy"``.
        config: a :class:`FireflyConfig`, a path to the official yaml/json, or None (released).
        device, dtype: where and in which float dtype to place the weights.
        load_format: ``"auto"`` reads ``checkpoint``; ``"dummy"`` builds random weights
            (``seed``) with the same architecture, for benchmarks.

    Raises:
        FileNotFoundError: missing checkpoint or config file.
        ValueError: unreadable file, invalid config, or keys/shapes that do not match the config.
    """
    cfg = _resolve_config(config)
    if load_format == "dummy":
        return build_dummy_firefly(cfg, seed=seed, device=device, dtype=dtype)
    if load_format != "auto":
        raise ValueError(f"unknown load_format {load_format!r}; use 'auto' or 'dummy'")
    if checkpoint is None:
        raise ValueError("a checkpoint path is required unless load_format='dummy'")
    raw = read_state_dict(checkpoint)
    with torch.device("meta"):
        model = FireflyGenerator(cfg)
    state = convert_checkpoint(raw, model)
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


def build_dummy_firefly(
    config: FireflyConfig | str | Path | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> FireflyGenerator:
    """Build the architecture with deterministic random weights (no file needed).

    With ``device="meta"`` no memory is allocated (shape inspection only). Initialisation: torch
    defaults under ``torch.manual_seed(seed)`` (global RNG state restored afterwards), ConvNeXt
    ``gamma`` set to ``layer_scale_init_value``.
    """
    cfg = _resolve_config(config)
    if torch.device(device).type == "meta":
        with torch.device("meta"):
            return FireflyGenerator(cfg).to(dtype=dtype).eval().requires_grad_(False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = FireflyGenerator(cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".gamma"):
                param.fill_(cfg.backbone.layer_scale_init_value)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)
