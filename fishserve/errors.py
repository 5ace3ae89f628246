"""Exceptions that mean "bad input", reported to users as one line (CLI) or a 4xx (HTTP)."""

from __future__ import annotations

# ValueError covers CheckpointError, AudioDecodeError, PromptTooLongError and pydantic-free
# validation in the model layers; OSError covers missing, unreadable or unwritable files.
USER_ERRORS: tuple[type[Exception], ...] = (ValueError, OSError)
