"""Bad input gets a clear 4xx naming the problem, and the server keeps serving."""

from __future__ import annotations

import base64
import gzip
import io
import json
import logging
import shutil
import socket
import time

import httpx
import numpy as np
import ormsgpack
import pytest
import soundfile as sf
from conftest import LiveServer, tiny_server_config

from fishserve.audio.encoders import AudioFormat, encode_audio
from fishserve.audio.io import load_audio
from fishserve.server.voices import VoiceNotFoundError, VoiceStore

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
    ({"text": "**  **"}, 400, "text has nothing to speak"),
    ({"text": "\u200b\u200b\ufeff"}, 400, "nothing to speak"),
    ({"text": "\x00\x07", "normalize": False}, 400, "nothing to speak"),
    ({"text": "  ", "normalize": False}, 400, "text is empty"),
    ({"text": "... !? ;"}, 400, "text has nothing to speak: only punctuation"),
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
    ({"text": "hi", "max_new_tokens": 1}, 422, "max_new_tokens"),  # the first frame is no audio
    ({"text": "hi", "max_new_tokens": 10**6}, 422, "max_new_tokens"),
    ({"text": "hi", "seed": -3}, 422, "seed"),
    ({"text": "hi", "streaming": "maybe"}, 422, "streaming"),
    # strict types: no string or boolean read as a number, no number or word as a boolean
    ({"text": "hi", "seed": True}, 422, "seed: Input should be a valid integer"),
    ({"text": "hi", "seed": " 5 "}, 422, "seed: Input should be a valid integer"),
    ({"text": "hi", "temperature": True}, 422, "temperature: Input should be a valid number"),
    ({"text": "hi", "max_new_tokens": "3"}, 422, "max_new_tokens: Input should be a valid"),
    ({"text": "hi", "max_new_tokens": True}, 422, "max_new_tokens: Input should be a valid"),
    ({"text": "hi", "streaming": "yes"}, 422, "streaming: Input should be a valid boolean"),
    ({"text": "hi", "normalize": 0}, 422, "normalize: Input should be a valid boolean"),
    ({"text": "hi", "bogus_field": 1}, 422, "bogus_field"),
    ({"text": "hi", "references": [ref("not base64 !!")]}, 422, "base64"),
    ({"text": "hi", "references": [ref(b"garbage bytes, not audio")]}, 400, "decode"),
    ({"text": "hi", "references": [ref(SILENT)]}, 400, "silent"),
    ({"text": "hi", "references": [ref(LONG)]}, 400, "long"),
    ({"text": "hi", "references": [{"text": "no audio"}]}, 422, "audio"),
    ({"text": "hi", "reference_id": "nobody"}, 404, "not found"),
    ({"text": "hi", "reference_id": "../../etc"}, 400, "invalid voice id"),
    ({"text": "hi", "reference_id": "a/b"}, 400, "invalid voice id"),
    ({"text": "hi", "reference_id": "a..b"}, 400, "without '..'"),
]


