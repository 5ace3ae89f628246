"""Bad input gets a clear 4xx naming the problem, and the server keeps serving."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
import soundfile as sf
from conftest import LiveServer, tiny_server_config

OK = {"text": "Fine.", "max_new_tokens": 4, "ignore_eos": True}


def wav_bytes(samples: np.ndarray, rate: int = 44100) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format="WAV")
    return buffer.getvalue()


TONE = wav_bytes(0.3 * np.sin(2 * np.pi * 220 * np.arange(22050) / 44100))
SILENT = wav_bytes(np.zeros(22050))
LONG = wav_bytes(0.3 * np.sin(np.arange(44100 * 3) / 10.0))  # 3 s > the 2 s test limit


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    config = tiny_server_config(
        tmp_path_factory.mktemp("val"),
        max_text_length=500,
        max_body_bytes=2 * 2**20,
        max_reference_seconds=2.0,
    )
    with LiveServer(config) as live:
        yield live


def ref(audio: bytes | str, text: str = "hi") -> dict:
    return {
        "audio": audio if isinstance(audio, str) else base64.b64encode(audio).decode(),
        "text": text,
    }


TTS_CASES = [
    ({"text": ""}, 422, "text"),
    ({"text": "   \n "}, 400, "empty"),
    ({"text": "**  **"}, 400, "empty"),
    ({}, 422, "text"),
    ({"text": 5}, 422, "text"),
    ({"text": "x" * 501}, 400, "limit"),
    ({"text": "hi", "chunk_length": 5}, 422, "chunk_length"),
    ({"text": "hi", "format": "ogg"}, 422, "format"),
    ({"text": "hi", "top_p": 0}, 422, "top_p"),
    ({"text": "hi", "top_p": 1.5}, 422, "top_p"),
    ({"text": "hi", "temperature": -1}, 422, "temperature"),
    ({"text": "hi", "temperature": "hot"}, 422, "temperature"),
    ({"text": "hi", "repetition_penalty": 3}, 422, "repetition_penalty"),
    ({"text": "hi", "max_new_tokens": 0}, 422, "max_new_tokens"),
    ({"text": "hi", "max_new_tokens": 10**6}, 422, "max_new_tokens"),
    ({"text": "hi", "seed": -3}, 422, "seed"),
    ({"text": "hi", "streaming": "maybe"}, 422, "streaming"),
    ({"text": "hi", "bogus_field": 1}, 422, "bogus_field"),
    ({"text": "hi", "references": [ref("not base64 !!")]}, 422, "base64"),
    ({"text": "hi", "references": [ref(b"garbage bytes, not audio")]}, 400, "decode"),
    ({"text": "hi", "references": [ref(SILENT)]}, 400, "silent"),
    ({"text": "hi", "references": [ref(LONG)]}, 400, "long"),
    ({"text": "hi", "references": [{"text": "no audio"}]}, 422, "audio"),
    ({"text": "hi", "reference_id": "nobody"}, 404, "not found"),
    ({"text": "hi", "reference_id": "../../etc"}, 400, "invalid voice id"),
    ({"text": "hi", "reference_id": "a/b"}, 400, "invalid voice id"),
]


@pytest.mark.parametrize(("body", "status", "message"), TTS_CASES)
def test_bad_tts_input(server, body, status, message):
    response = httpx.post(server.url + "/v1/tts", json=body, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()
    assert message in error["message"]
    assert error["statusCode"] == status and error["error"]["message"] == error["message"]


def test_malformed_bodies(server):
    url = server.url + "/v1/tts"
    assert (
        httpx.post(
            url, content=b"{not json", headers={"content-type": "application/json"}
        ).status_code
        == 400
    )
    assert (
        httpx.post(
            url, content=b"\xc1", headers={"content-type": "application/msgpack"}
        ).status_code
        == 400
    )
    assert (
        httpx.post(url, content=b"text=hi", headers={"content-type": "text/plain"}).status_code
        == 415
    )
    assert (
        httpx.post(url, content=b"[1, 2]", headers={"content-type": "application/json"}).status_code
        == 422
    )
    big = httpx.post(url, content=b"x" * (3 * 2**20), headers={"content-type": "application/json"})
    assert big.status_code == 413


OPENAI_CASES = [
    ({"input": "hi"}, 422, "voice"),
    ({"input": "", "voice": "default"}, 422, "input"),
    ({"input": "hi", "voice": "default", "response_format": "aac"}, 400, "aac"),
    ({"input": "hi", "voice": "default", "response_format": "xyz"}, 422, "response_format"),
    ({"input": "hi", "voice": "default", "speed": 2.0}, 400, "speed"),
    ({"input": "hi", "voice": "default", "speed": 9.0}, 422, "speed"),
    ({"input": "hi", "voice": "alloy"}, 404, "not found"),
    ({"input": "hi", "voice": "default", "stream_format": "video"}, 422, "stream_format"),
]


@pytest.mark.parametrize(("body", "status", "message"), OPENAI_CASES)
def test_bad_openai_input(server, body, status, message):
    response = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=60)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"]


def test_voices_add_list_use_delete(server):
    base = server.url + "/v1/references"
    files = {"audio": ("voice.wav", TONE, "audio/wav")}
    added = httpx.post(base + "/add", data={"id": "alice", "text": "Hello."}, files=files)
    assert added.status_code == 200, added.text
    again = httpx.post(base + "/add", data={"id": "alice", "text": "x"}, files=files)
    assert again.status_code == 409
    assert (
        httpx.post(base + "/add", data={"id": "../evil", "text": "x"}, files=files).status_code
        == 400
    )
    assert (
        httpx.post(
            base + "/add",
            data={"id": "bad", "text": "x"},
            files={"audio": ("s.wav", SILENT, "audio/wav")},
        ).status_code
        == 400
    )
    assert httpx.get(base + "/list").json()["reference_ids"] == ["alice"]
    spoken = httpx.post(server.url + "/v1/tts", json={**OK, "reference_id": "alice"}, timeout=60)
    assert spoken.status_code == 200
    openai = httpx.post(
        server.url + "/v1/audio/speech",
        timeout=60,
        json={"input": "hi", "voice": "alice", "response_format": "wav"},
    )
    assert openai.status_code == 200
    assert (
        httpx.request("DELETE", base + "/delete", json={"reference_id": "alice"}).status_code == 200
    )
    assert httpx.request("DELETE", base + "/delete", json={"id": "alice"}).status_code == 404
    assert httpx.get(base + "/list").json()["reference_ids"] == []


def test_voices_survive_a_restart(tmp_path):
    config = tiny_server_config(tmp_path)
    with LiveServer(config) as live:
        files = {"audio": ("v.flac", TONE, "audio/flac")}
        assert (
            httpx.post(
                live.url + "/v1/references/add", data={"id": "bob", "text": "Hi."}, files=files
            ).status_code
            == 200
        )
    with LiveServer(config) as live:
        assert httpx.get(live.url + "/v1/references/list").json()["reference_ids"] == ["bob"]


def test_server_still_serves_after_bad_input(server):
    assert httpx.post(server.url + "/v1/tts", json=OK, timeout=60).status_code == 200
