"""Token counting shared by the replay client (depth filter) and the simulator (prompt length, KV blocks).

Two implementations behind one small protocol:
- `HFTokenizer`: the model's own tokenizer, from a local folder holding `tokenizer.json` (the Hugging
  Face fast-tokenizer file), loaded with the `tokenizers` library. No network is ever used.
- `FallbackTokenizer`: a deterministic stand-in for when the model has no local tokenizer (a hub id on
  an offline controller, the simulator). It splits text into words, punctuation and whitespace runs and
  cuts long words into 4-character pieces, which lands near real BPE counts for English and code
  (about 4 characters a token). Ids come from CRC-32, so every process (two simulated engines sharing
  one cache server) gives the same ids for the same text.

Chat messages become one string with `render_chat`, a fixed template close to common chat templates;
counts are therefore approximate for the HF path (the real template is not applied), which is what the
depth filter needs: a bound, not an exact figure. This module does no IO except reading tokenizer.json.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

_PIECE = re.compile(r"[A-Za-z0-9_]+|\s+|[^A-Za-z0-9_\s]")
_WORD_CHUNK = 4
FALLBACK_VOCAB = 131072


class Tokenizer(Protocol):
    """What callers need from a tokenizer."""

    name: str

    def encode(self, text: str) -> list[int]: ...

    def count(self, text: str) -> int: ...


class FallbackTokenizer:
    """Deterministic approximate tokenizer (see module docstring)."""

    name = "kvoffload-fallback"

    @staticmethod
    def pieces(text: str) -> list[str]:
        out: list[str] = []
        for piece in _PIECE.findall(text):
            if len(piece) <= _WORD_CHUNK or piece[0].isspace():
                out.append(piece)
            else:
                out.extend(piece[i : i + _WORD_CHUNK] for i in range(0, len(piece), _WORD_CHUNK))
        return out

    def encode(self, text: str) -> list[int]:
        return [zlib.crc32(p.encode()) % FALLBACK_VOCAB for p in self.pieces(text)]

    def count(self, text: str) -> int:
        return len(self.pieces(text))


class HFTokenizer:
    """A model's own fast tokenizer, read from `<folder>/tokenizer.json`."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as _HF  # imported lazily: only this path needs it

        self._tok = _HF.from_file(str(path))
        self.name = str(path.parent)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        return ids

    def count(self, text: str) -> int:
        return len(self.encode(text))


def load_tokenizer(model: str | None) -> Tokenizer:
    """The model's own tokenizer when `model` is a local folder with tokenizer.json, else the fallback."""
    if model:
        candidate = Path(model) / "tokenizer.json"
        if candidate.is_file():
            return HFTokenizer(candidate)
    return FallbackTokenizer()


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                parts.append(str(part.get("text", "")))
            else:
                parts.append(str(part))
        return "".join(parts)
    return str(content)


def render_message(message: Mapping[str, Any]) -> str:
    """One message as template text: role header, content, tool calls as JSON."""
    text = f"<|{message.get('role', 'user')}|>\n{_content_text(message.get('content'))}"
    tool_calls = message.get("tool_calls")
    if tool_calls:
        text += "\n" + json.dumps(tool_calls, sort_keys=True, ensure_ascii=False)
    return text + "<|end|>\n"


def render_chat(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """The whole conversation as the string a chat template would produce (see module docstring).

    Rendering is prefix-stable: the text of messages[:k] is a prefix of the text of messages[:k+1], so
    teacher-forced multi-turn requests share a token prefix exactly like they do in a real engine.
    """
    text = "".join(render_message(m) for m in messages)
    if add_generation_prompt:
        text += "<|assistant|>\n"
    return text