@pytest.mark.parametrize(("body", "status", "message"), TTS_CASES)
def test_bad_tts_input(server, body, status, message):
    response = httpx.post(server.url + "/v1/tts", json=body, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()
    assert message in error["message"]
    assert error["statusCode"] == status and error["error"]["message"] == error["message"]
    if message.startswith("text "):  # the field at fault is named
        assert error["error"]["param"] == "text"
        assert "after normalization" not in error["message"] or body.get("normalize", True)
    if status == 400 and body.get("references"):  # refused audio: the inline reference named
        assert error["error"]["param"] == "references.0.audio"


@pytest.mark.parametrize("field", ["temperature", "top_p", "repetition_penalty"])
def test_nan_is_not_a_finite_number(server, field):
    body = f'{{"text": "hi", "{field}": NaN}}'.encode()
    response = httpx.post(
        server.url + "/v1/tts", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422 and "finite number" in response.json()["message"]


@pytest.mark.parametrize(
    ("body", "kind", "message"),
    [
        (b'{"text": "hi", "seed": ' + b"9" * 5000 + b"}", "application/json", "too many digits"),
        (b"\xc1", "application/msgpack", "expected a map"),
        (b"\xd4\x01\x02", "application/msgpack", "expected a map"),  # an ext type
    ],
)
def test_unparsable_bodies_say_so_in_a_client_s_words(server, body, kind, message):
    response = httpx.post(server.url + "/v1/tts", content=body, headers={"content-type": kind})
    assert response.status_code == 400 and message in response.json()["message"]
    assert "sys." not in response.text and "Reserved" not in response.text


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
    body = json.dumps({"text": "Hi.", "max_new_tokens": 2}).encode()
    for encoding, data in (("gzip", gzip.compress(body)), ("br", body), ("identity", body)):
        reply = httpx.post(
            url, content=data, headers={"content-encoding": encoding}, timeout=60
        )  # a body marked compressed is refused, never read as plain (or as garbage)
        expected = 200 if encoding == "identity" else 415
        assert reply.status_code == expected, (encoding, reply.text)
        if expected == 415:
            assert "Content-Encoding" in reply.json()["message"]
    probe = httpx.get(server.url + "/health", headers={"content-encoding": "gzip"})
    assert probe.status_code == 200  # no body, nothing to decompress


OPENAI_CASES = [
    ({"input": "hi"}, 422, "voice"),
    ({"input": "", "voice": "default"}, 422, "input"),
    ({"input": "hi", "voice": "default", "response_format": "aac"}, 400, "aac"),
    ({"input": "hi", "voice": "default", "response_format": "xyz"}, 422, "response_format"),
    ({"input": "hi", "voice": "default", "speed": 2.0}, 400, "speed"),
    ({"input": "hi", "voice": "default", "speed": 9.0}, 422, "speed"),
    ({"input": "hi", "voice": "alloy"}, 404, "not found"),
    (
        {"input": "hi", "voice": "echo"},
        404,
        "use voice 'default' or add a voice via /v1/references",
    ),
    ({"input": "😀 👍", "voice": "default"}, 400, "input is empty"),
    ({"input": "?!", "voice": "default"}, 400, "input has nothing to speak: only punctuation"),
    ({"input": "hi", "voice": "default", "stream_format": "video"}, 422, "stream_format"),
    ({"input": "hi", "voice": "default", "speed": "1"}, 422, "speed: Input should be a valid"),
]


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("/v1/tts", {"text": "hi", "reference_id": "nobody"}, "reference_id"),
        ("/v1/tts", {"text": "hi", "reference_id": "a/b"}, "reference_id"),
        ("/v1/audio/speech", {"input": "hi", "voice": "nobody"}, "voice"),
        ("/v1/audio/speech", {"input": "hi", "voice": "alloy"}, "voice"),
        ("/v1/audio/speech", {"input": "hi", "voice": "../x"}, "voice"),
    ],
)
def test_an_unknown_or_invalid_voice_names_its_field(server, route, body, param):
    response = httpx.post(server.url + route, json=body, timeout=60)
    assert response.status_code in (400, 404), response.text
    assert response.json()["error"]["param"] == param


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
    # a taken id is refused before its audio is read: not a 400 about the audio
    junk = {"audio": ("voice.wav", b"not audio", "audio/wav")}
    taken = httpx.post(base + "/add", data={"id": "alice", "text": "x"}, files=junk)
    assert taken.status_code == 409 and "already exists" in taken.json()["message"]
    empty = httpx.post(base + "/add", data={"id": "", "text": "x"}, files=files)
    assert empty.status_code == 422 and empty.json()["message"].startswith("id is empty")
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
    gone = httpx.request("DELETE", base + "/delete", json={"id": "alice"})
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "reference_id"
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


def test_error_param_names_the_field_or_is_null(server):
    speech = httpx.post(server.url + "/v1/audio/speech", json={"input": "😀", "voice": "default"})
    assert speech.json()["error"]["param"] == "input"
    whole_body = httpx.post(server.url + "/v1/tts", json=[1, 2])
    assert whole_body.status_code == 422 and whole_body.json()["error"]["param"] is None


