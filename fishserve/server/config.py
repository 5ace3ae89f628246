"""Server settings from defaults, a YAML file, environment variables and CLI flags.

Precedence, lowest first: built-in defaults < `--config serve.yaml` < `FISHSERVE_<KEY>`
environment variables < command-line flags. Keys are the same everywhere (`kv_cache_dtype`
in YAML, `FISHSERVE_KV_CACHE_DTYPE` in the environment, `--kv-cache-dtype` on the CLI).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

ENV_PREFIX = "FISHSERVE_"


class ServerConfig(BaseModel):
    """Every setting of `fishserve serve` (see `fishserve serve --help`)."""

    model_config = ConfigDict(extra="forbid")

    # models
    checkpoint: Path | None = None
    decoder_checkpoint: Path | None = None
    decoder_config: Path | None = None
    load_format: Literal["auto", "dummy"] = "auto"
    device: str = "auto"
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    # engine
    kv_cache_dtype: Literal["auto", "fp32", "bf16", "fp16", "int8", "fp8"] = "auto"
    block_size: int = Field(16, ge=1, le=1024)
    max_num_seqs: int = Field(64, ge=1)
    max_num_batched_tokens: int = Field(2048, ge=1)
    memory_budget: str | None = None
    num_kv_blocks: int | None = Field(None, ge=1)
    enforce_eager: bool = False
    # audio
    first_chunk_frames: int = Field(10, ge=1)
    chunk_frames: int = Field(64, ge=1)
    max_decode_batch: int = Field(16, ge=1)
    max_reference_seconds: float = Field(30.0, gt=0)
    # HTTP
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    api_key: str | None = None
    references_dir: Path = Path("references")
    max_waiting: int = Field(256, ge=1)
    max_text_length: int = Field(10_000, ge=1)
    max_body_bytes: int = Field(32 * 2**20, ge=1024)
    request_timeout: float = Field(600.0, gt=0)
    lazy_load: bool = False
    idle_unload_seconds: float = Field(0.0, ge=0)

    @classmethod
    def load(
        cls,
        yaml_path: Path | None = None,
        overrides: dict[str, Any] | None = None,
        environ: dict[str, str] | None = None,
    ) -> ServerConfig:
        """Merge the sources in precedence order and validate.

        Raises:
            FileNotFoundError: the YAML file does not exist.
            ValueError: unknown keys or invalid values (the message names them).
        """
        values: dict[str, Any] = {}
        if yaml_path is not None:
            if not Path(yaml_path).is_file():
                raise FileNotFoundError(f"config file not found: {yaml_path}")
            loaded = yaml.safe_load(Path(yaml_path).read_text()) or {}
            if not isinstance(loaded, dict):
                raise ValueError(f"{yaml_path}: expected a mapping of settings")
            values.update({k.replace("-", "_"): v for k, v in loaded.items()})
        env = os.environ if environ is None else environ
        for key in cls.model_fields:
            if ENV_PREFIX + key.upper() in env:
                values[key] = env[ENV_PREFIX + key.upper()]
        values.update({k: v for k, v in (overrides or {}).items() if v is not None})
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise ValueError(f"invalid server settings: {exc}") from None
