"""Building the DualAR model from an official checkpoint folder, or with random weights.

The official folder (`fishaudio/fish-speech-1.5`) holds `config.json`, `model.pth` (bf16 state
dict) and `tokenizer.tiktoken`; `model.safetensors` is accepted in place of `model.pth`.
Key handling follows spec §2.1: a Lightning `state_dict` entry with `model.` prefixes is
unwrapped, and old split `wq`/`wk`/`wv` projections are fused into `wqkv`. Unlike the
reference (strict=False), every key must match: a missing key is an error, not random weights.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import torch
from torch import Tensor

from fishserve.models.checkpoint import check_keys, read_state_dict
from fishserve.models.config import DualARConfig, check_checkpoint_folder
from fishserve.models.dual_ar import DualARTransformer
from fishserve.models.tokenizer import TOKENIZER_FILENAME, FishTokenizer

log = logging.getLogger(__name__)

WEIGHT_FILES = ("model.pth", "model.safetensors")
# The release reserves 2,048 ids after the mergeable ranks for special tokens (spec §3.1).
RESERVED_SPECIAL_IDS = 2048
DUMMY_LOGITS = ("flat", "peaked")
# Std of "peaked" random slow logits: bench-sampler's trained-model stand-in (benchmarks §5).
PEAKED_LOGIT_STD = 8.0
# Buffers some saved checkpoints carry (caches, RoPE tables, masks); they are rebuilt, not loaded.
_BUFFER_KEY = re.compile(r"(.*\.kv_cache\.[kv]_cache|(fast_)?freqs_cis|causal_mask)")


def find_weights(checkpoint_dir: Path) -> Path:
    """The weights file inside an official checkpoint folder.

    Raises:
        FileNotFoundError: neither `model.pth` nor `model.safetensors` is there.
    """
    for name in WEIGHT_FILES:
        if (checkpoint_dir / name).is_file():
            return checkpoint_dir / name
    raise FileNotFoundError(f"no {' or '.join(WEIGHT_FILES)} in {checkpoint_dir}")


def normalize_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Apply the reference loader's key conventions (spec §2.1) to a raw state dict."""
    if state and all(k.startswith("model.") for k in state):
        state = {k.removeprefix("model."): v for k, v in state.items()}
    fused: dict[str, Tensor] = {}
    for key, value in state.items():
        if _BUFFER_KEY.fullmatch(key):
            continue
        match = re.fullmatch(r"(.*\.attention)\.w([qkv])\.(weight|bias)", key)
        if match is None:
            fused[key] = value
        elif match.group(2) == "q":
            prefix, kind = match.group(1), match.group(3)
            parts = [state[f"{prefix}.w{p}.{kind}"] for p in "qkv"]
            fused[f"{prefix}.wqkv.{kind}"] = torch.cat(parts, dim=0)
    return fused


def build_model(
    config: DualARConfig,
    semantic_ids: tuple[int, int],
    state: dict[str, Tensor] | None,
    device: torch.device | str,
    dtype: torch.dtype,
    seed: int = 0,
    dummy_logits: str = "flat",
) -> DualARTransformer:
    """Instantiate the model on `device` in `dtype`, from `state` or with random weights.

    Args:
        config: model hyper-parameters.
        semantic_ids: (semantic_begin_id, semantic_end_id) from the tokenizer.
        state: checkpoint tensors (any dtype, on CPU), or None for random weights
            (embeddings N(0, 1), linear layers N(0, 0.02), norms 1; seeded by `seed`).
        device, dtype: where and in which floating dtype the weights live.
        dummy_logits: for random weights, ``"flat"`` or ``"peaked"`` (see `random_state`).

    Raises:
        CheckpointError: `state` does not have exactly the model's keys and shapes.
    """
    with torch.device("meta"):
        model = DualARTransformer(config, *semantic_ids)
    if state is None:
        state = random_state(model, device, dtype, seed, dummy_logits)
    else:
        expected = model.state_dict()
        check_keys(set(expected), set(state), "model checkpoint")
        for key, tensor in state.items():
            if tuple(tensor.shape) != tuple(expected[key].shape):
                raise ValueError(
                    f"{key}: checkpoint shape {tuple(tensor.shape)} != model shape "
                    f"{tuple(expected[key].shape)} (does config.json match model.pth?)"
                )
        state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    model.load_state_dict(state, assign=True)
    return model.eval().requires_grad_(False)


