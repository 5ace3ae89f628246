"""Shared fixtures: paths of the reference parity fixtures and the tiny models built from them."""

from __future__ import annotations

import os

# Before torch loads MKL: fixed threading keeps CPU results identical run to run (see
# fishserve/__init__.py); the parity fixtures have near-ties by design.
os.environ.setdefault("MKL_DYNAMIC", "FALSE")
# MKL's conditional numerical reproducibility: results independent of buffer alignment.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from fishserve.models.config import DualARConfig

# One intra-op thread: the engine, decoder and HTTP threads of the server tests would otherwise
# oversubscribe a 2-core CI machine; results are the same (checked at 1 and 2 threads).
torch.set_num_threads(1)
from fishserve.models.dual_ar import DualARTransformer
from fishserve.models.loading import build_model, load_weights

FIXTURES = Path(__file__).parent / "fixtures"
TINY_T2S = FIXTURES / "tiny_t2s"
TINY_DECODER = FIXTURES / "tiny_decoder"
# Fixture tokenizer ids (tests/fixtures/README.md, tiny_t2s section).
TINY_SEMANTIC = (309, 1332)
TINY_IM_END = 301


def load_tiny_model(dtype: torch.dtype = torch.float32) -> DualARTransformer:
    """The tiny fixture DualAR model on CPU in `dtype`."""
    config = DualARConfig.from_file(TINY_T2S / "config.json")
    return build_model(config, TINY_SEMANTIC, load_weights(TINY_T2S), "cpu", dtype)


@pytest.fixture(scope="session")
def tiny_model() -> DualARTransformer:
    return load_tiny_model()


@pytest.fixture(scope="session")
def generate_case() -> dict[str, torch.Tensor]:
    return load_file(TINY_T2S / "generate_case.safetensors")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from fishserve.models.tokenizer import FishTokenizer

    return FishTokenizer(TINY_T2S)


def make_engine(model, tokenizer, **overrides):
    """An `LLMEngine` on the tiny model with a small fp32 KV pool (overridable)."""
    from fishserve.engine.engine import EngineConfig, LLMEngine

    settings = {"kv_cache_dtype": "fp32", "num_kv_blocks": 64, "max_num_seqs": 8}
    settings.update(overrides)
    return LLMEngine(model, tokenizer, EngineConfig(**settings))


def run_engine(engine, requests, max_steps: int = 10_000):
    """Submit `requests`, step until idle; return {request_id: (codes (nc, n), finish event)}."""
    for request in requests:
        engine.add_request(request)
    frames = {r.request_id: [] for r in requests}
    finals = {}
    for _ in range(max_steps):
        if not engine.has_work():
            break
        for event in engine.step():
            if event.codes is not None:
                frames[event.request_id].append(event.codes)
            if event.finished:
                finals[event.request_id] = event
    else:
        raise AssertionError("engine did not finish")
    nc = engine.model.config.num_codebooks
    return {
        rid: (
            torch.from_numpy(np.stack(f, 1)) if f else torch.zeros(nc, 0, dtype=torch.long),
            finals.get(rid),
        )
        for rid, f in frames.items()
    }


def tiny_server_config(tmp_path: Path, **overrides):
    """`ServerConfig` for the tiny fixture models on CPU."""
    from fishserve.server.config import ServerConfig

    settings = {
        "checkpoint": TINY_T2S,
        "decoder_checkpoint": TINY_DECODER / "generator.pth",
        "decoder_config": TINY_DECODER / "config.json",
        "device": "cpu",
        "references_dir": tmp_path / "voices",
        "num_kv_blocks": 512,
        "port": 0,
    }
    settings.update(overrides)
    return ServerConfig(**settings)


class LiveServer:
    """A real uvicorn server on 127.0.0.1 in a background thread."""

    def __init__(self, config) -> None:
        import socket
        import threading

        import uvicorn

        from fishserve.server.app import create_app

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.app = create_app(config)
        from fishserve.server.http_protocol import uvicorn_options

        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            **uvicorn_options(config.max_connections),  # as `fishserve serve` runs it
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LiveServer:
        import time

        import httpx

        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("server did not start")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    @property
    def state(self):
        """The app's `ServerState` (for white-box checks)."""
        return self.app.state.server


@pytest.fixture(scope="session")
def tiny_decoder():
    """The tiny fixture decoder: 4 groups, 256 samples/frame, 44.1 kHz, CPU fp32."""
    from fishserve.models.firefly import load_firefly

    return load_firefly(TINY_DECODER / "generator.pth", TINY_DECODER / "config.json")


def random_codes(groups: int, frames: int, seed: int):
    """``(groups, frames)`` int64 codes in [0, 1024): the LLM's range, ids >= 1000 included."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, 1024, size=(groups, frames), dtype=np.int64)


def one_shot(decoder, codes):
    """Decode ``(G, L)`` codes in one call -> ``(L * frame_samples,)`` float32."""
    wave, _ = decoder.decode(torch.from_numpy(codes)[None], torch.tensor([codes.shape[1]]))
    return wave[0, 0].numpy()


def assert_same_pcm(a: bytes, b: bytes, lsb: int = 1) -> None:
    """Two 16-bit PCM bodies of one request agree: same length, samples within ``lsb``.

    The streaming decoder's chunk boundaries follow the engine's timing, and a chunk decoded
    from its layers' state rounds differently from a longer call by ~1e-7 (README, Correctness:
    audio within 1 LSB of 16-bit PCM), so two runs of the same codes may differ by one step.
    """
    x, y = np.frombuffer(a, dtype="<i2"), np.frombuffer(b, dtype="<i2")
    assert len(x) == len(y), (len(x), len(y))
    worst = int(np.abs(x.astype(np.int32) - y.astype(np.int32)).max(initial=0))
    assert worst <= lsb, f"samples differ by up to {worst} LSB"


class RecordingDecoder:
    """Wraps a decoder and records the codes shape ``(B, G, L)`` of every ``decode`` call."""

    def __init__(self, decoder) -> None:
        self.inner, self.config, self.device = decoder, decoder.config, decoder.device
        self.calls: list[tuple[int, ...]] = []

    def decode(self, codes: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.calls.append(tuple(codes.shape))
        return self.inner.decode(codes, lengths)

    def decode_unchecked(self, codes: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        self.calls.append(tuple(codes.shape))
        return self.inner.decode_unchecked(codes, lengths)
