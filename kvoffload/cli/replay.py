"""`kvoffload-lab replay`: replay a dataset against a server and write requests.jsonl + sessions.json."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from kvoffload import aio
from kvoffload.errors import UserError

log = logging.getLogger("kvoffload.replay")


def _osl(value: str) -> str:
    if value != "recorded" and not (value.isdigit() and int(value) > 0):
        raise argparse.ArgumentTypeError("must be 'recorded' or a positive integer")
    return value


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return int(value)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="replay recorded multi-turn conversations against an OpenAI-compatible server",
        description=(
            "Closed-loop replay: CONCURRENCY slots each replay one virtual user (a chunk of exactly "
            "NUM_ROUNDS consecutive recorded calls, teacher-forced history) and then take the next, until "
            "the pool, --max-sessions or --duration is exhausted. Writes OUTPUT/requests.jsonl (one line per "
            "request) and OUTPUT/sessions.json (session counts). Ctrl-C stops cleanly, keeping every "
            "finished record."
        ),
    )
    from kvoffload.datasets import DATASET_CODES

    p.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000 (or .../v1)")
    p.add_argument("--model", required=True, help="served model name; also the default tokenizer path")
    p.add_argument("--dataset-code", required=True, choices=DATASET_CODES, help="dataset loader")
    p.add_argument("--dataset", required=True, type=Path, help="dataset file or folder")
    p.add_argument("--concurrency", required=True, type=_positive, help="number of concurrent users (slots)")
    p.add_argument("--num-rounds", required=True, type=_positive, help="calls per virtual user")
    p.add_argument("--output", required=True, type=Path, help="folder for requests.jsonl and sessions.json")
    p.add_argument("--isl", type=_positive, help="drop users whose deepest context exceeds this many tokens")
    p.add_argument("--osl", type=_osl, default="recorded", help="max_tokens: 'recorded' (default) or an int")
    p.add_argument("--max-sessions", type=_positive, help="replay at most this many virtual users")
    p.add_argument("--duration", type=float, help="stop starting new rounds after this many seconds")
    p.add_argument(
        "--tokenizer", help="local tokenizer folder for --isl (default: --model; fallback if absent)"
    )
    p.add_argument("--min-chunk-rounds", type=int, help="chunk floor (default: 5, sammshen: none)")
    p.add_argument("--warmup", type=int, default=4, help="throwaway requests before timing (default 4)")
    p.add_argument(
        "--request-timeout", type=float, default=64800.0, help="seconds per request (default 64800)"
    )
    p.add_argument("--honor-gaps", action="store_true", help="sleep the recorded pre_gap before each round")
    p.add_argument("--agentic-traces", action="store_true", help="accepted for parity; always on")
    p.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos (engines without it)")
    g = p.add_argument_group("gpt-oss only (resolved by the orchestrator for gpt-oss models)")
    g.add_argument("--enable-agentic-tools", action="store_true", help="declare the tools the history calls")
    g.add_argument("--ask-mode", action="store_true", help="tool_choice auto with declared tools")
    g.add_argument("--sanitize-harmony-tokens", action="store_true", help="strip harmony tokens from history")
    g.add_argument("--agentic-max-attempts", type=_positive, default=1, help="attempts per request")
    p.set_defaults(func=run)


class _Display:
    """Rich live progress on a terminal; a plain log line every 10 s otherwise."""

    def __init__(self, total: int) -> None:
        self.tty = sys.stderr.isatty()
        self.total = total
        self._last_log = 0.0
        self._progress: Any = None
        self._task: Any = None
        if self.tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("replay"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("users  {task.fields[info]}"),
                TimeElapsedColumn(),
                transient=False,
            )
            self._task = self._progress.add_task("replay", total=total, info="")

    def __enter__(self) -> _Display:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, p: Any) -> None:
        median = statistics.median(p.ttfts) if p.ttfts else None
        info = (
            f"active {p.active}  requests {p.requests}  failed {p.failed}  ttft p50 {median * 1000:.0f} ms"
            if median is not None
            else f"active {p.active}  requests {p.requests}"
        )
        if self._progress is not None:
            self._progress.update(self._task, completed=p.users_done, info=info)
        elif time.monotonic() - self._last_log >= 10.0 or p.users_done == self.total:
            self._last_log = time.monotonic()
            log.info("users %d/%d  %s  elapsed %.0f s", p.users_done, self.total, info, p.elapsed_s)


def run(args: argparse.Namespace) -> int:
    from kvoffload.datasets import chunk_floor, load_dataset
    from kvoffload.replay.records import SessionCounts
    from kvoffload.replay.requests import RequestOptions
    from kvoffload.replay.runner import ReplayConfig, ReplayRunner
    from kvoffload.replay.users import select_users
    from kvoffload.tokenizer import load_tokenizer

    sessions = load_dataset(args.dataset_code, args.dataset)
    floor = args.min_chunk_rounds if args.min_chunk_rounds is not None else chunk_floor(args.dataset_code)
    tokenizer = load_tokenizer(args.tokenizer or args.model) if args.isl else None
    pool = select_users(
        sessions,
        args.dataset_code,
        args.num_rounds,
        min_chunk_rounds=floor,
        isl=args.isl,
        tokenizer=tokenizer,
        max_sessions=args.max_sessions,
    )
    if pool.available == 0:
        raise UserError(
            f"--num-rounds {args.num_rounds}: {args.dataset} yields no virtual users "
            f"(chunk floor {floor}; sessions have {min(len(s.calls) for s in sessions)}.."
            f"{max(len(s.calls) for s in sessions)} calls); see `kvoffload-lab datasets inspect`"
        )
    if not pool.users:
        raise UserError(
            f"--isl {args.isl}: every one of {pool.available} virtual users is deeper; raise --isl"
        )
    if tokenizer is not None and tokenizer.name == "kvoffload-fallback":
        log.info(
            "no local tokenizer.json for %s: --isl counts with the approximate fallback tokenizer", args.model
        )
    if args.concurrency > len(pool.users):
        log.warning(
            "--concurrency %d exceeds the %d virtual users available: the extra slots add no load",
            args.concurrency,
            len(pool.users),
        )
    osl = None if args.osl == "recorded" else int(args.osl)
    config = ReplayConfig(
        base_url=args.base_url,
        concurrency=args.concurrency,
        num_rounds=args.num_rounds,
        output=args.output,
        request=RequestOptions(
            model=args.model,
            osl=osl,
            ignore_eos=not args.no_ignore_eos,
            sanitize_harmony_tokens=args.sanitize_harmony_tokens,
            agentic_tools=args.enable_agentic_tools,
            ask_mode=args.ask_mode,
        ),
        warmup=args.warmup,
        request_timeout_s=args.request_timeout,
        duration_s=args.duration,
        honor_gaps=args.honor_gaps,
        max_attempts=args.agentic_max_attempts,
    )
    counts = SessionCounts(
        requested_concurrency=args.concurrency,
        num_rounds=args.num_rounds,
        virtual_users_available=pool.available,
        dropped_by_isl=pool.dropped_by_isl,
    )
    with _Display(len(pool.users)) as display:
        runner = ReplayRunner(config, pool.users, counts, display.update)

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, runner.stop)
            await runner.run()

        aio.run(main())
    print(
        f"replay: {counts.achieved_sessions} sessions ({counts.complete} complete, {counts.incomplete} "
        f"incomplete, {counts.error} error), {counts.requests} requests, {counts.failed_requests} failed, "
        f"{counts.duration_s:.1f} s -> {args.output}",
        file=sys.stderr,
    )
    return 130 if counts.interrupted else 0
