"""The configurations `fishserve eval` compares, written `WEIGHTS/KV[+noise=X]`.

WEIGHTS: fp32, bf16, fp16 (the dtype of every weight and of the compute), or int8wo (weight-only
int8 linears, computing in bf16 on GPU and fp32 on CPU; see `int8_weights`). KV: the paged KV
cache storage, fp32, bf16, fp16, int8 or fp8 (`fishserve.engine.kv_cache`). `+noise=X` adds
Gaussian noise of X times each linear weight's standard deviation: a deliberately damaged
model that shows the fidelity metrics can fail.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

WEIGHT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
WEIGHT_CHOICES = (*WEIGHT_DTYPES, "int8wo")
KV_CHOICES = ("fp32", "bf16", "fp16", "int8", "fp8")
REFERENCE = "fp32/fp32"
_PATTERN = re.compile(r"(\w+)/(\w+)(?:\+noise=([0-9.eE+-]+))?")


@dataclass(frozen=True)
class EvalConfig:
    """One configuration.

    Attributes:
        weights: fp32, bf16, fp16 or int8wo.
        kv: KV cache storage dtype.
        noise: relative standard deviation of noise added to linear weights (0 = none).
    """

    weights: str
    kv: str
    noise: float = 0.0

    @property
    def name(self) -> str:
        """The `WEIGHTS/KV[+noise=X]` spelling."""
        suffix = f"+noise={self.noise:g}" if self.noise else ""
        return f"{self.weights}/{self.kv}{suffix}"

    def compute_dtype(self, device: torch.device) -> torch.dtype:
        """Dtype of activations and of the non-quantized weights."""
        if self.weights == "int8wo":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        return WEIGHT_DTYPES[self.weights]


def parse_config(text: str) -> EvalConfig:
    """Parse `WEIGHTS/KV[+noise=X]`.

    Raises:
        ValueError: malformed, or an unknown dtype.
    """
    match = _PATTERN.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"config {text!r}: expected WEIGHTS/KV[+noise=X], e.g. bf16/int8")
    weights, kv, noise = match.group(1), match.group(2), match.group(3)
    if weights not in WEIGHT_CHOICES:
        raise ValueError(f"config {text!r}: weights must be one of {', '.join(WEIGHT_CHOICES)}")
    if kv not in KV_CHOICES:
        raise ValueError(f"config {text!r}: KV must be one of {', '.join(KV_CHOICES)}")
    try:
        level = float(noise) if noise else 0.0
    except ValueError:
        raise ValueError(f"config {text!r}: noise must be a number") from None
    return EvalConfig(weights, kv, level)


def default_configs() -> list[EvalConfig]:
    """fp32/bf16/fp16 weights x fp32/bf16/int8/fp8 KV, then int8 weight-only with bf16/int8 KV."""
    grid = [EvalConfig(w, kv) for w in WEIGHT_DTYPES for kv in ("fp32", "bf16", "int8", "fp8")]
    return [*grid, EvalConfig("int8wo", "bf16"), EvalConfig("int8wo", "int8")]


def parse_configs(text: str) -> list[EvalConfig]:
    """`all` (the default grid) or a comma-separated list; duplicates dropped, order kept."""
    configs = (
        default_configs()
        if text.strip() == "all"
        else [parse_config(part) for part in text.split(",") if part.strip()]
    )
    if not configs:
        raise ValueError("no configurations given")
    return list(dict.fromkeys(configs))
