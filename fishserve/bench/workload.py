"""Benchmark workloads: which texts are spoken, and the JSON body each API gets for them.

The built-in set mixes three lengths in English and Chinese (short: one phrase, one text
segment; medium: a few sentences, about one 200-byte segment; long: a paragraph, several
segments). A workload file gives one text per line (`.txt`) or one JSON object with a `text`
field per line (`.jsonl`). Request i speaks text i mod n with seed `seed + i`, so two runs with
the same options send byte-identical requests.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Api = Literal["fish", "openai"]
API_PATHS: dict[str, str] = {"fish": "/v1/tts", "openai": "/v1/audio/speech"}
LENGTHS = ("short", "medium", "long")
LANGUAGES = ("en", "zh")

BUILTIN_TEXTS: dict[tuple[str, str], list[str]] = {
    ("short", "en"): [
        "Good morning, and welcome aboard.",
        "Please leave your message after the tone.",
        "The library closes at nine tonight.",
    ],
    ("medium", "en"): [
        "The train to the coast leaves from platform four. Passengers with bicycles should "
        "board the last carriage, and everyone is asked to keep the doors clear while the "
        "train is stopped.",
        "Our garden changed a lot this spring. The old apple tree finally came down, so we "
        "planted tomatoes, beans and a row of sunflowers where its shade used to be.",
    ],
    ("long", "en"): [
        "When the storm finally passed, the village came out to count the damage. A few roof "
        "tiles lay scattered across the square, the bakery had lost its striped awning, and "
        "the little bridge over the stream was covered in branches. Nobody had been hurt. By "
        "noon the children were collecting the branches into a great pile, the baker was "
        "handing out bread that had survived the night, and the mayor, still in his rain "
        "boots, was promising that the bridge would be cleared before the weekend market.",
    ],
    ("short", "zh"): [
        "早上好，欢迎光临。",
        "请在提示音后留言。",
        "图书馆今晚九点关门。",
    ],
    ("medium", "zh"): [
        "开往海边的列车从四号站台出发。携带自行车的乘客请从最后一节车厢上车，列车停靠期间请不要堵住车门。",
        "今年春天我们的花园变化很大。那棵老苹果树终于倒了，于是我们在原来树荫的地方种了番茄、豆角和一排向日葵。",
    ],
    ("long", "zh"): [
        "暴风雨终于过去了，村里的人都出来查看损失。广场上散落着几片屋瓦，面包店的条纹遮阳篷被吹走了，"
        "小溪上的石桥也被树枝盖满。幸运的是，没有人受伤。到了中午，孩子们把树枝堆成一大堆，"
        "面包师把昨晚幸存下来的面包分给大家，镇长还穿着雨靴，向大家保证周末集市之前一定把桥清理干净。",
    ],
}


@dataclass(frozen=True)
class WorkItem:
    """One text of the workload.

    Attributes:
        text: what is spoken.
        category: e.g. `short-en`, or `file` for texts read from a workload file.
    """

    text: str
    category: str


def builtin_workload(
    lengths: tuple[str, ...] = LENGTHS, languages: tuple[str, ...] = LANGUAGES
) -> list[WorkItem]:
    """The built-in texts of the given lengths and languages, interleaved by category.

    Raises:
        ValueError: an unknown length or language, or nothing selected.
    """
    for name, value, allowed in (("length", lengths, LENGTHS), ("language", languages, LANGUAGES)):
        unknown = set(value) - set(allowed)
        if unknown or not value:
            raise ValueError(f"{name}s must be a non-empty subset of {allowed}, got {value}")
    groups = [
        [WorkItem(t, f"{length}-{lang}") for t in BUILTIN_TEXTS[(length, lang)]]
        for length in lengths
        for lang in languages
    ]
    # Round-robin over categories so any prefix of the workload mixes lengths and languages.
    items: list[WorkItem] = []
    for i in range(max(len(g) for g in groups)):
        items.extend(g[i] for g in groups if i < len(g))
    return items


def read_workload(path: Path) -> list[WorkItem]:
    """Texts from a `.txt` (one per line) or `.jsonl` file (`{"text": ...}` per line).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a malformed JSON line, or no text in the file.
    """
    if not path.is_file():
        raise FileNotFoundError(f"workload file not found: {path}")
    items = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                record = json.loads(line)
                items.append(WorkItem(str(record["text"]), str(record.get("category", "file"))))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f'{path}:{number}: expected {{"text": ...}}: {exc}') from None
        else:
            items.append(WorkItem(line.strip(), "file"))
    if not items:
        raise ValueError(f"workload file {path} has no text")
    return items


@dataclass(frozen=True)
class RequestShape:
    """What every request asks for, apart from its text and seed.

    Attributes:
        api: "fish" (`/v1/tts`) or "openai" (`/v1/audio/speech`).
        audio_format: "pcm" (s16le mono) or "wav".
        streaming: Fish `streaming` field (the OpenAI route streams anyway).
        chunk_length: Fish segment size in UTF-8 bytes (100..300).
        max_new_tokens: Fish frame budget per segment; None = the server's default.
        ignore_eos: fishserve extension: generate exactly `max_new_tokens` frames per segment.
        reference_audio, reference_text: an inline Fish voice reference (audio file bytes).
        reference_id: a stored voice (Fish `reference_id`, OpenAI `voice`).
        model: OpenAI `model` field.
        seed: seed of request 0 (request i uses seed + i; Fish API only).
        extra_body: fields merged into every body (e.g. sampling settings of a peer server).
    """

    api: Api = "fish"
    audio_format: Literal["pcm", "wav"] = "pcm"
    streaming: bool = True
    chunk_length: int = 200
    max_new_tokens: int | None = None
    ignore_eos: bool = False
    reference_audio: bytes | None = None
    reference_text: str = ""
    reference_id: str | None = None
    model: str = "fish-speech-1.5"
    seed: int = 42
    extra_body: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str:
        """URL path of the API."""
        return API_PATHS[self.api]


def request_body(shape: RequestShape, item: WorkItem, index: int) -> dict[str, Any]:
    """The JSON body of request `index` (0-based) speaking `item`."""
    if shape.api == "openai":
        body: dict[str, Any] = {
            "model": shape.model,
            "input": item.text,
            "voice": shape.reference_id or "default",
            "response_format": shape.audio_format,
        }
    else:
        body = {
            "text": item.text,
            "format": shape.audio_format,
            "streaming": shape.streaming,
            "chunk_length": shape.chunk_length,
            "seed": (shape.seed + index) % 2**32,
        }
        if shape.max_new_tokens is not None:
            body["max_new_tokens"] = shape.max_new_tokens
        if shape.ignore_eos:
            body["ignore_eos"] = True
        if shape.reference_id is not None:
            body["reference_id"] = shape.reference_id
        if shape.reference_audio is not None:
            audio = base64.b64encode(shape.reference_audio).decode()
            body["references"] = [{"audio": audio, "text": shape.reference_text}]
    body.update(shape.extra_body)
    return body
