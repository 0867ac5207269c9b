"""kvoffload/tokenizer.py: where a model's tokenizer is found, the server's /tokenize, chat counts."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kvoffload.tokenizer import (
    ChatCounter,
    FallbackTokenizer,
    HFTokenizer,
    ServerTokenizer,
    describe,
    find_tokenizer_file,
    hf_hub_cache,
    load_tokenizer,
    open_tokenizer,
    render_chat,
)


def _word_tokenizer(path: Path) -> Path:
    """A word-level tokenizer.json: ids that no fallback would give ("hello" 7, "world" 8)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 7, "world": 8}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def _hub_snapshot(cache: Path, repo: str, rev: str, main: str | None) -> Path:
    folder = cache / ("models--" + repo.replace("/", "--"))
    path = _word_tokenizer(folder / "snapshots" / rev / "tokenizer.json")
    if main is not None:
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text(main + "\n")
    return path


def test_a_staged_model_folder_counts_with_its_own_tokenizer(tmp_path: Path) -> None:
    path = _word_tokenizer(tmp_path / "model" / "tokenizer.json")
    tok = load_tokenizer(str(tmp_path / "model"))
    assert isinstance(tok, HFTokenizer) and tok.name == str(path)
    assert tok.encode("hello world nope") == [7, 8, 0]
    assert describe(tok) == str(path)


def test_a_hub_id_is_found_in_the_hf_cache_at_the_snapshot_refs_main_names(tmp_path: Path) -> None:
    old = _hub_snapshot(tmp_path, "Qwen/Qwen3-8B", "0ld", None)
    new = _hub_snapshot(tmp_path, "Qwen/Qwen3-8B", "n3w", "n3w")
    assert old != new
    assert find_tokenizer_file("Qwen/Qwen3-8B", tmp_path) == new
    assert load_tokenizer("Qwen/Qwen3-8B", tmp_path).encode("world") == [8]
    # Another repository, and a hub id with no snapshot at all, are not taken for it.
    assert find_tokenizer_file("Qwen/Qwen3-32B", tmp_path) is None
    assert isinstance(load_tokenizer("Qwen/Qwen3-32B", tmp_path), FallbackTokenizer)


def test_without_refs_main_the_newest_snapshot_wins(tmp_path: Path) -> None:
    import os

    first = _hub_snapshot(tmp_path, "org/m", "a", None)
    second = _hub_snapshot(tmp_path, "org/m", "b", None)
    os.utime(first, (1, 1))
    assert find_tokenizer_file("org/m", tmp_path) == second
    os.utime(second, (0, 0))
    assert find_tokenizer_file("org/m", tmp_path) == first


def test_hf_hub_cache_follows_huggingface_hubs_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/home/u")
    assert hf_hub_cache() == Path("/home/u/.cache/huggingface/hub")
    monkeypatch.setenv("XDG_CACHE_HOME", "/x")
    assert hf_hub_cache() == Path("/x/huggingface/hub")
    monkeypatch.setenv("HF_HOME", "/h")
    assert hf_hub_cache() == Path("/h/hub")
    monkeypatch.setenv("HF_HUB_CACHE", "/c")
    assert hf_hub_cache() == Path("/c")


def test_no_tokenizer_anywhere_gives_the_fallback_and_says_so(tmp_path: Path) -> None:
    for model in (None, "", "tiny-llama", str(tmp_path), "Qwen/Qwen3-8B"):
        tok = load_tokenizer(model, tmp_path)
        assert isinstance(tok, FallbackTokenizer)
    assert "approximate" in describe(FallbackTokenizer())


class _Tokenize(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        if self.path not in ("/tokenize", "/broken/tokenize"):
            self.send_error(404)
            return
        tokens = [len(w) for w in body["prompt"].split()]
        answer = json.dumps(
            {"count": len(tokens), "max_model_len": 8192, "tokens": tokens, "token_strs": None}
            if self.path == "/tokenize"
            else {"count": len(tokens)}
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(answer.encode())

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Tokenize.seen = []
    httpd = HTTPServer(("127.0.0.1", 0), _Tokenize)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def test_server_tokenizer_asks_tokenize_without_special_tokens(server: str) -> None:
    tok = open_tokenizer(server + "/v1", "qwen")
    assert isinstance(tok, ServerTokenizer) and tok.name == server + "/tokenize"
    assert tok.encode("abc de f") == [3, 2, 1]
    assert tok.count("abcd") == 1
    assert _Tokenize.seen[0] == {"prompt": "abc de f", "add_special_tokens": False, "model": "qwen"}
    ServerTokenizer(server, None).encode("x")
    assert "model" not in _Tokenize.seen[-1]
    assert describe(tok) == f"the server's own ({server}/tokenize)"


def test_server_tokenizer_raises_on_an_http_error_or_an_answer_without_token_ids(server: str) -> None:
    with pytest.raises(OSError, match="404"):
        ServerTokenizer(server + "/elsewhere", None).encode("x")
    with pytest.raises(ValueError, match="no list of token ids"):
        ServerTokenizer(server + "/broken", None).encode("x")


def test_chat_counter_matches_a_whole_chat_count_with_the_fallback() -> None:
    messages = [
        {"role": "system", "content": "You are a careful agent." * 20},
        {"role": "user", "content": "Book flight HAT123, please!"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": "book"}}]},
    ]
    counter = ChatCounter(FallbackTokenizer())
    for k in range(1, len(messages) + 1):
        assert counter.count(messages[:k]) == FallbackTokenizer().count(render_chat(messages[:k]))
