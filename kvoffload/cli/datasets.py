"""`kvoffload-lab datasets inspect`: what a dataset holds and how many virtual users it can feed."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from kvoffload.cli.args import add_actions, add_command
from kvoffload.datasets import DATASET_CODES, ceiling_table, chunk_floor, load_dataset
from kvoffload.errors import UserError


def register(sub: Any) -> None:
    p = add_command(sub, "datasets", help="inspect recorded conversation datasets")
    dsub = add_actions(p, "datasets_command", metavar="SUBCOMMAND")
    i = add_command(dsub, "inspect", inspect)
    i.add_argument(
        "--dataset-code",
        "--code",  # its former name, deprecated
        dest="dataset_code",
        required=True,
        choices=DATASET_CODES,
        action=_DatasetCode,
        help="dataset loader: the campaign's dataset.code, `replay --dataset-code` (--code: deprecated)",
    )
    i.add_argument("path", type=Path, help="dataset file or folder")
    i.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    i.add_argument("--max-rounds", type=int, default=50, help="largest num_rounds in the table (default 50)")
    i.add_argument(
        "--tokenizer",
        metavar="MODEL|URL",
        help="what counts tokens: a model folder or hub id whose tokenizer.json is here (the folder, the "
        "Hugging Face cache), or a server URL to ask its /tokenize (default: the approximate fallback)",
    )
    i.add_argument(
        "--num-rounds",
        type=int,
        help="count tokens per round of the virtual users of this num_rounds (default: whole sessions)",
    )


class _DatasetCode(argparse.Action):
    """--dataset-code, named as `replay` and the replay role (replay_dataset_code) name it; its former
    name --code still works, with a warning."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if option_string == "--code":
            print(
                "kvoffload-lab: warning: datasets inspect --code is deprecated; use --dataset-code",
                file=sys.stderr,
            )
        setattr(namespace, self.dest, values)


def inspect(args: argparse.Namespace) -> int:
    """sessions, calls and the virtual-user ceiling per num_rounds

    Load a dataset as the replay would and print its sessions, calls, calls per session, the number of virtual
    users available for num_rounds 1..50 (a concurrency above that ceiling adds no load) and the input tokens
    per round (p50/p90/p99/max), naming the tokenizer that counted. Exit 2 on bad data, naming the file and
    record.
    """
    from kvoffload.datasets.tokens import round_tokens
    from kvoffload.tokenizer import describe, open_tokenizer

    code = args.dataset_code
    if args.max_rounds < 1:
        raise UserError(f"--max-rounds {args.max_rounds}: must be 1 or more")
    if args.num_rounds is not None and args.num_rounds < 1:
        raise UserError(f"--num-rounds {args.num_rounds}: must be 1 or more")
    sessions = load_dataset(code, args.path)
    lengths = [len(s.calls) for s in sessions]
    table = ceiling_table(sessions, code, args.max_rounds)
    tokenizer = open_tokenizer(args.tokenizer)
    try:
        tokens = round_tokens(sessions, tokenizer, code, args.num_rounds, args.max_rounds)
    except (OSError, ValueError) as exc:  # a server that does not answer /tokenize
        raise UserError(f"--tokenizer {args.tokenizer}: {exc}") from exc
    summary = {
        "code": code,
        "path": str(args.path),
        "sessions": len(sessions),
        "calls": sum(lengths),
        "calls_per_session": {
            "min": min(lengths),
            "median": statistics.median(lengths),
            "max": max(lengths),
        },
        "min_chunk_rounds": chunk_floor(code),
        "virtual_users": {str(k): v for k, v in table.items()},
        "tokenizer": tokenizer.name,
        "tokens_per_round": {
            "num_rounds": args.num_rounds,
            "rounds": [t.as_dict() for t in tokens],
        },
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console(width=WIDTH)
    cps = summary["calls_per_session"]
    console.print(f"[bold]{args.path}[/] ({code})")
    console.print(
        f"{len(sessions)} sessions, {sum(lengths)} calls; calls per session "
        f"min {cps['min']} / median {cps['median']:g} / max {cps['max']}"
    )
    t = Table(title="virtual users (max useful concurrency) per num_rounds")
    for _ in range(_PAIRS):
        t.add_column("rounds", justify="right")
        t.add_column("users", justify="right")
    rows = list(table.items())
    per_col = (len(rows) + _PAIRS - 1) // _PAIRS
    for r in range(per_col):
        cells: list[str] = []
        for c in range(_PAIRS):
            k = r + c * per_col
            cells += [str(rows[k][0]), str(rows[k][1])] if k < len(rows) else ["", ""]
        t.add_row(*cells)
    console.print(t)
    if code != "sammshen":
        console.print(f"num_rounds below {chunk_floor(code)} yields no users (chunk floor).")
    of = "whole sessions" if args.num_rounds is None else f"users of {args.num_rounds} rounds"
    per_round = Table(title=f"input tokens per round ({of})")
    for column in ("round", "calls", "p50", "p90", "p99", "max"):
        per_round.add_column(column, justify="right")
    for row in tokens:
        per_round.add_row(*(str(v) for v in (row.round, row.calls, row.p50, row.p90, row.p99, row.max)))
    console.print(per_round)
    console.print(f"tokens counted by {describe(tokenizer)}")
    return 0


# Tables fit an 80-column terminal; four (rounds, users) pairs of about 17 columns each do.
WIDTH = 80
_PAIRS = 4
