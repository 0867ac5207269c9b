"""`kvoffload-lab replay`: replay a dataset against a server and write requests.jsonl + sessions.json.

Every flag is checked while the command line is parsed (exit 2, argparse's message naming the flag),
before the dataset is read or the server contacted. Flags that are also campaign keys are checked with
the campaign model's own constraints and messages (kvoffload/config/campaign.py), so one definition
drives both; the replay-only flags are defined here. Exit codes come from kvoffload/replay/outcome.py.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import textwrap
import time
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, PositiveInt

from kvoffload import aio
from kvoffload.cli.args import add_command
from kvoffload.contracts.layout import CellPaths
from kvoffload.datasets import DATASET_CODES, chunk_floor, load_dataset
from kvoffload.errors import UserError
from kvoffload.replay.outcome import MEANING, exit_code, verdict
from kvoffload.replay.records import ResultsUnwritable, SessionCounts

log = logging.getLogger("kvoffload.replay")

_WHERE = "kvoffload-lab replay"
# Warm-ups go out all at once, one connection each: a few are enough to open the path
# (docs/architecture.md section 6).
MAX_WARMUP = 1024
DEFAULT_STALL_TIMEOUT_S = 300.0
MAX_WORKERS = 256
STREAMS_PER_WORKER = 128  # kvoffload.replay.workers.STREAMS_PER_WORKER (not imported: the parser stays light)


def _problem(exc: Any, model: Any) -> str:
    """The campaign loader's wording of the first problem of a pydantic ValidationError, without its key."""
    from kvoffload.config.errors import format_validation_error, key_path

    line = format_validation_error(exc, _WHERE, "", model).problems[0]
    return line.removeprefix(f"{_WHERE}: {key_path('', exc.errors()[0]['loc'])}: ")


def _as_number(text: str) -> object:
    """The value a YAML campaign would hold for `text` (3 -> int, 1.5 -> float, else the string)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _constrained(annotation: Any, name: str) -> Callable[[str], Any]:
    """An argparse type checking one value against `annotation`, a pydantic-constrained type."""
    base = typing.get_args(annotation)[0] if typing.get_origin(annotation) is Annotated else annotation
    numeric = base in (int, float)

    def parse(text: str) -> Any:
        from pydantic import ConfigDict, TypeAdapter, ValidationError

        from kvoffload.config.campaign import Campaign

        try:
            adapter: TypeAdapter[Any] = TypeAdapter(annotation, config=ConfigDict(strict=True))
            return adapter.validate_python(_as_number(text) if numeric else text)
        except ValidationError as exc:
            raise argparse.ArgumentTypeError(_problem(exc, Campaign)) from None

    parse.__name__ = name  # argparse names the type in its fallback message
    return parse


def _campaign(key: str) -> Callable[[str], Any]:
    """An argparse type for a flag that is also campaign key `key`: the key's own constraint.

    A list key constrains each item (the field's own metadata, such as `min_length`, is the list's);
    an optional key its value.
    """

    def parse(text: str) -> Any:

        from kvoffload.config.campaign import Campaign

        info = Campaign.model_fields[key]
        annotation = info.annotation
        if typing.get_origin(annotation) is list:
            item = typing.get_args(annotation)[0]
        else:
            if typing.get_origin(annotation) in (typing.Union, types.UnionType):
                annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
            item = Annotated[(annotation, *info.metadata)] if info.metadata else annotation
        return _constrained(item, key)(text)

    parse.__name__ = key
    return parse


def _osl(text: str) -> int | str:
    from kvoffload.config.campaign import osl_problem

    value = _as_number(text)
    problem = osl_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text if value == "recorded" else int(text)


def _dataset_code(text: str) -> str:
    from pydantic import ValidationError

    from kvoffload.config.campaign import DatasetSpec

    try:
        return DatasetSpec.model_validate({"code": text, "path": "."}).code
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(_problem(exc, DatasetSpec)) from None


def _seconds(allow_zero: bool) -> Callable[[str], float]:
    what = "0 (off) or a positive number of seconds" if allow_zero else "a positive number of seconds"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    parse.__name__ = "seconds"
    return parse


def _base_url(text: str) -> str:
    import httpx

    example = "e.g. http://127.0.0.1:8000 or http://127.0.0.1:8000/v1"
    try:
        url = httpx.URL(text)
        port = url.port
    except httpx.InvalidURL as exc:
        raise argparse.ArgumentTypeError(f"not a valid URL ({exc}), got {text!r}; {example}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise argparse.ArgumentTypeError(
            f"must be an http:// or https:// URL with a host, got {text!r}; {example}"
        )
    if port is not None and not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"port {port} is out of range 1-65535, got {text!r}")
    if url.query or url.fragment:
        raise argparse.ArgumentTypeError(f"must not carry a query or a fragment, got {text!r}; {example}")
    return text


def _path(text: str) -> Path:
    """A path flag's value as a Path; an empty one (`--dataset ""`, an unset variable) is refused."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return Path(text)


