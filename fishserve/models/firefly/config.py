"""Configuration of the Firefly VQ-GAN decoder/encoder (spec §4.1).

The official configuration is a hydra-style YAML file (``firefly_gan_vq.yaml``) whose sections carry
``_target_`` class paths. :meth:`FireflyConfig.from_file` reads that file (or its JSON form),
ignores every ``_target_`` key and rejects any other key it does not know.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "BackboneConfig",
    "FireflyConfig",
    "HeadConfig",
    "QuantizerConfig",
    "SpecConfig",
]


@dataclass(frozen=True)
class SpecConfig:
    """Log-mel front end (``spec_transform``, spec §4.1 and §4.6).

    Units: ``sample_rate`` in Hz, ``n_fft``/``win_length``/``hop_length`` in samples,
    ``f_min``/``f_max`` in Hz (``f_max=None`` means ``sample_rate / 2``).
    """

    sample_rate: int = 44100
    n_mels: int = 160
    n_fft: int = 2048
    hop_length: int = 512
    win_length: int = 2048
    f_min: float = 0.0
    f_max: float | None = None
    center: bool = False


@dataclass(frozen=True)
class BackboneConfig:
    """ConvNeXt encoder (``backbone``, spec §4.1). Used by the encode path only.

    ``drop_path_rate`` and ``layer_scale_init_value`` only matter for training / random init.
    """

    input_channels: int = 160
    depths: tuple[int, ...] = (3, 3, 9, 3)
    dims: tuple[int, ...] = (128, 256, 384, 512)
    drop_path_rate: float = 0.2
    layer_scale_init_value: float = 1e-6
    kernel_size: int = 7


@dataclass(frozen=True)
class HeadConfig:
    """HiFi-GAN generator head (``head``, spec §4.1 and §4.3). Used by the decode path only."""

    hop_length: int = 512
    upsample_rates: tuple[int, ...] = (8, 8, 2, 2, 2)
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 4, 4, 4)
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    num_mels: int = 512
    upsample_initial_channel: int = 512
    pre_conv_kernel_size: int = 13
    post_conv_kernel_size: int = 13


@dataclass(frozen=True)
class QuantizerConfig:
    """Downsampling grouped FSQ quantizer (``quantizer``, spec §4.1 and §4.4).

    Each of the ``n_groups`` groups owns ``all_dims[-1] / n_groups`` channels (64 for the release)
    and one FSQ codebook of ``prod(levels)`` codes (1000). Only ``n_codebooks = 1`` is supported.
    """

    input_dim: int = 512
    n_groups: int = 8
    n_codebooks: int = 1
    levels: tuple[int, ...] = (8, 5, 5, 5)
    downsample_factor: tuple[int, ...] = (2, 2)
    downsample_dims: tuple[int, ...] | None = None

    @property
    def all_dims(self) -> tuple[int, ...]:
        """Channel widths before/after each downsample stage: ``(input_dim, *downsample_dims)``."""
        dims = self.downsample_dims or (self.input_dim,) * len(self.downsample_factor)
        return (self.input_dim, *dims)


_SECTIONS: dict[str, type] = {
    "spec_transform": SpecConfig,
    "backbone": BackboneConfig,
    "head": HeadConfig,
    "quantizer": QuantizerConfig,
}


@dataclass(frozen=True)
class FireflyConfig:
    """Full Firefly GAN VQ configuration (spec §4.1).

    Use :meth:`released` for the released ``firefly-gan-vq-fsq-8x1024-21hz`` settings and
    :meth:`from_file` / :meth:`from_dict` for an official hydra-style config.
    """

    spec_transform: SpecConfig = dataclasses.field(default_factory=SpecConfig)
    backbone: BackboneConfig = dataclasses.field(default_factory=BackboneConfig)
    head: HeadConfig = dataclasses.field(default_factory=HeadConfig)
    quantizer: QuantizerConfig = dataclasses.field(default_factory=QuantizerConfig)

    def __post_init__(self) -> None:
        _validate(self)

    # ----------------------------------------------------------------- constructors
    @classmethod
    def released(cls) -> FireflyConfig:
        """The released Fish Speech 1.5 decoder config (spec §4.1; 44.1 kHz, 2048 samples/frame)."""
        return cls()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FireflyConfig:
        """Build from the official nested mapping (``_target_`` keys are ignored).

        All four sections must be present; a key absent from a section takes the released value.

        Raises:
            ValueError: unknown or missing keys, wrong value types or inconsistent sizes.
        """
        if not isinstance(data, dict):
            raise ValueError(f"Firefly config must be a mapping, got {type(data).__name__}")
        top = {k: v for k, v in data.items() if k != "_target_"}
        unknown = sorted(set(top) - set(_SECTIONS))
        if unknown:
            raise ValueError(
                f"unknown Firefly config section(s) {unknown}; known: {list(_SECTIONS)}"
            )
        missing = sorted(set(_SECTIONS) - set(top))
        if missing:
            raise ValueError(f"Firefly config is missing section(s) {missing}")
        parts = {name: _section(name, kind, top[name]) for name, kind in _SECTIONS.items()}
        return cls(**parts)

    @classmethod
    def from_file(cls, path: str | Path) -> FireflyConfig:
        """Read an official ``firefly_gan_vq.yaml`` (hydra style) or its JSON form.

        Raises:
            FileNotFoundError: ``path`` does not exist.
            ValueError: the file does not parse or holds an invalid config (see :meth:`from_dict`).
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"Firefly config file not found: {path}")
        text = path.read_text(encoding="utf-8")
        try:
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise ValueError(f"cannot parse Firefly config {path}: {exc}") from exc
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """Nested plain-python form (lists instead of tuples, no ``_target_`` keys)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    # ----------------------------------------------------------------- derived sizes
    @property
    def sample_rate(self) -> int:
        """Audio sample rate in Hz (44100 for the release)."""
        return self.spec_transform.sample_rate

    @property
    def hop_length(self) -> int:
        """Mel hop in samples (512 for the release)."""
        return self.spec_transform.hop_length

    @property
    def downsample_factor(self) -> int:
        """Mel frames per code frame: ``prod(quantizer.downsample_factor)`` (4 for the release)."""
        return math.prod(self.quantizer.downsample_factor)

    @property
    def frame_samples(self) -> int:
        """Audio samples per code frame: ``hop * prod(downsample)`` (2048 release, 256 tiny)."""
        return self.hop_length * self.downsample_factor

    @property
    def frame_rate(self) -> float:
        """Code frames per second of audio: ``sample_rate / frame_samples`` (21.53 release)."""
        return self.sample_rate / self.frame_samples

    @property
    def n_groups(self) -> int:
        """Codes per frame (rows of the code tensor; 8 for the release)."""
        return self.quantizer.n_groups

    @property
    def codebook_size(self) -> int:
        """Distinct codes per group: ``prod(levels)`` (1000 for the release)."""
        return math.prod(self.quantizer.levels)


def _section(name: str, kind: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ValueError(f"Firefly config section {name!r} must be a mapping")
    fields = {f.name: f for f in dataclasses.fields(kind)}
    values = {k: v for k, v in raw.items() if k != "_target_"}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in Firefly config section {name!r}")
    return kind(**{k: _coerce(name, k, v) for k, v in values.items()})


def _coerce(section: str, key: str, value: Any) -> Any:
    """Lists become (nested) tuples so that configs stay hashable and immutable."""
    if isinstance(value, list):
        return tuple(_coerce(section, key, v) for v in value)
    if value is not None and not isinstance(value, int | float | bool | tuple):
        raise ValueError(f"Firefly config {section}.{key} has unsupported value {value!r}")
    return value


def _validate(cfg: FireflyConfig) -> None:
    """Check the cross-section size constraints the architecture relies on (raises ValueError)."""
    s, b, h, q = cfg.spec_transform, cfg.backbone, cfg.head, cfg.quantizer
    checks = [
        (not s.center, "spec_transform.center=True is not supported (the model uses center=False)"),
        (s.win_length <= s.n_fft, "spec_transform.win_length must be <= n_fft"),
        (s.hop_length <= s.win_length, "spec_transform.hop_length must be <= win_length"),
        (b.input_channels == s.n_mels, "backbone.input_channels must equal spec_transform.n_mels"),
        (
            len(b.depths) == len(b.dims) > 0,
            "backbone.depths and backbone.dims must match in length",
        ),
        (
            b.dims[-1] == q.input_dim if b.dims else False,
            "backbone.dims[-1] != quantizer.input_dim",
        ),
        (h.num_mels == q.input_dim, "head.num_mels must equal quantizer.input_dim"),
        (
            len(h.upsample_rates) == len(h.upsample_kernel_sizes),
            "head.upsample_rates and head.upsample_kernel_sizes must match in length",
        ),
        (
            math.prod(h.upsample_rates) == s.hop_length,
            "prod(head.upsample_rates) must equal spec_transform.hop_length",
        ),
        (
            all(k >= r for k, r in zip(h.upsample_kernel_sizes, h.upsample_rates, strict=False)),
            "each head upsample kernel must be >= its rate",
        ),
        (
            len(h.resblock_kernel_sizes) == len(h.resblock_dilation_sizes),
            "head.resblock_kernel_sizes and resblock_dilation_sizes must match in length",
        ),
        (
            h.upsample_initial_channel >> len(h.upsample_rates) >= 1,
            "head.upsample_initial_channel too small for the number of upsample stages",
        ),
        (q.n_codebooks == 1, "only quantizer.n_codebooks = 1 is supported"),
        (q.all_dims[-1] % q.n_groups == 0, "the quantized width must be divisible by n_groups"),
        (all(lv >= 2 for lv in q.levels), "quantizer.levels must all be >= 2"),
        (
            q.downsample_dims is None or len(q.downsample_dims) == len(q.downsample_factor),
            "quantizer.downsample_dims must match downsample_factor in length",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(f"invalid Firefly config: {message}")