def random_state(
    model: DualARTransformer,
    device: torch.device | str,
    dtype: torch.dtype,
    seed: int,
    dummy_logits: str = "flat",
) -> dict[str, Tensor]:
    """Random weights with the model's keys and shapes (for `--load-format dummy`).

    ``dummy_logits="flat"``: linear layers N(0, 0.02), so the slow logits have a standard
    deviation of 0.02 * sqrt(dim) (0.64 for the release): nearly uniform over the vocabulary,
    and the top-k prefilter of the token sampler never holds the top-p nucleus (every row
    takes the exact fallback, the sampler's slowest path). ``"peaked"``: the slow output layer
    is drawn so that the logits have a standard deviation of `PEAKED_LOGIT_STD`, the stand-in
    for a trained model used by `fishserve bench-sampler` (docs/benchmarks.md §5); benchmarks
    then take the sampler path real weights are expected to take.

    Raises:
        ValueError: an unknown ``dummy_logits``.
    """
    if dummy_logits not in DUMMY_LOGITS:
        raise ValueError(f"dummy_logits must be one of {', '.join(DUMMY_LOGITS)}")
    c = model.config
    output_key = "embeddings.weight" if c.tie_word_embeddings else "output.weight"
    gen = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for key, meta in model.state_dict().items():
        if key.endswith("norm.weight"):
            state[key] = torch.ones(meta.shape, device=device, dtype=dtype)
            continue
        std = 1.0 if "embeddings" in key else 0.02
        if dummy_logits == "peaked" and key == output_key:
            std = PEAKED_LOGIT_STD / math.sqrt(c.dim)  # logits: RMS-normed h (RMS 1) . w
        t = torch.empty(meta.shape, device=device, dtype=dtype)
        state[key] = t.normal_(0.0, std, generator=gen)
    return state


def load_weights(checkpoint_dir: Path) -> dict[str, Tensor]:
    """Read and normalise the weights of an official checkpoint folder (tensors stay on CPU)."""
    path = find_weights(checkpoint_dir)
    log.info("loading LLM weights from %s", path)
    return normalize_state_dict(read_state_dict(path))


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda if available else cpu; otherwise the named torch device.

    Raises:
        ValueError: unknown or unsupported device string (only cpu and cuda are), or CUDA
            asked for but not available.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {name!r}: use auto, cpu, cuda or cuda:N") from exc
    if device.type not in ("cpu", "cuda"):  # meta, mps, xpu, ...: not supported here
        raise ValueError(f"unsupported device {name!r}: use auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` -> bf16 on CUDA, fp32 elsewhere; else one of fp32, bf16, fp16.

    Raises:
        ValueError: unknown dtype name.
    """
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def load_text2semantic(
    checkpoint_dir: str | Path | None,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    load_format: str = "auto",
    seed: int = 0,
    dummy_logits: str = "flat",
) -> tuple[DualARTransformer, FishTokenizer]:
    """Load the model and tokenizer of an official checkpoint folder.

    Args:
        checkpoint_dir: folder with config.json, model.pth (or model.safetensors) and
            tokenizer.tiktoken. With `load_format="dummy"` it may be None: the released
            architecture and a byte-level stand-in tokenizer with the released id layout are
            used, with random weights.
        device, dtype: placement of the weights.
        load_format: "auto" (read the weights) or "dummy" (random weights, for benchmarks).
        dummy_logits: with random weights, "flat" or "peaked" slow logits (`random_state`).

    Raises:
        FileNotFoundError: a required file is missing.
        ValueError / CheckpointError: bad config, tokenizer or weights; `dummy_logits` other
            than "flat" with real weights.
    """
    if load_format not in ("auto", "dummy"):
        raise ValueError(f"unknown load format {load_format!r}; use auto or dummy")
    if dummy_logits != "flat" and load_format != "dummy":
        raise ValueError("dummy_logits applies to random weights only (--load-format dummy)")
    folder = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if folder is not None:
        check_checkpoint_folder(folder)
    if folder is None and load_format != "dummy":
        raise ValueError("a checkpoint folder is required unless --load-format dummy")
    has_config = folder is not None and (folder / "config.json").is_file()
    config = DualARConfig.from_file(folder / "config.json") if has_config else None
    if config is None:
        if load_format != "dummy":
            raise FileNotFoundError(f"no config.json in {folder}")
        config = DualARConfig.released()
    if folder is not None and (folder / TOKENIZER_FILENAME).is_file():
        tokenizer = FishTokenizer(folder)
    elif load_format == "dummy":
        tokenizer = FishTokenizer.byte_level(config.vocab_size - RESERVED_SPECIAL_IDS)
    else:
        raise FileNotFoundError(f"no {TOKENIZER_FILENAME} in {folder}")
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(
            f"tokenizer has {tokenizer.vocab_size} ids but the model only {config.vocab_size}"
        )
    state = load_weights(folder) if load_format == "auto" else None
    semantic = (tokenizer.semantic_begin_id, tokenizer.semantic_end_id)
    model = build_model(config, semantic, state, device, dtype, seed, dummy_logits)
    source = "random (dummy)" if load_format == "dummy" else "checkpoint"
    log.info("text2semantic model: %s weights, %s, %s", source, dtype, device)
    return model, tokenizer