def _dataset_path(text: str) -> Path:
    path = _path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file or folder")
    if not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
        raise argparse.ArgumentTypeError(f"{text}: not readable (permission denied)")
    return path


def _output_folder(text: str) -> Path:
    path = _path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a folder")

    records = CellPaths(path).requests
    if records.is_file() and records.stat().st_size > 0:
        raise argparse.ArgumentTypeError(
            f"{records} already holds records; give a new folder (results are never overwritten)"
        )
    return path


def _epilog() -> str:
    lines = [
        textwrap.fill(meaning, 100, initial_indent=f"  {int(code):<4} ", subsequent_indent=" " * 7)
        for code, meaning in MEANING.items()
    ]
    return "exit status:\n" + "\n".join(lines)


def register(sub: Any) -> None:
    description = (
        "Closed-loop replay: CONCURRENCY slots each replay one virtual user (a chunk of exactly "
        "NUM_ROUNDS consecutive recorded calls, teacher-forced history) and then take the next, until "
        "the pool, --max-sessions or --duration is exhausted. Writes OUTPUT/requests.jsonl (one line per "
        "request) and OUTPUT/sessions.json (session counts). A stall (requests in flight and nothing "
        "arriving for --stall-timeout seconds) stops the run; Ctrl-C stops cleanly, keeping every "
        "finished record."
    )
    p = add_command(
        sub,
        "replay",
        help="replay recorded multi-turn conversations against an OpenAI-compatible server",
        func=run,
        description=textwrap.fill(description, 100),
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the exit-status table is laid out by hand
    )

    positive = _constrained(PositiveInt, "positive integer")
    p.add_argument(
        "--base-url",
        required=True,
        type=_base_url,
        help="server root, e.g. http://127.0.0.1:8000 (or .../v1)",
    )
    p.add_argument(
        "--model",
        required=True,
        type=_campaign("model"),
        help="served model name; also the default tokenizer path",
    )
    p.add_argument(
        "--dataset-code",
        required=True,
        type=_dataset_code,
        metavar="{" + ",".join(DATASET_CODES) + "}",
        help="dataset loader",
    )
    p.add_argument("--dataset", required=True, type=_dataset_path, help="dataset file or folder")
    p.add_argument(
        "--concurrency",
        required=True,
        type=_campaign("concurrency"),
        help="number of concurrent users (slots)",
    )
    p.add_argument("--num-rounds", required=True, type=_campaign("num_rounds"), help="calls per virtual user")
    p.add_argument(
        "--output", required=True, type=_output_folder, help="folder for requests.jsonl and sessions.json"
    )
    p.add_argument(
        "--isl", type=_campaign("isl"), help="drop users whose deepest context exceeds this many tokens"
    )
    p.add_argument("--osl", type=_osl, default="recorded", help="max_tokens: 'recorded' (default) or an int")
    p.add_argument(
        "--max-sessions", type=_campaign("max_sessions"), help="replay at most this many virtual users"
    )
    p.add_argument(
        "--duration", type=_campaign("duration_s"), help="stop starting new rounds after this many seconds"
    )
    p.add_argument(
        "--tokenizer",
        metavar="MODEL|URL",
        help="what counts tokens for --isl: a model folder or hub id with a tokenizer.json here (the "
        "folder, the Hugging Face cache), or a server URL to ask its /tokenize (default: --model, then "
        "the server's /tokenize, then an approximate fallback)",
    )
    p.add_argument("--min-chunk-rounds", type=positive, help="chunk floor (default: 5, sammshen: none)")
    p.add_argument(
        "--warmup",
        type=_constrained(Annotated[int, Field(ge=0, le=MAX_WARMUP)], "warm-up count"),
        default=4,
        help=f"throwaway requests before timing (default 4, at most {MAX_WARMUP})",
    )
    p.add_argument(
        "--request-timeout",
        type=_seconds(allow_zero=False),
        default=64800.0,
        help="seconds per request (default 64800)",
    )
    p.add_argument(
        "--stall-timeout",
        type=_seconds(allow_zero=True),
        default=DEFAULT_STALL_TIMEOUT_S,
        help="stop the run when requests are in flight and no byte arrived on any of them for this many "
        "seconds; time with nothing in flight (recorded gaps) never counts "
        f"(default {DEFAULT_STALL_TIMEOUT_S:g}, 0: off)",
    )
    p.add_argument(
        "--workers",
        type=_constrained(Annotated[int, Field(ge=0, le=MAX_WORKERS)], "worker count"),
        default=0,
        help="processes to spread the slots over, each user on one (default 0: one per "
        f"{STREAMS_PER_WORKER} slots, at most the cores less one; 1: in this process)",
    )
    p.add_argument("--honor-gaps", action="store_true", help="sleep the recorded pre_gap before each round")
    p.add_argument("--agentic-traces", action="store_true", help="accepted for parity; always on")
    p.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos (engines without it)")
    p.add_argument(
        "--attribution",
        action="store_true",
        help="ask the server where each prompt's tokens came from (kv_transfer_params "
        "cached_token_stats: vLLM with LMCacheMPConnector); off by default, for servers that may refuse "
        "the field; campaigns turn it on",
    )
    g = p.add_argument_group("gpt-oss only (resolved by the orchestrator for gpt-oss models)")
    g.add_argument("--enable-agentic-tools", action="store_true", help="declare the tools the history calls")
    g.add_argument("--ask-mode", action="store_true", help="tool_choice auto with declared tools")
    g.add_argument("--sanitize-harmony-tokens", action="store_true", help="strip harmony tokens from history")
    g.add_argument("--agentic-max-attempts", type=positive, default=1, help="attempts per request")


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


