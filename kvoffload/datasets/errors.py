"""Error helper for loaders: every message names the file and the line or record."""

from __future__ import annotations

from pathlib import Path

from kvoffload.errors import UserError


def data_error(path: Path, where: str, problem: str, fix: str = "") -> UserError:
    """A `UserError` like `data.jsonl: line 12: 'messages' must be a list (fix: ...)`."""
    text = f"{path}: {where}: {problem}"
    if fix:
        text += f" ({fix})"
    return UserError(text)
