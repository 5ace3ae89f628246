"""Workloads and request bodies: built-in mix, files, Fish and OpenAI bodies."""

from __future__ import annotations

import base64

import pytest

from fishserve.bench.workload import (
    RequestShape,
    WorkItem,
    builtin_workload,
    read_workload,
    request_body,
)


def test_builtin_workload_interleaves_every_length_and_language():
    items = builtin_workload()
    first_six = {item.category for item in items[:6]}
    assert first_six == {
        f"{n}-{lang}" for n in ("short", "medium", "long") for lang in ("en", "zh")
    }
    assert len({item.text for item in items}) == len(items)


def test_builtin_workload_filters_and_rejects_unknown_names():
    assert {i.category for i in builtin_workload(("short",), ("zh",))} == {"short-zh"}
    with pytest.raises(ValueError, match="length"):
        builtin_workload(("tiny",), ("en",))


def test_read_workload_txt_and_jsonl(tmp_path):
    txt = tmp_path / "w.txt"
    txt.write_text("one\n\n two \n", encoding="utf-8")
    assert read_workload(txt) == [WorkItem("one", "file"), WorkItem("two", "file")]
    jsonl = tmp_path / "w.jsonl"
    jsonl.write_text('{"text": "a", "category": "x"}\n{"text": "b"}\n', encoding="utf-8")
    assert read_workload(jsonl) == [WorkItem("a", "x"), WorkItem("b", "file")]
    jsonl.write_text('{"no_text": 1}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"w\.jsonl:1"):
        read_workload(jsonl)


def test_fish_body_has_fixed_seed_length_and_reference():
    shape = RequestShape(
        max_new_tokens=32, ignore_eos=True, seed=7, reference_audio=b"RIFF", reference_text="hi"
    )
    body = request_body(shape, WorkItem("hello", "short-en"), index=3)
    assert body["text"] == "hello" and body["format"] == "pcm" and body["streaming"] is True
    assert body["seed"] == 10 and body["max_new_tokens"] == 32 and body["ignore_eos"] is True
    assert base64.b64decode(body["references"][0]["audio"]) == b"RIFF"
    assert body["references"][0]["text"] == "hi"
    assert shape.path == "/v1/tts"


def test_openai_body_uses_voice_and_extra_fields():
    shape = RequestShape(api="openai", reference_id="alice", extra_body={"speed": 1.0})
    body = request_body(shape, WorkItem("hello", "x"), index=0)
    assert body == {
        "model": "fish-speech-1.5",
        "input": "hello",
        "voice": "alice",
        "response_format": "pcm",
        "speed": 1.0,
    }
    assert shape.path == "/v1/audio/speech"
    assert request_body(RequestShape(api="openai"), WorkItem("x", "x"), 0)["voice"] == "default"
