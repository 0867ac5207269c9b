"""Small generic-JSONL datasets the tests build: conversations whose every call extends the previous."""

from __future__ import annotations

import json
from typing import Any


def generic_lines(sessions: int = 2, calls: int = 10, output_length: int = 8) -> list[str]:
    """JSONL lines of `sessions` conversations of `calls` calls each (session ids s0, s1, ...)."""
    lines = []
    for s in range(sessions):
        messages: list[dict[str, Any]] = [{"role": "system", "content": f"session {s}"}]
        for c in range(calls):
            messages = [*messages, {"role": "user", "content": f"question {c}"}]
            row = {"session_id": f"s{s}", "messages": messages, "output_length": output_length}
            lines.append(json.dumps(row))
            messages = [*messages, {"role": "assistant", "content": f"answer {c}"}]
    return lines