def test_deeply_nested_json_is_a_400(server):
    deep = b"[" * 100_000 + b"]" * 100_000
    response = httpx.post(
        server.url + "/v1/tts", content=deep, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and "nested too deeply" in response.json()["message"]


@pytest.mark.parametrize("error", [RuntimeError, TypeError])
def test_unexpected_errors_are_logged_500s(server, monkeypatch, caplog, uvicorn_errors, error):
    def broken() -> list[str]:
        raise error("boom")

    monkeypatch.setattr(server.state.voices, "list", broken)
    response = httpx.get(server.url + "/v1/references/list")
    assert response.status_code == 500
    assert response.json()["message"] == f"internal error: {error.__name__}"
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]
    assert len(logged) == 1 and logged[0].exc_info[0] is error
    assert not uvicorn_errors  # logged once, by us


def test_routing_errors_use_the_json_error_shape(server):
    missing = httpx.get(server.url + "/nowhere")
    assert missing.status_code == 404 and missing.json()["statusCode"] == 404
    wrong_method = httpx.put(server.url + "/v1/tts")
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "405"
    bad_multipart = httpx.post(
        server.url + "/v1/references/add",
        content=b"garbage",
        headers={"content-type": "multipart/form-data; boundary=x"},
    )
    assert bad_multipart.status_code == 400 and "message" in bad_multipart.json()
    assert httpx.head(server.url + "/health").status_code == 200


