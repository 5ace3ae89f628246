"""The connection layer: silent or slow-header connections are closed; requests are not."""

from __future__ import annotations

import logging
import socket
import time

import httpx
import pytest
from conftest import LiveServer, tiny_server_config

from fishserve.server.http_protocol import AcceptErrorFilter, HeaderTimeoutH11Protocol

TIMEOUT = 0.5  # seconds: the header timeout in these tests


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A lazily loading server (no models needed to answer /health) with a short timeout."""
    patch = pytest.MonkeyPatch()
    patch.setattr(HeaderTimeoutH11Protocol, "header_timeout", TIMEOUT)
    config = tiny_server_config(tmp_path_factory.mktemp("http"), lazy_load=True)
    with LiveServer(config) as live:
        yield live
    patch.undo()


def _closed_within(sock: socket.socket, seconds: float, drip: bytes = b"") -> float | None:
    """Seconds until the server closes `sock` (None: still open after `seconds`), sending
    `drip` one byte every 0.1 s meanwhile."""
    start = time.monotonic()
    sock.settimeout(0.1)
    sent = 0
    while time.monotonic() - start < seconds:
        if sent < len(drip):
            try:
                sock.send(drip[sent : sent + 1])
            except OSError:
                return time.monotonic() - start
            sent += 1
        try:
            if sock.recv(1024) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - start
    return None


def test_a_connection_that_sends_nothing_is_closed(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        closed = _closed_within(sock, 5.0)
    assert closed is not None and closed >= TIMEOUT * 0.9


def test_headers_dripped_a_byte_at_a_time_are_cut_off(server):
    drip = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        closed = _closed_within(sock, 5.0, drip)
    assert closed is not None and closed < 3.0


def test_a_slow_body_after_its_headers_is_not_cut_by_the_header_timeout(server):
    body = b'{"reference_id": "nobody"}'
    head = (
        b"DELETE /v1/references/delete HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(head)
        time.sleep(TIMEOUT * 3)  # the body comes well after the header timeout
        sock.sendall(body)
        sock.settimeout(10)
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 404"), reply[:80]  # answered: an unknown voice


def test_keep_alive_requests_still_work(server):
    with httpx.Client(base_url=server.url) as client:
        for _ in range(3):
            assert client.get("/health").status_code == 200
            time.sleep(TIMEOUT / 2)


def test_accept_errors_are_logged_once_per_interval():
    filt = AcceptErrorFilter(interval=60.0)

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)

    first = record(AcceptErrorFilter.MESSAGE + "\nsocket: <...>")
    assert filt.filter(first)
    assert not any(filt.filter(record(AcceptErrorFilter.MESSAGE)) for _ in range(100))
    assert filt.filter(record("Task exception was never retrieved"))  # others pass
    filt._last -= 61.0  # a minute later
    later = record(AcceptErrorFilter.MESSAGE)
    assert filt.filter(later) and "100 more" in later.msg


def test_requests_beyond_max_connections_get_a_json_503_with_retry_after(tmp_path):
    """With `max_connections` 3, two connections holding a slow upload leave room for a
    third; with three of them the fourth gets a 503 in the server's JSON shape; once the
    uploads go away, requests are served again."""
    config = tiny_server_config(tmp_path, lazy_load=True, max_connections=3)
    head = b"POST /v1/tts HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
    with LiveServer(config) as live:
        slow = []
        try:
            for count in (2, 3):
                while len(slow) < count:  # headers complete, body still to come
                    slow.append(socket.create_connection(("127.0.0.1", live.port)))
                    slow[-1].sendall(head + b"Content-Length: 100\r\n\r\n{")
                time.sleep(0.3)
                if count == 2:
                    assert httpx.get(live.url + "/health", timeout=10).status_code == 200
            refused = httpx.get(live.url + "/health", timeout=10)
            assert refused.status_code == 503, refused.text
            assert refused.headers["retry-after"] and refused.headers["connection"] == "close"
            assert "max_connections" in refused.json()["message"]
        finally:
            for sock in slow:
                sock.close()
        for _ in range(50):
            if httpx.get(live.url + "/health", timeout=10).status_code == 200:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the server did not serve again after the uploads left")


def test_the_open_file_limit_is_raised_to_the_connection_cap():
    import resource

    from fishserve.server.http_protocol import SPARE_DESCRIPTORS, raise_open_file_limit

    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, before[1]))
        wanted = 500 + SPARE_DESCRIPTORS
        assert raise_open_file_limit(500) == min(wanted, before[1])
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == min(wanted, before[1])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)
