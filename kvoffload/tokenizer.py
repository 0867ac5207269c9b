"""Token counting shared by the replay client (depth filter) and the simulator (prompt length, KV blocks).

Three implementations behind one small protocol:
- `HFTokenizer`: the model's own tokenizer, from `tokenizer.json` (the Hugging Face fast-tokenizer
  file), loaded with the `tokenizers` library. `find_tokenizer_file` looks in a model folder (a staged
  model), or for a hub id such as `Qwen/Qwen3-8B` in the local Hugging Face cache. No network is used.
- `ServerTokenizer`: asks a running engine's `POST /tokenize` (vLLM's route, and the simulator's), so
  the count is the server's own; the one network path, used only when a caller passes a server URL.
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
import os
import re
import urllib.request
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

_PIECE = re.compile(r"[A-Za-z0-9_]+|\s+|[^A-Za-z0-9_\s]")
_WORD_CHUNK = 4
FALLBACK_VOCAB = 131072
GENERATION_PROMPT = "<|assistant|>\n"


class Tokenizer(Protocol):
    """What callers need from a tokenizer."""

    name: str
    """Which tokenizer counts, for people: a file path, a server URL or the fallback's name."""

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
    """A model's own fast tokenizer, read from a `tokenizer.json` file."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as _HF  # imported lazily: only this path needs it

        self._tok = _HF.from_file(str(path))
        self.name = str(path)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        return ids

    def count(self, text: str) -> int:
        return len(self.encode(text))


class ServerTokenizer:
    """A running engine's `POST /tokenize`: `{"model", "prompt", "add_special_tokens"}` in,
    `{"count", "max_model_len", "tokens", "token_strs"}` out (the shape vLLM 0.32 answers)."""

    def __init__(self, base_url: str, model: str | None, timeout_s: float = 30.0) -> None:
        root = base_url.rstrip("/")
        self.url = (root[: -len("/v1")] if root.endswith("/v1") else root) + "/tokenize"
        self.model = model
        self.timeout_s = timeout_s
        self.name = self.url

    def encode(self, text: str) -> list[int]:
        question: dict[str, Any] = {"prompt": text, "add_special_tokens": False}
        if self.model is not None:  # optional in vLLM: the served model then
            question["model"] = self.model
        body = json.dumps(question).encode()
        request = urllib.request.Request(
            self.url, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            answer = json.loads(response.read())
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise ValueError(f"{self.url}: the answer has no list of token ids: {str(answer)[:200]}")
        return tokens

    def count(self, text: str) -> int:
        return len(self.encode(text))


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub resolves it (HF_HUB_CACHE, HF_HOME/hub,
    XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache / "huggingface" / "hub"


def _cached_tokenizer(model: str, cache: Path) -> Path | None:
    """`tokenizer.json` of hub id `model` in the hub cache: the snapshot `refs/main` names, else the
    newest snapshot that has one."""
    repo = cache / ("models--" + model.replace("/", "--"))
    main = repo / "refs" / "main"
    if main.is_file():
        candidate = repo / "snapshots" / main.read_text().strip() / "tokenizer.json"
        if candidate.is_file():
            return candidate
    found = [p for p in (repo / "snapshots").glob("*/tokenizer.json") if p.is_file()]
    return max(found, key=lambda p: (p.stat().st_mtime, str(p))) if found else None


def find_tokenizer_file(model: str | None, cache: Path | None = None) -> Path | None:
    """Where `model`'s tokenizer.json is on this machine: in the folder `model` names (a staged model),
    or, for a hub id (`org/name`), in the Hugging Face cache (`cache`, default `hf_hub_cache()`)."""
    if not model:
        return None
    folder = Path(model).expanduser()
    if (folder / "tokenizer.json").is_file():
        return folder / "tokenizer.json"
    if model.count("/") == 1 and not model.startswith(("/", ".", "~")):
        return _cached_tokenizer(model, cache if cache is not None else hf_hub_cache())
    return None


def load_tokenizer(model: str | None, cache: Path | None = None) -> Tokenizer:
    """The model's own tokenizer when `find_tokenizer_file` finds one, else the fallback."""
    path = find_tokenizer_file(model, cache)
    return HFTokenizer(path) if path is not None else FallbackTokenizer()


def open_tokenizer(spec: str | None, model: str | None = None) -> Tokenizer:
    """A tokenizer from a user's `--tokenizer`: an http(s) URL asks that server's /tokenize (for served
    model `model`), anything else goes through `load_tokenizer` (a folder, a cached hub id)."""
    if spec and spec.startswith(("http://", "https://")):
        return ServerTokenizer(spec, model)
    return load_tokenizer(spec)


def describe(tokenizer: Tokenizer) -> str:
    """One line for people saying which tokenizer counted."""
    if isinstance(tokenizer, FallbackTokenizer):
        return f"{tokenizer.name} (approximate, about 4 characters a token)"
    if isinstance(tokenizer, ServerTokenizer):
        return f"the server's own ({tokenizer.name})"
    return tokenizer.name


class ChatCounter:
    """Token counts of chats as `render_chat` renders them, memoised per message.

    Counting message by message is what the simulator's engine does (kvoffload/sim/prep.py), and each
    rendered message starts with a special-looking header, so the sum matches a whole-string count with
    the fallback and lands within a few tokens of it with a real BPE. A dataset's calls repeat their
    history, so the memo makes a whole dataset cost about one pass over its distinct messages.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._memo: dict[str, int] = {}

    def _count(self, text: str) -> int:
        n = self._memo.get(text)
        if n is None:
            n = self._memo[text] = self.tokenizer.count(text)
        return n

    def count(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return sum(self._count(render_message(m)) for m in messages) + self._count(GENERATION_PROMPT)


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
        text += GENERATION_PROMPT
    return text