def multipart(fields: dict[str, bytes]) -> tuple[bytes, str]:
    """A multipart/form-data body of `fields` (the one named `audio` as a file)."""
    boundary = "fishserveboundary"
    parts = []
    for name, value in fields.items():
        filename = '; filename="a.wav"' if name == "audio" else ""
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"{filename}\r\n\r\n'
        parts.append(head.encode() + value + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def test_body_limit_holds_for_chunked_uploads(server):
    body, kind = multipart({"id": b"big", "text": b"t", "audio": b"\0" * (3 * 2**20)})

    def chunked():  # no Content-Length: the limit must hold while receiving
        for start in range(0, len(body), 65536):
            yield body[start : start + 65536]

    upload = httpx.post(
        server.url + "/v1/references/add", content=chunked(), headers={"content-type": kind}
    )
    assert upload.status_code == 413, upload.text
    tts = httpx.post(
        server.url + "/v1/tts",
        content=(b'{"text": "' + b"x" * (3 * 2**20) + b'"}' for _ in range(1)),
        headers={"content-type": "application/json"},
    )
    assert tts.status_code == 413


def test_oversized_multipart_field_is_a_413(server):
    body, kind = multipart({"id": b"v", "text": b"x" * (1536 * 1024), "audio": TONE})
    response = httpx.post(
        server.url + "/v1/references/add", content=body, headers={"content-type": kind}
    )
    assert response.status_code == 413 and response.json()["statusCode"] == 413


class Records(logging.Handler):
    """Collects records (uvicorn's loggers do not propagate to caplog)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def uvicorn_errors():
    handler = Records()
    logging.getLogger("uvicorn.error").addHandler(handler)
    yield handler.records
    logging.getLogger("uvicorn.error").removeHandler(handler)


def test_client_gone_mid_upload_logs_no_error(server, caplog, uvicorn_errors):
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(
        b"POST /v1/tts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100000\r\n\r\n{"text": "'
    )
    time.sleep(0.2)
    sock.close()
    time.sleep(0.3)
    assert httpx.get(server.url + "/health").status_code == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not uvicorn_errors


@pytest.mark.parametrize("name", ["default", "DEFAULT", "Default"])
def test_voice_named_default_is_reserved(server, name):
    files = {"audio": ("voice.wav", TONE, "audio/wav")}
    response = httpx.post(
        server.url + "/v1/references/add", data={"id": name, "text": "x"}, files=files
    )
    assert response.status_code == 400 and "reserved" in response.json()["message"]


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("hi".encode("utf-16"), "U+0000"),  # UTF-16: read as Latin-1, NULs between letters
        (b"\x80\x81 hi", "U+0080"),  # not UTF-8: Latin-1 gives C1 controls
        (b"a\x07b", "U+0007"),
    ],
)
def test_a_transcript_with_control_characters_is_refused(server, text, code):
    body, kind = multipart({"id": b"ctl", "text": text, "audio": TONE})
    response = httpx.post(
        server.url + "/v1/references/add", content=body, headers={"content-type": kind}
    )
    assert response.status_code == 422, response.text
    assert code in response.json()["message"] and response.json()["error"]["param"] == "text"
    assert "ctl" not in httpx.get(server.url + "/v1/references/list").json()["reference_ids"]


def test_audio_sent_as_text_is_refused_with_its_reason(server):
    body, kind = multipart({"id": b"as-text", "text": b"t"})
    field = b'--fishserveboundary\r\nContent-Disposition: form-data; name="audio"\r\n\r\n'
    body = field + TONE + b"\r\n" + body  # a text field: no filename
    response = httpx.post(
        server.url + "/v1/references/add", content=body, headers={"content-type": kind}
    )
    assert response.status_code == 422, response.text
    assert "audio must be a file part" in response.json()["message"]
    assert response.json()["error"]["param"] == "audio"


def test_an_sdp_reference_is_refused_at_once(server):
    """FFmpeg would open UDP sockets for it and wait ~20 s for RTP (`AUDIO_DEMUXERS`)."""
    sdp = b"v=0\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 18490 RTP/AVP 0\r\n"
    body, kind = multipart({"id": b"sdp", "text": b"t", "audio": sdp})
    response = httpx.post(
        server.url + "/v1/references/add", content=body, headers={"content-type": kind}
    )
    assert response.status_code == 400, response.text
    assert "not an audio file in a supported container" in response.json()["message"]


def test_a_transcript_keeps_tabs_line_breaks_and_accents(server):
    body, kind = multipart(
        {"id": b"accents", "text": "Café\tnaïve\r\nline".encode(), "audio": TONE}
    )
    response = httpx.post(
        server.url + "/v1/references/add", content=body, headers={"content-type": kind}
    )
    assert response.status_code == 200, response.text


def test_delete_needs_a_reference_id(server):
    for url in ("/v1/references/delete?reference_id=", "/v1/references/delete"):
        response = httpx.request("DELETE", server.url + url)
        assert response.status_code == 422, response.text  # as other missing fields
        assert response.json()["message"] == "reference_id is required"
        assert response.json()["error"]["param"] == "reference_id"


def test_unknown_voice_does_not_list_the_stored_ones(server):
    files = {"audio": ("voice.wav", TONE, "audio/wav")}
    base = server.url + "/v1/references"
    assert httpx.post(base + "/add", data={"id": "secret-name"}, files=files).status_code == 200
    try:
        response = httpx.post(server.url + "/v1/tts", json={**OK, "reference_id": "nobody"})
        assert response.status_code == 404
        assert "secret-name" not in response.text and "/v1/references/list" in response.text
    finally:
        httpx.request("DELETE", base + "/delete", params={"reference_id": "secret-name"})


def test_voice_read_racing_a_delete_is_not_found(tmp_path, monkeypatch):
    store = VoiceStore(tmp_path)
    store.add("v", TONE, "hi")
    find = VoiceStore._audio_file

    def find_then_vanish(folder):  # a delete lands between finding and reading the file
        found = find(folder)
        shutil.rmtree(folder)
        return found

    monkeypatch.setattr(VoiceStore, "_audio_file", staticmethod(find_then_vanish))
    with pytest.raises(VoiceNotFoundError):
        store.get("v")

    def vanish_then_find(folder):  # a delete lands between listing the folder and reading it
        shutil.rmtree(folder)
        return find(folder)

    store.add("w", TONE, "hi")
    monkeypatch.setattr(VoiceStore, "_audio_file", staticmethod(vanish_then_find))
    assert store.list() == []  # skipped, not an error


def test_audio_before_a_corrupt_trailer_is_kept():
    tone = 0.3 * np.sin(2 * np.pi * 220 * np.arange(44100) / 44100)
    mp3 = encode_audio(tone, 44100, AudioFormat.MP3)
    audio = load_audio(mp3 + b"\0" * 4096)
    assert abs(len(audio) - 44100) < 2048


@pytest.mark.parametrize(
    ("route", "body", "message"),
    [
        ("/v1/tts", [1, 2], "body: expected an object (a JSON object or msgpack map)"),
        (
            "/v1/tts",
            {"text": "hi", "references": [5]},
            "references.0: expected an object (a JSON object or msgpack map)",
        ),
        ("/v1/references/delete", [1], 'expected a JSON object like {"reference_id": "..."}'),
        ("/v1/references/delete", {"name": "x"}, "unknown field(s) name: send reference_id"),
        ("/v1/references/delete", {"reference_id": 5}, "reference_id must be a string"),
    ],
)
def test_errors_name_no_internal_classes(server, route, body, message):
    method = "DELETE" if "delete" in route else "POST"
    response = httpx.request(method, server.url + route, json=body, timeout=60)
    assert response.status_code == 422, response.text
    assert response.json()["message"] == message
    assert "instance of" not in response.text and "Body" not in response.text


def test_adding_a_voice_needs_multipart(server):
    url = server.url + "/v1/references/add"
    response = httpx.post(url, json={"id": "v", "text": "hi", "audio": "AAAA"})
    assert response.status_code == 415
    assert "use multipart/form-data with fields id, audio, text" in response.json()["message"]
    response = httpx.post(url, data={"text": "hi"}, files={"audio": ("v.wav", TONE)})
    assert response.status_code == 422 and response.json()["message"].startswith("id missing")


@pytest.mark.parametrize(
    ("fields", "audio", "status", "param"),
    [
        ({"id": "../evil", "text": "x"}, TONE, 400, "id"),
        ({"id": "junk", "text": "x"}, b"RIFFjunk", 400, "audio"),
        ({"id": "chatty", "text": "x" * 2001}, TONE, 422, "text"),
    ],
)
def test_a_refused_voice_names_the_field_at_fault(server, fields, audio, status, param):
    url = server.url + "/v1/references/add"
    response = httpx.post(url, data=fields, files={"audio": ("v.wav", audio)}, timeout=60)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def test_unknown_or_repeated_voice_fields_are_refused(server):
    url = server.url + "/v1/references/add"
    fields = {"id": "extra", "text": "x", "lang": "en"}
    response = httpx.post(url, data=fields, files={"audio": ("v.wav", TONE)}, timeout=60)
    assert response.status_code == 422 and response.json()["error"]["param"] == "lang"
    assert "unknown form field 'lang'" in response.json()["message"]
    twice = [("audio", ("a.wav", TONE)), ("audio", ("b.wav", TONE))]
    response = httpx.post(url, data={"id": "twice", "text": "x"}, files=twice, timeout=60)
    assert response.status_code == 422 and response.json()["error"]["param"] == "audio"
    listed = httpx.get(server.url + "/v1/references/list").json()["reference_ids"]
    assert "extra" not in listed and "twice" not in listed  # nothing stored


def test_a_voice_without_a_transcript_is_stored_with_a_hint(server):
    url = server.url + "/v1/references/add"
    response = httpx.post(url, data={"id": "notext"}, files={"audio": ("v.wav", TONE)}, timeout=60)
    assert response.status_code == 200, response.text
    assert "without a transcript" in response.json()["message"]
    httpx.request("DELETE", server.url + "/v1/references/delete?reference_id=notext")


def test_the_speech_response_names_ignored_fields() -> None:
    from fishserve.server.routes_tts import ignored_fields_note
    from fishserve.server.schemas import SpeechRequest

    plain = SpeechRequest(input="Hi.", voice="default")
    assert ignored_fields_note(plain) is None
    extra = SpeechRequest.model_validate(
        {"input": "Hi.", "voice": "default", "max_new_tokens": 8, "instructions": "calm"}
    )
    note = ignored_fields_note(extra)
    assert note is not None
    assert "instructions are ignored" in note and "ignored: max_new_tokens" in note
    odd = SpeechRequest.model_validate({"input": "Hi.", "voice": "default", "中": 1, "a\nb": 2})
    note = ignored_fields_note(odd)
    assert note is not None and note.isascii() and "\n" not in note  # a valid header value
    assert "\\u4e2d" in note and "a\\nb" in note


def test_the_speech_route_serves_requests_with_odd_extra_field_names(server):
    body = {
        "input": "Hi.",
        "voice": "default",
        "中": 1,
        "a\rX-Evil: 1": 2,
        "response_format": "pcm",
    }
    response = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=120)
    assert response.status_code == 200 and "x-evil" not in response.headers
    assert "ignored" in response.headers["x-fishserve-note"]


def test_a_flood_of_unknown_fields_gets_a_short_422(server):
    """5,000 unknown keys: the 422 names the first ten and counts the rest (it named every
    one, twice: a million keys made an 82 MB answer built on the event loop)."""
    body = {"text": "hi", **{f"k{i}": 0 for i in range(5000)}}
    response = httpx.post(server.url + "/v1/tts", json=body, timeout=60)
    assert response.status_code == 422 and len(response.content) < 4000
    assert response.json()["message"].startswith("5000 unknown fields in body: k0, k1,")
    nested = {"text": "hi", "references": [{"audio": "", **{f"k{i}": 0 for i in range(5000)}}]}
    response = httpx.post(server.url + "/v1/tts", json=nested, timeout=60)
    assert response.status_code == 422 and len(response.content) < 4000
    assert response.json()["error"]["param"] == "references.0"
    flood = {"reference_id": "nobody", **{f"k{i}": 0 for i in range(5000)}}
    response = httpx.request("DELETE", server.url + "/v1/references/delete", json=flood, timeout=60)
    assert response.status_code == 422 and len(response.content) < 4000
    assert "and 4990 more" in response.json()["message"]


def test_a_few_invalid_fields_are_each_named_and_many_are_counted(server):
    """Below the flood guard, pydantic's errors: each named, up to ten, then a count."""
    body = {"text": "hi", "references": [{"audio": 5, "text": 5} for _ in range(8)]}
    response = httpx.post(server.url + "/v1/tts", json=body, timeout=60)
    assert response.status_code == 422
    assert response.json()["message"].endswith("and 6 more")


def test_a_flood_of_unknown_openai_fields_gets_a_short_note(server):
    body = {"input": "hi", "voice": "default", **{f"k{i}": 0 for i in range(5000)}}
    with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, timeout=60) as r:
        assert r.status_code == 200
        note = r.headers["x-fishserve-note"]
    assert len(note) < 400 and note.endswith("(5000 in all)")


