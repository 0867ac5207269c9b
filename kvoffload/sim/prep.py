"""Tokenizing and hashing a chat prompt for the simulated engine, in a worker process of its own.

The engine's event loop must wake within a fraction of a millisecond of each modelled step end.
Tokenizing a long prompt is pure-Python work; on a thread it would hold the GIL in 1 ms slices
against the event loop and the step timer, so it runs in one worker process instead (like vLLM's
own frontend process does its tokenizing apart from the engine core). The worker memoises token ids
per message: multi-turn prompts re-send the same history. The engine process owns the worker's
lifetime: the worker ignores SIGINT (a terminal signals the whole process group, and a worker dying
first would fail the request it holds while the engine shuts down cleanly), exits by itself within a
second of the engine process going away, and on SIGTERM (systemd signals every process of the unit)
exits TERM_GRACE_S later whatever it is doing: a helper that outlived its engine and ignored SIGTERM
held the next stop of the same unit for systemd's whole TimeoutStopSec (the replica unit also says
KillMode=mixed). This module knows nothing of HTTP or of scheduling.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from kvoffload.sim.hashing import chain_hashes
from kvoffload.tokenizer import GENERATION_PROMPT, Tokenizer, load_tokenizer, render_message

_MESSAGE_CACHE_ENTRIES = 65536
PREP_NICENESS = 10
PARENT_POLL_S = 1.0
# After SIGTERM the worker exits this much later: time to finish the prompt it holds (milliseconds) while
# the engine, signalled at the same moment, winds down in its own SHUTDOWN_GRACE_S.
TERM_GRACE_S = 2.0


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


# The worker process's state, set once by its initializer.
_worker: tuple[ChatTokenizer, _Setup] | None = None


def _exit_with_parent(parent: int) -> None:
    """Daemon thread of the worker: exit once the engine process is gone (re-parented worker)."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


def _exit_soon(_signum: int, _frame: object) -> None:
    """SIGTERM in the worker: exit TERM_GRACE_S from now (a daemon timer), without waiting for anything."""
    timer = threading.Timer(TERM_GRACE_S, os._exit, (0,))
    timer.daemon = True
    timer.start()


def _init_worker(setup: _Setup) -> None:
    global _worker
    signal.signal(signal.SIGTERM, _exit_soon)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    # Below the engine's priority: when the cores are busy, a due step end must win over tokenizing
    # (which only delays the next request's start, and that delay is inside its modelled TTFT).
    os.nice(PREP_NICENESS)
    _worker = (ChatTokenizer(load_tokenizer(setup.model)), setup)


def prepare(
    tokenizer: ChatTokenizer, setup: _Setup, messages: list[Mapping[str, Any]], chunk_size: int
) -> Prepared:
    """Token count, block hashes and (with a connector, `chunk_size` > 0) chunk keys of a chat."""
    ids = tokenizer.encode_chat(messages)
    blocks = chain_hashes(ids, setup.block_size, setup.seed)
    chunks = chain_hashes(ids, chunk_size, b"lmcache:" + setup.seed) if chunk_size else []
    return Prepared(len(ids), blocks, chunks)


def _prepare_in_worker(messages: list[Mapping[str, Any]], chunk_size: int) -> Prepared:
    assert _worker is not None, "worker initializer did not run"
    return prepare(_worker[0], _worker[1], messages, chunk_size)


def _tokenize_in_worker(query: str | list[Mapping[str, Any]], add_generation_prompt: bool) -> list[int]:
    """Token ids of a prompt string, or of a chat as the engine tokenizes it (for `POST /tokenize`)."""
    assert _worker is not None, "worker initializer did not run"
    tokenizer = _worker[0]
    if isinstance(query, str):
        return tokenizer.tokenizer.encode(query)
    return tokenizer.encode_chat(query, add_generation_prompt)


class PrepWorker:
    """One worker process that tokenizes and hashes prompts for one engine, in arrival order."""

    def __init__(self, model: str, block_size: int, seed: bytes) -> None:
        # spawn, not fork: the parent has threads (the step timer), and a forked child could inherit
        # a lock held by one of them.
        self._pool = ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(_Setup(model, block_size, seed),),
        )

    async def start(self) -> None:
        """Start the process and load the tokenizer now, so the first request does not pay for it."""
        await self.prepare([{"role": "user", "content": "warm-up"}], 0)

    async def prepare(self, messages: list[Mapping[str, Any]], chunk_size: int) -> Prepared:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, _prepare_in_worker, messages, chunk_size)

    async def tokenize(
        self, query: str | list[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, _tokenize_in_worker, query, add_generation_prompt)

    async def pid(self) -> int:
        """The worker process's id (asked of the worker itself)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, os.getpid)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
