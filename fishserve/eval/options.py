"""Turning `fishserve eval` command-line values into `EvalOptions`."""

from __future__ import annotations

from pathlib import Path

from fishserve.engine.sampling import SamplingParams
from fishserve.eval.configs import parse_config, parse_configs
from fishserve.eval.run import EvalOptions
from fishserve.eval.variants import ModelSource
from fishserve.models.config import check_weight_files


def eval_options(
    *,
    checkpoint: Path | None,
    load_format: str,
    decoder_checkpoint: Path | None,
    decoder_config: Path | None,
    configs: str,
    reference: str,
    block_size: int,
    kv_positions: int | None,
    temperature: float,
    top_p: float,
    repetition_penalty: float,
    **rest: object,
) -> EvalOptions:
    """Options of one run from CLI values (`rest`: plain fields of EvalOptions).

    Raises:
        ValueError: bad configurations, sampling values or load format.
        FileNotFoundError: checkpoint files missing (checked before any model loads).
    """
    if load_format not in ("auto", "dummy"):
        raise ValueError(f"--load-format must be auto or dummy, got {load_format!r}")
    if checkpoint is None and load_format != "dummy":
        raise ValueError("give --checkpoint DIR, or --load-format dummy for random weights")
    if load_format != "dummy":
        check_weight_files(checkpoint, decoder_checkpoint, real_weights=True)
    source = ModelSource(
        checkpoint, load_format, decoder_checkpoint, decoder_config, block_size, kv_positions
    )
    return EvalOptions(
        source=source,
        configs=parse_configs(configs),
        reference=parse_config(reference),
        params=SamplingParams(temperature, top_p, repetition_penalty),
        **rest,  # type: ignore[arg-type]
    )