_PROBE_TIMEOUT_S = 5.0


def _pct(values: list[float], pct: float) -> float:
    """Nearest-rank percentile of ascending `values`."""
    return values[max(1, math.ceil(pct / 100 * len(values))) - 1]


def ttft_summary(requests_file: Path) -> str | None:
    """One line of TTFT figures (ms) of the requests that succeeded: all, round 1 (cold by design) and
    the later rounds (where a KV hit shows); None when the file is missing or holds no success."""
    by_round: dict[bool, list[float]] = {True: [], False: []}
    try:
        lines = requests_file.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a full disk; the ingest names it
        if record.get("status") == "ok" and isinstance(record.get("ttft_s"), int | float):
            by_round[record.get("round") == 1].append(1000 * float(record["ttft_s"]))
    everything = sorted(by_round[True] + by_round[False])
    if not everything:
        return None
    parts = [f"all {len(everything)}: p50 {_pct(everything, 50):.0f} / p95 {_pct(everything, 95):.0f}"]
    for first, name in ((True, "round 1"), (False, "later rounds")):
        values = sorted(by_round[first])
        if values:
            parts.append(f"{name} {len(values)}: p50 {_pct(values, 50):.0f} / p95 {_pct(values, 95):.0f}")
    return "replay: TTFT ms (ok requests) " + "; ".join(parts)


