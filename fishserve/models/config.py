"""Configuration of the text-to-semantic (DualAR) transformer.

Source: spec §1.2 (`config.json` of `fishaudio/fish-speech-1.5`) and its default rules.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

# Keys of the released config.json that only matter for training (spec §1.2).
_TRAINING_ONLY_KEYS = frozenset(
    {"dropout", "initializer_range", "use_gradient_checkpointing", "is_reward_model"}
)
# Keys that the reference ignores: head sizes are always dim // n_head (spec §9, gotcha 2).
_IGNORED_KEYS = frozenset({"head_dim", "fast_head_dim", "model_type"})


@dataclass(frozen=True)
class DualARConfig:
    """Hyper-parameters of the dual-autoregressive transformer.

    The slow transformer runs over text and semantic tokens (one position per frame); the fast
    transformer runs over the `num_codebooks` codebooks of one frame.
    `head_dim` is always `dim // n_head` (the config file's `head_dim` is ignored, as in the
    reference).
    """

    vocab_size: int = 102048
    n_layer: int = 24
    n_head: int = 16
    n_local_heads: int = 2
    dim: int = 1024
    intermediate_size: int = 4096
    rope_base: float = 1_000_000.0
    norm_eps: float = 1e-6
    max_seq_len: int = 8192
    tie_word_embeddings: bool = False
    attention_qkv_bias: bool = False
    codebook_size: int = 1024
    num_codebooks: int = 8
    n_fast_layer: int = 4
    fast_dim: int = 1024
    fast_n_head: int = 16
    fast_n_local_heads: int = 2
    fast_intermediate_size: int = 4096
    fast_attention_qkv_bias: bool = False

    def __post_init__(self) -> None:
        for name, heads, kv in (
            ("slow", self.n_head, self.n_local_heads),
            ("fast", self.fast_n_head, self.fast_n_local_heads),
        ):
            if heads % kv != 0:
                raise ValueError(f"{name} n_head={heads} is not a multiple of KV heads {kv}")
        if self.dim % self.n_head or self.fast_dim % self.fast_n_head:
            raise ValueError("dim must be divisible by n_head (and fast_dim by fast_n_head)")

    @property
    def head_dim(self) -> int:
        """Slow attention head size (= dim // n_head)."""
        return self.dim // self.n_head

    @property
    def fast_head_dim(self) -> int:
        """Fast attention head size (= fast_dim // fast_n_head)."""
        return self.fast_dim // self.fast_n_head

    @classmethod
    def released(cls) -> DualARConfig:
        """The released Fish Speech 1.5 configuration (spec §1.2); used by `--load-format dummy`."""
        return cls()

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DualARConfig:
        """Build from a `config.json` dictionary, applying the reference's default rules.

        Rules (spec §1.2): `n_local_heads == -1` means `n_head`; a missing `intermediate_size`
        is `round_up(int(8 * dim / 3), 256)`; every missing `fast_*` key takes the slow value.

        Raises:
            ValueError: `model_type` is not "dual_ar", or a key is unknown.
        """
        raw = dict(raw)
        model_type = raw.get("model_type", "dual_ar")
        if model_type != "dual_ar":
            raise ValueError(f"unsupported model_type {model_type!r}: fishserve serves 'dual_ar'")
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known - _TRAINING_ONLY_KEYS - _IGNORED_KEYS
        if unknown:
            raise ValueError(f"unknown config keys: {sorted(unknown)}")
        values = {k: v for k, v in raw.items() if k in known}
        dim = values.get("dim", cls.dim)
        if values.get("n_local_heads", -1) == -1:
            values["n_local_heads"] = values.get("n_head", cls.n_head)
        if "intermediate_size" not in values:
            hidden = int(2 * 4 * dim / 3)
            values["intermediate_size"] = -(-hidden // 256) * 256
        for slow, fast in (
            ("dim", "fast_dim"),
            ("n_head", "fast_n_head"),
            ("n_local_heads", "fast_n_local_heads"),
            ("intermediate_size", "fast_intermediate_size"),
            ("attention_qkv_bias", "fast_attention_qkv_bias"),
        ):
            if values.get(fast, -1) in (-1, None):
                values[fast] = values.get(slow, getattr(cls, slow))
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | Path) -> DualARConfig:
        """Read a `config.json` file.

        Raises:
            FileNotFoundError: the file does not exist.
            ValueError: the file is not valid JSON or has unknown keys.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"model config not found: {path}")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from exc
        return cls.from_dict(raw)

    def to_dict(self) -> dict[str, Any]:
        """The config as a plain dictionary (for logs and health endpoints)."""
        return asdict(self)


DECODER_FILENAME = "firefly-gan-vq-fsq-8x1024-21hz-generator.pth"  # in the release folder


def check_checkpoint_folder(folder: Path) -> None:
    """Raise unless `folder` is a directory (the official layout: config.json, model.pth,
    tokenizer.tiktoken side by side).

    Raises:
        FileNotFoundError: it does not exist, or it is a file (then the message names the
            folder to pass instead).
    """
    if folder.is_file():
        hint = f" ({folder.parent})" if (folder.parent / "config.json").is_file() else ""
        raise FileNotFoundError(
            f"checkpoint {folder} is a file: pass the folder that holds config.json, "
            f"model.pth and tokenizer.tiktoken{hint}"
        )
    if not folder.is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {folder}")


def check_weight_files(
    checkpoint: Path | None, decoder_checkpoint: Path | None, real_weights: bool
) -> None:
    """The checkpoint folder (if given) and decoder weights exist, before anything loads
    (`synth`, `eval`): the decoder weights are `decoder_checkpoint` if given, else, with
    `real_weights`, `DECODER_FILENAME` in the checkpoint folder.

    Raises:
        FileNotFoundError: a missing folder or file (the message says what to pass).
    """
    if checkpoint is not None:
        check_checkpoint_folder(checkpoint)
    if decoder_checkpoint is not None and not decoder_checkpoint.is_file():
        raise FileNotFoundError(f"decoder checkpoint not found: {decoder_checkpoint}")
    if real_weights and decoder_checkpoint is None and checkpoint is not None:
        check_decoder_in(checkpoint)


def check_decoder_in(folder: Path) -> None:
    """Raise unless the release's decoder weights (`DECODER_FILENAME`) are in `folder`.

    Raises:
        FileNotFoundError: they are not (the message says how to give them).
    """
    if not (folder / DECODER_FILENAME).is_file():
        raise FileNotFoundError(
            f"no decoder weights: pass --decoder-checkpoint or put {DECODER_FILENAME} in {folder}"
        )