@pytest.mark.parametrize("kind", ["application/json", "application/msgpack"])
def test_a_large_body_parsed_off_the_event_loop_still_gets_its_errors(server, kind):
    """Bodies of 64 KiB or more are parsed in a worker thread: nesting too deep and bad
    bytes are still 400s."""
    # JSON: 100,000 open arrays; msgpack: arrays of one array, 100,000 deep
    body = b"[" * 100_000 if kind == "application/json" else b"\x91" * 100_000
    response = httpx.post(
        server.url + "/v1/tts", content=body, headers={"content-type": kind}, timeout=60
    )
    assert response.status_code == 400, response.text


def test_a_stored_transcript_that_is_not_utf8_is_a_server_error_saying_so(server):
    """A `.lab` written by hand in another encoding: a 500 naming the file (the server's
    data is at fault, not the request), not Python's codec message as a 400."""
    files = {"audio": ("voice.wav", TONE, "audio/wav")}
    base = server.url + "/v1/references"
    added = httpx.post(base + "/add", data={"id": "latin", "text": "Hi."}, files=files)
    assert added.status_code == 200, added.text
    lab = next((server.state.config.references_dir / "latin").glob("*.lab"))
    lab.write_bytes("café".encode("latin-1"))
    try:
        body = {"text": "hi", "reference_id": "latin"}
        response = httpx.post(server.url + "/v1/tts", json=body, timeout=60)
        assert response.status_code == 500
        assert "is not UTF-8 text" in response.json()["message"]
    finally:
        httpx.request("DELETE", base + "/delete", json={"reference_id": "latin"})


