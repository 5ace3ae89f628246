"""Exceptions that mean "bad input", reported to users as one line (CLI) or a 4xx (HTTP)."""

from __future__ import annotations

# ValueError covers CheckpointError, AudioDecodeError, PromptTooLongError and pydantic-free
# validation in the model layers; OSError covers missing, unreadable or unwritable files.
USER_ERRORS: tuple[type[Exception], ...] = (ValueError, OSError)


class GenerationError(RuntimeError):
    """The engine failed a request it had accepted (e.g. a later text segment's prompt no
    longer fits the model's context); the CLI reports it as one line with exit code 1."""
