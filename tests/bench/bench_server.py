"""A tiny-fixture fishserve server on 127.0.0.1 (a free port) for the bench tests.

Not a conftest.py: a second `conftest` module would shadow `tests/conftest.py` for the test
modules that import from it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import uvicorn

from fishserve.server.app import create_app
from fishserve.server.config import ServerConfig

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY_T2S = FIXTURES / "tiny_t2s"
TINY_DECODER = FIXTURES / "tiny_decoder"
# The tiny decoder makes 256 samples per code frame at 44.1 kHz (tests/fixtures/README.md).
TINY_FRAME_RATE = 44100 / 256
STARTUP_TIMEOUT_S = 30.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(url: str, thread: threading.Thread) -> None:
    """Poll `/health` until it answers 200.

    Raises:
        RuntimeError: the server thread died or did not answer within the timeout.
    """
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline and thread.is_alive():
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError("tiny server did not start")


@contextlib.contextmanager
def tiny_server(voices_dir: Path, **settings: object) -> Iterator[str]:
    """Run a CPU server with the tiny fixture models; yield its base URL."""
    config = ServerConfig(
        checkpoint=TINY_T2S,
        decoder_checkpoint=TINY_DECODER / "generator.pth",
        decoder_config=TINY_DECODER / "config.json",
        device="cpu",
        references_dir=voices_dir,
        num_kv_blocks=256,
        **settings,
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, thread)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