def test_an_unknown_voice_is_refused_without_listing_the_store(tmp_path, monkeypatch):
    """A 404 must stay cheap: listing scans every voice folder (0.15 s at 3,000 voices)."""
    store = VoiceStore(tmp_path)
    store.add("alice", b"RIFF", "hi")
    monkeypatch.setattr(VoiceStore, "list", lambda self: pytest.fail("listed"))
    for action in (store.get, store.delete):
        with pytest.raises(VoiceNotFoundError, match="'bob' not found"):
            action("bob")


def test_field_names_with_lone_surrogates_are_echoed_escaped(server):
    """JSON may spell a lone surrogate (\\ud800), which UTF-8 cannot encode: an error naming
    such a field must still be a 422 in JSON, not a 400 about a codec."""
    keys = ", ".join(f'"k\\ud800{i}": 0' for i in range(12))
    raw = ('{"text": "hi", ' + keys + "}").encode()
    headers = {"content-type": "application/json"}
    response = httpx.post(server.url + "/v1/tts", content=raw, headers=headers, timeout=60)
    assert response.status_code == 422, response.text
    assert response.json()["message"] == 'field name "k\\ud8000" in body is not valid Unicode'
    for route, raw in (
        ("/v1/tts", b'{"text": "hi", "k\\ud800": 1}'),
        ("/v1/tts", b'{"text": "hi", "references": [{"audio": "", "\\ud800": 1}]}'),
        ("/v1/audio/speech", b'{"input": "hi", "voice": "default", "x\\ud800": 1}'),
    ):
        response = httpx.post(server.url + route, content=raw, headers=headers, timeout=60)
        assert response.status_code == 422, response.text
        error = response.json()
        assert "is not valid Unicode" in error["message"] and "\\ud800" in error["error"]["param"]
    one = b'{"\\ud800": 1}'
    url = server.url + "/v1/references/delete"
    response = httpx.request("DELETE", url, content=one, headers=headers, timeout=60)
    assert response.status_code == 422 and "\\ud800" in response.json()["message"]


