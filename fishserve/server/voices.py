"""Stored voices on disk: one folder per voice id, in Fish Speech's `references/<id>/` layout.

A voice folder holds the audio file as uploaded (`reference.<ext>`) and its transcript in a
sibling `.lab` file, so folders made for the reference server load unchanged (any audio file
with a `.lab` beside it). Ids are validated so that no id can name a path outside the root.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
# Letters, digits, '_', '-', '.', starting with a letter or digit: no '/', no '..'.
_VOICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".webm")


class VoiceNotFoundError(KeyError):
    """No stored voice has this id (HTTP 404)."""

    def __str__(self) -> str:
        return str(self.args[0])


class VoiceDataError(RuntimeError):
    """A stored voice's files cannot be used (put there by hand, not by `add`): a server-side
    problem (HTTP 500 with this message; logged where raised)."""


class VoiceExistsError(ValueError):
    """A voice with this id is already stored (HTTP 409)."""


class InvalidVoiceIdError(ValueError):
    """The id is not a safe folder name (HTTP 400)."""


def validate_voice_id(voice_id: str) -> str:
    """Return `voice_id` if it is 1-64 chars of [A-Za-z0-9_.-] starting alphanumeric.

    Raises:
        InvalidVoiceIdError: anything else (path separators, '..', empty, too long).
    """
    if not _VOICE_ID.fullmatch(voice_id) or ".." in voice_id:
        raise InvalidVoiceIdError(
            f"invalid voice id {voice_id!r}: use 1-64 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit, without '..'"
        )
    return voice_id


@dataclass(frozen=True)
class StoredVoice:
    """A voice on disk: its audio bytes and transcript."""

    voice_id: str
    audio: bytes
    text: str


class VoiceStore:
    """Voices under `root` (created if missing); safe for concurrent use."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def list(self) -> list[str]:
        """Sorted ids of the stored voices (folders holding an audio file); a voice deleted
        meanwhile may or may not be listed, never an error."""
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and _VOICE_ID.fullmatch(p.name) and self._audio_file(p) is not None
        )

    def get(self, voice_id: str) -> StoredVoice:
        """Read a voice (under the lock, so a concurrent `delete` cannot remove it mid-read).

        Raises:
            InvalidVoiceIdError: unsafe id.
            VoiceNotFoundError: no such voice (also when its files vanish while reading).
            VoiceDataError: its transcript file is not UTF-8 (a server-side problem).
        """
        folder = self.root / validate_voice_id(voice_id)
        with self._lock:
            try:
                audio = self._audio_file(folder)
                if audio is not None:
                    lab = audio.with_suffix(".lab")
                    text = lab.read_text(encoding="utf-8").strip() if lab.is_file() else ""
                    return StoredVoice(voice_id, audio.read_bytes(), text)
            except FileNotFoundError:
                pass
            except UnicodeDecodeError as exc:  # a file put there by hand, not by `add`
                message = (
                    f"stored voice {voice_id!r}: its transcript {lab.name} is not UTF-8 text "
                    f"(byte {exc.start}); fix or delete the file on the server"
                )
                log.error("%s", message)
                raise VoiceDataError(message) from None
        raise self._not_found(voice_id)

    def check_free(self, voice_id: str) -> None:
        """Refuse a taken id before its audio is encoded (`add` checks again, under the lock).

        Raises:
            InvalidVoiceIdError: unsafe id.
            VoiceExistsError: the id is taken.
        """
        if (self.root / validate_voice_id(voice_id)).exists():
            raise VoiceExistsError(f"voice {voice_id!r} already exists")

    def add(self, voice_id: str, audio: bytes, text: str, suffix: str = ".wav") -> None:
        """Store a voice (the caller has validated the audio).

        Raises:
            InvalidVoiceIdError: unsafe id.
            VoiceExistsError: the id is taken.
        """
        folder = self.root / validate_voice_id(voice_id)
        suffix = suffix.lower() if suffix.lower() in AUDIO_SUFFIXES else ".wav"
        with self._lock:
            if folder.exists():
                raise VoiceExistsError(f"voice {voice_id!r} already exists")
            tmp = self.root / f".tmp-{voice_id}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            (tmp / f"reference{suffix}").write_bytes(audio)
            (tmp / "reference.lab").write_text(text, encoding="utf-8")
            tmp.rename(folder)  # atomic: a half-written voice is never listed

    def delete(self, voice_id: str) -> None:
        """Remove a voice.

        Raises:
            InvalidVoiceIdError, VoiceNotFoundError.
        """
        folder = self.root / validate_voice_id(voice_id)
        with self._lock:
            if not folder.is_dir():
                raise self._not_found(voice_id)
            shutil.rmtree(folder)

    @staticmethod
    def _not_found(voice_id: str) -> VoiceNotFoundError:
        # No count of the stored voices: listing them scans every folder (0.15 s at 3,000
        # voices), which a stream of 404s would repeat on the thread pool requests need.
        return VoiceNotFoundError(
            f"voice {voice_id!r} not found (GET /v1/references/list names the stored ones)"
        )

    @staticmethod
    def _audio_file(folder: Path) -> Path | None:
        """The folder's audio file; None if it has none or is not (or no longer) a folder."""
        try:
            files = sorted(p for p in folder.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return files[0] if files else None
