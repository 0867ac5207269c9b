"""`kvoffload-lab datasets inspect`: what a dataset holds and how many virtual users it can feed."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    from kvoffload.datasets import DATASET_CODES

    p = sub.add_parser("datasets", help="inspect recorded conversation datasets")
    dsub = p.add_subparsers(dest="datasets_command", metavar="SUBCOMMAND", required=True)
    i = dsub.add_parser(
        "inspect",
        help="sessions, calls and the virtual-user ceiling per num_rounds",
        description=(
            "Load a dataset as the replay would and print its sessions, calls, calls per session and the "
            "number of virtual users available for num_rounds 1..50: a concurrency above that ceiling adds "
            "no load. Exit 2 on bad data, naming the file and record."
        ),
    )
    i.add_argument("--code", required=True, choices=DATASET_CODES, help="dataset loader")
    i.add_argument("path", type=Path, help="dataset file or folder")
    i.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    i.add_argument("--max-rounds", type=int, default=50, help="largest num_rounds in the table (default 50)")
    i.set_defaults(func=inspect)


def inspect(args: argparse.Namespace) -> int:
    from kvoffload.datasets import ceiling_table, chunk_floor, load_dataset
    from kvoffload.errors import UserError

    if args.max_rounds < 1:
        raise UserError(f"--max-rounds {args.max_rounds}: must be 1 or more")
    sessions = load_dataset(args.code, args.path)
    lengths = [len(s.calls) for s in sessions]
    table = ceiling_table(sessions, args.code, args.max_rounds)
    summary = {
        "code": args.code,
        "path": str(args.path),
        "sessions": len(sessions),
        "calls": sum(lengths),
        "calls_per_session": {
            "min": min(lengths),
            "median": statistics.median(lengths),
            "max": max(lengths),
        },
        "min_chunk_rounds": chunk_floor(args.code),
        "virtual_users": {str(k): v for k, v in table.items()},
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    cps = summary["calls_per_session"]
    console.print(
        f"[bold]{args.path}[/] ({args.code}): {len(sessions)} sessions, {sum(lengths)} calls, "
        f"calls per session min {cps['min']} / median {cps['median']} / max {cps['max']}"
    )
    t = Table(title="virtual-user ceiling (max useful concurrency) per num_rounds")
    for _ in range(5):
        t.add_column("rounds", justify="right")
        t.add_column("users", justify="right")
    rows = list(table.items())
    per_col = (len(rows) + 4) // 5
    for r in range(per_col):
        cells: list[str] = []
        for c in range(5):
            k = r + c * per_col
            cells += [str(rows[k][0]), str(rows[k][1])] if k < len(rows) else ["", ""]
        t.add_row(*cells)
    console.print(t)
    if args.code != "sammshen":
        console.print(
            f"num_rounds below {chunk_floor(args.code)} yields no users for this loader (chunk floor)."
        )
    return 0
