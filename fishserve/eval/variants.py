"""Loading the models of one configuration: the DualAR model, its engine, the decoder.

Weights are always built in fp32 and then cast, so every configuration starts from the same
values: random (`load_format="dummy"`) weights generated directly in bf16 would be different
numbers, not a rounding of the fp32 ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from fishserve import synthesis
from fishserve.engine.engine import EngineConfig, LLMEngine
from fishserve.eval.configs import EvalConfig
from fishserve.eval.int8_weights import perturb_linears, quantize_linears
from fishserve.models.dual_ar import DualARTransformer
from fishserve.models.firefly import FireflyGenerator
from fishserve.models.loading import load_text2semantic
from fishserve.models.tokenizer import FishTokenizer


@dataclass(frozen=True)
class ModelSource:
    """Where the weights come from.

    Attributes:
        checkpoint: official checkpoint folder, or None with `load_format="dummy"`.
        load_format: "auto" (files) or "dummy" (full-size random weights).
        decoder_checkpoint: Firefly generator weights; None = the checkpoint folder's file,
            or random weights when dummy.
        decoder_config: decoder config file (None = the released one).
        block_size: positions per KV block.
        kv_positions: KV pool size in positions (None = the model's max_seq_len).
    """

    checkpoint: Path | None
    load_format: str = "auto"
    decoder_checkpoint: Path | None = None
    decoder_config: Path | None = None
    block_size: int = 16
    kv_positions: int | None = None

    @property
    def dummy(self) -> bool:
        """Random weights (the report then says quality numbers are numerical only)."""
        return self.load_format == "dummy" or self.checkpoint is None


@dataclass
class Loaded:
    """A configuration's models on the device."""

    model: DualARTransformer
    tokenizer: FishTokenizer
    engine: LLMEngine
    decoder: FireflyGenerator


def load_llm(
    source: ModelSource, config: EvalConfig, device: torch.device
) -> tuple[DualARTransformer, FishTokenizer]:
    """The DualAR model in the configuration's dtype (fp32 weights cast, then transformed)."""
    model, tokenizer = load_text2semantic(
        source.checkpoint,
        device=device,
        dtype=torch.float32,
        load_format="dummy" if source.dummy else "auto",
    )
    if config.noise:
        perturb_linears(model, config.noise)
    model = model.to(config.compute_dtype(device))
    if config.weights == "int8wo":
        quantize_linears(model)
    return model, tokenizer


def load_decoder(source: ModelSource, dtype: torch.dtype, device: torch.device) -> FireflyGenerator:
    """The Firefly decoder in `dtype` (fp32 weights cast).

    Raises:
        FileNotFoundError: no decoder weights and not dummy.
    """
    decoder = synthesis.load_decoder(
        source.decoder_checkpoint, source.decoder_config, source.checkpoint, device, source.dummy
    )
    return decoder.to(dtype)


def load_config(source: ModelSource, config: EvalConfig, device: torch.device) -> Loaded:
    """Model, engine (batch 1, KV pool of `kv_positions`) and decoder of a configuration."""
    model, tokenizer = load_llm(source, config, device)
    positions = source.kv_positions or model.config.max_seq_len
    engine = LLMEngine(
        model,
        tokenizer,
        EngineConfig(
            kv_cache_dtype=config.kv,
            block_size=source.block_size,
            max_num_seqs=1,
            num_kv_blocks=math.ceil(positions / source.block_size),
        ),
    )
    decoder = load_decoder(source, config.compute_dtype(device), device)
    return Loaded(model, tokenizer, engine, decoder)
