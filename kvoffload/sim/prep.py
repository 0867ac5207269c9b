"""Tokenizing and hashing a chat prompt for the simulated engine, in a worker process of its own.

The engine's event loop must wake within a fraction of a millisecond of each modelled step end.
Tokenizing a long prompt is pure-Python work; on a thread it would hold the GIL in 1 ms slices
against the event loop and the step timer, so it runs in one worker process instead (like vLLM's
own frontend process does its tokenizing apart from the engine core). The worker memoises token ids
per message: multi-turn prompts re-send the same history.

The worker is a plain child process (`python -c ... worker_main()`) that reads requests on its stdin
and answers on its stdout, one at a time, each a length-prefixed pickle. Not multiprocessing: its
spawn context also starts a resource-tracker process that ignores SIGTERM and leaves only once the
engine's process has exited. systemd in the virtual lab's hosts is not told when a unit's last
process ends (it cannot use the unit's cgroup there: "Failed to kill control group ... Input/output
error"), so a helper that outlived the engine's main process by milliseconds held the replica's stop
for all of TimeoutStopSec: the 60 s teardowns of issue 12, shown by the journal the teardown keeps.
Now the engine closes the worker's stdin and waits for it before it exits, and nothing of the unit
outlives its main process.

The engine process owns the worker's lifetime: the worker ignores SIGINT (a terminal signals the whole
process group, and a worker dying first would fail the request it holds while the engine shuts down
cleanly), exits when its stdin ends (the engine closed it, or is gone), and on SIGTERM of its own
exits TERM_GRACE_S later whatever it is doing. This module knows nothing of HTTP or of scheduling.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any

from kvoffload.sim.hashing import chain_hashes
from kvoffload.tokenizer import GENERATION_PROMPT, Tokenizer, load_tokenizer, render_message

_MESSAGE_CACHE_ENTRIES = 65536
PREP_NICENESS = 10
# After SIGTERM the worker exits this much later: time to finish the prompt it holds (milliseconds). The
# engine also waits this long for the worker at shutdown before it kills it.
TERM_GRACE_S = 2.0
_LENGTH = struct.Struct("!I")


@dataclass(frozen=True)
class Prepared:
    """What the engine needs of a prompt: its length and the keys of its blocks and chunks."""

    num_tokens: int
    block_hashes: list[bytes]
    chunk_keys: list[bytes]


class ChatTokenizer:
    """Token ids of a chat, memoised per message."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: OrderedDict[str, list[int]] = OrderedDict()

    def _ids(self, text: str) -> list[int]:
        ids = self._cache.get(text)
        if ids is None:
            ids = self.tokenizer.encode(text)
            self._cache[text] = ids
            if len(self._cache) > _MESSAGE_CACHE_ENTRIES:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(text)
        return ids

    def encode_chat(self, messages: list[Mapping[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        # render_chat is the concatenation of render_message parts plus the generation prompt; each
        # part starts with "<|" and ends with a newline, so tokenizing part by part gives the same
        # pieces as tokenizing the whole string with the fallback tokenizer.
        ids: list[int] = []
        for m in messages:
            ids.extend(self._ids(render_message(m)))
        if add_generation_prompt:
            ids.extend(self._ids(GENERATION_PROMPT))
        return ids


@dataclass(frozen=True)
class _Setup:
    model: str
    block_size: int
    seed: bytes


class WorkerDied(RuntimeError):
    """The tokenizer worker process is gone (it crashed or was killed); the engine cannot go on."""


def prepare(
    tokenizer: ChatTokenizer, setup: _Setup, messages: list[Mapping[str, Any]], chunk_size: int
) -> Prepared:
    """Token count, block hashes and (with a connector, `chunk_size` > 0) chunk keys of a chat."""
    ids = tokenizer.encode_chat(messages)
    blocks = chain_hashes(ids, setup.block_size, setup.seed)
    chunks = chain_hashes(ids, chunk_size, b"lmcache:" + setup.seed) if chunk_size else []
    return Prepared(len(ids), blocks, chunks)


def tokenize(
    tokenizer: ChatTokenizer, query: str | list[Mapping[str, Any]], add_generation_prompt: bool
) -> list[int]:
    """Token ids of a prompt string, or of a chat as the engine tokenizes it (for `POST /tokenize`)."""
    if isinstance(query, str):
        return tokenizer.tokenizer.encode(query)
    return tokenizer.encode_chat(query, add_generation_prompt)


def _send(stream: IO[bytes], obj: object) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    """The next message; EOFError when the other end has closed the pipe."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError("pipe closed")
    (size,) = _LENGTH.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("pipe closed mid-message")
    return pickle.loads(data)


def _exit_soon(_signum: int, _frame: object) -> None:
    """SIGTERM in the worker: exit TERM_GRACE_S from now (a daemon timer), without waiting for anything."""
    timer = threading.Timer(TERM_GRACE_S, os._exit, (0,))
    timer.daemon = True
    timer.start()


def worker_main() -> None:
    """The worker process: its setup, then requests on stdin and answers on stdout until stdin ends."""
    signal.signal(signal.SIGTERM, _exit_soon)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Below the engine's priority: when the cores are busy, a due step end must win over tokenizing
    # (which only delays the next request's start, and that delay is inside its modelled TTFT).
    os.nice(PREP_NICENESS)
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # the answer pipe carries answers only
    setup: _Setup = _receive(requests)
    tokenizer = ChatTokenizer(load_tokenizer(setup.model))
    while True:
        try:
            kind, args = _receive(requests)
        except EOFError:
            return
        try:
            if kind == "prepare":
                answer: tuple[str, Any] = ("ok", prepare(tokenizer, setup, *args))
            else:
                answer = ("ok", tokenize(tokenizer, *args))
        except Exception as exc:
            answer = ("error", f"{type(exc).__name__}: {exc}")
        _send(answers, answer)


class PrepWorker:
    """One worker process that tokenizes and hashes prompts for one engine, in arrival order."""

    def __init__(self, model: str, block_size: int, seed: bytes) -> None:
        self._setup = _Setup(model, block_size, seed)
        self._proc: subprocess.Popen[bytes] | None = None
        # One thread does the pipe's blocking I/O: requests go out and answers come back in order.
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prep-io")

    async def start(self) -> None:
        """Start the process and load the tokenizer now, so the first request does not pay for it."""
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from kvoffload.sim.prep import worker_main; worker_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self._proc.stdin is not None
        _send(self._proc.stdin, self._setup)
        await self.prepare([{"role": "user", "content": "warm-up"}], 0)

    def _call(self, kind: str, args: tuple[Any, ...]) -> Any:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise WorkerDied("the tokenizer worker was not started")
        try:
            _send(proc.stdin, (kind, args))
            status, value = _receive(proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            raise WorkerDied(f"tokenizer worker {proc.pid} is gone (exit status {proc.poll()})") from exc
        if status != "ok":
            raise RuntimeError(f"tokenizer worker: {value}")
        return value

    async def prepare(self, messages: list[Mapping[str, Any]], chunk_size: int) -> Prepared:
        loop = asyncio.get_running_loop()
        result: Prepared = await loop.run_in_executor(self._io, self._call, "prepare", (messages, chunk_size))
        return result

    async def tokenize(
        self, query: str | list[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        loop = asyncio.get_running_loop()
        ids: list[int] = await loop.run_in_executor(
            self._io, self._call, "tokenize", (query, add_generation_prompt)
        )
        return ids

    @property
    def pid(self) -> int | None:
        """The worker process's id (None before `start`)."""
        return self._proc.pid if self._proc is not None else None

    def close(self) -> None:
        """End the worker (its stdin closes; killed after TERM_GRACE_S) and wait for it to be gone."""
        proc = self._proc
        if proc is not None:
            with contextlib.suppress(OSError):
                if proc.stdin is not None:
                    proc.stdin.close()
            try:
                proc.wait(timeout=TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._io.shutdown(wait=True, cancel_futures=True)