def test_a_json_flood_of_values_is_refused_before_parsing(server):
    """A body of more values than any request has is a 400 before `json.loads` builds them
    (it held the GIL ~1.5 s for 32 MiB); commas inside a text of the allowed length pass."""
    from fishserve.server.value_floods import json_comma_limit

    limit = json_comma_limit(500)  # max_text_length 500 here
    flood = '{"text": "hi", "references": [' + ",".join(["1"] * (limit + 1)) + "]}"
    refused = httpx.post(
        server.url + "/v1/tts", content=flood, headers={"content-type": "application/json"}
    )
    assert refused.status_code == 400, refused.text
    assert f"({limit + 1} commas; at most {limit})" in refused.json()["message"]
    # texts full of commas are not refused as a flood
    for route, body in (
        ("/v1/tts", {**OK, "text": "a," * 250}),
        ("/v1/audio/speech", {"input": "b," * 30, "voice": "default"}),
    ):
        parsed = httpx.post(server.url + route, json=body, timeout=60)
        assert b"JSON values" not in parsed.content


def test_a_msgpack_flood_of_objects_is_refused_before_parsing(server):
    """8 MiB of empty msgpack maps held the GIL ~1.2 s in `ormsgpack.unpackb`; a valid request
    with large binary reference audio is not counted by its bytes."""
    from fishserve.server.value_floods import SPARE_VALUES

    headers = {"content-type": "application/msgpack"}
    for flood in (
        {"text": "hi", "references": [{}] * (SPARE_VALUES + 1)},
        {"text": "hi", "x": [[[1, 2.5, None, "s", b"b"]]] * 300},
    ):
        packed = ormsgpack.packb(flood)
        refused = httpx.post(server.url + "/v1/tts", content=packed, headers=headers)
        assert refused.status_code == 400, refused.text
        assert "more msgpack objects than a request has" in refused.json()["message"]
    body = {**OK, "references": [{"audio": TONE, "text": "A tone."}]}
    fine = httpx.post(server.url + "/v1/tts", content=ormsgpack.packb(body), headers=headers)
    assert fine.status_code == 200, fine.text
    plain = httpx.post(
        server.url + "/v1/tts", content=b"," * 30_000, headers={"content-type": "text/plain"}
    )
    assert plain.status_code == 415  # not counted as JSON
    fits = httpx.post(server.url + "/v1/tts", json={**OK, "text": "a, b, c."}, timeout=60)
    assert fits.status_code == 200, fits.text