def _isl_tokenizer(args: argparse.Namespace) -> Any:
    """The tokenizer for --isl: --tokenizer as given (a URL asks that server); else --model's own
    tokenizer.json when it is on this machine; else the server's /tokenize when it answers (a probe
    before any timed request); else the approximate fallback."""
    from kvoffload.tokenizer import FallbackTokenizer, ServerTokenizer, find_tokenizer_file, open_tokenizer

    if args.tokenizer:
        return open_tokenizer(args.tokenizer, args.model)
    if find_tokenizer_file(args.model) is not None:
        return open_tokenizer(args.model)
    server = ServerTokenizer(args.base_url, args.model, timeout_s=_PROBE_TIMEOUT_S)
    try:
        server.count("probe")
    except (OSError, ValueError) as exc:
        log.info("%s does not tokenize (%s): --isl counts with the approximate fallback", server.url, exc)
        return FallbackTokenizer()
    return server


def run(args: argparse.Namespace) -> int:
    from kvoffload.config.campaign import rounds_problem
    from kvoffload.replay.requests import RequestOptions
    from kvoffload.replay.runner import ReplayConfig, ReplayRunner
    from kvoffload.replay.users import select_users
    from kvoffload.replay.workers import WorkerPool, default_workers

    floor = args.min_chunk_rounds if args.min_chunk_rounds is not None else chunk_floor(args.dataset_code)
    code = (
        args.dataset_code
        if args.min_chunk_rounds is None
        else f"{args.dataset_code} with --min-chunk-rounds {floor}"
    )
    problem = rounds_problem(args.num_rounds, code, floor, code_key="--dataset-code")
    if problem is not None:
        raise UserError(f"argument --num-rounds: {problem}")
    sessions = load_dataset(args.dataset_code, args.dataset)
    tokenizer = _isl_tokenizer(args) if args.isl else None
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
    if tokenizer is not None:
        from kvoffload.tokenizer import describe

        log.info("--isl counted by %s", describe(tokenizer))
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
            attribution=args.attribution,
            sanitize_harmony_tokens=args.sanitize_harmony_tokens,
            agentic_tools=args.enable_agentic_tools,
            ask_mode=args.ask_mode,
        ),
        warmup=args.warmup,
        request_timeout_s=args.request_timeout,
        duration_s=args.duration,
        honor_gaps=args.honor_gaps,
        max_attempts=args.agentic_max_attempts,
        stall_timeout_s=args.stall_timeout,
    )
    counts = SessionCounts(
        requested_concurrency=args.concurrency,
        num_rounds=args.num_rounds,
        virtual_users_available=pool.available,
        dropped_by_isl=pool.dropped_by_isl,
    )
    workers = args.workers or default_workers(args.concurrency)
    with _Display(len(pool.users)) as display:
        runner: ReplayRunner | WorkerPool
        if workers > 1 and min(args.concurrency, len(pool.users)) > 1:
            log.info("replay over %d worker processes", workers)
            runner = WorkerPool(config, pool.users, counts, workers, display.update)
        else:
            runner = ReplayRunner(config, pool.users, counts, display.update)

        try:
            aio.run(aio.until_signal(runner.run, runner.stop))
        except ResultsUnwritable as exc:  # sessions.json itself could not be written
            counts.stopped_by, counts.stop_reason = "results", str(exc.strerror)
    print(
        f"replay: {counts.achieved_sessions} sessions ({counts.complete} complete, {counts.incomplete} "
        f"incomplete, {counts.error} error), {counts.requests} requests, {counts.failed_requests} failed, "
        f"{counts.duration_s:.1f} s -> {args.output}",
        file=sys.stderr,
    )
    summary = ttft_summary(args.output / "requests.jsonl")
    if summary is not None:
        print(summary, file=sys.stderr)
    status = exit_code(counts)
    message = verdict(counts)
    if message is not None:  # the last line: what the replay role and the campaign show
        print(f"kvoffload-lab: {message} (exit {int(status)})", file=sys.stderr)
    return int(status)
