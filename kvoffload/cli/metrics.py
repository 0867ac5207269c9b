"""`kvoffload-lab metrics sample|snapshot`: the sampler the replay role starts on lab hosts.

Thin CLI over `kvoffload.metrics` (base deps only, so it works on hosts without the controller extra).
`sample` runs until SIGTERM/SIGINT and exits 0 after closing its files; `snapshot` scrapes once.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("metrics", help="sample Prometheus targets and GPU telemetry into raw JSONL")
    msub = p.add_subparsers(dest="metrics_command", metavar="ACTION", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--target",
            action="append",
            default=[],
            metavar="NAME=URL",
            help="Prometheus endpoint to scrape (repeatable), e.g. vllm-0=http://10.0.0.2:8000/metrics",
        )
        q.add_argument(
            "--gpu",
            action="append",
            default=[],
            metavar="NAME=TOOL",
            help="poll a GPU tool on this host (repeatable): TOOL is nvidia-smi or amd-smi",
        )
        q.add_argument("--timeout", type=float, default=10.0, help="per-scrape timeout in seconds (10)")

    s = msub.add_parser("sample", help="scrape every --interval seconds until SIGTERM")
    common(s)
    s.add_argument("--interval", type=float, default=15.0, help="seconds between scrapes (15)")
    s.add_argument("--output", type=Path, required=True, help="folder for <NAME>.jsonl files")
    s.set_defaults(func=_sample)

    n = msub.add_parser("snapshot", help="scrape every target once into one JSONL file")
    common(n)
    n.add_argument("--output", type=Path, required=True, help="file to write, e.g. snapshot-before.jsonl")
    n.set_defaults(func=_snapshot)


def _scraper(args: argparse.Namespace) -> Any:
    from kvoffload.errors import UserError
    from kvoffload.metrics.sampler import Scraper
    from kvoffload.metrics.targets import check_unique, parse_gpu_target, parse_http_target

    http = [parse_http_target(t) for t in args.target]
    gpus = [parse_gpu_target(g) for g in args.gpu]
    if not http and not gpus:
        raise UserError("metrics: give at least one --target NAME=URL or --gpu NAME=TOOL")
    check_unique([t.name for t in http] + [g.name for g in gpus])
    if args.timeout <= 0:
        raise UserError(f"--timeout {args.timeout}: must be > 0 seconds")
    return Scraper(http, gpus, timeout_s=args.timeout)


def _sample(args: argparse.Namespace) -> int:
    from kvoffload.errors import UserError
    from kvoffload.metrics.sampler import run_sampler

    if args.interval <= 0:
        raise UserError(f"--interval {args.interval}: must be > 0 seconds")
    scraper = _scraper(args)
    stop = threading.Event()

    def _on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        rounds = run_sampler(scraper, args.output, args.interval, stop)
    finally:
        scraper.close()
    print(f"metrics sample: {rounds} rounds written to {args.output}")
    return 0


def _snapshot(args: argparse.Namespace) -> int:
    from kvoffload.metrics.sampler import take_snapshot

    scraper = _scraper(args)
    try:
        n = take_snapshot(scraper, args.output)
    finally:
        scraper.close()
    print(f"metrics snapshot: {n} samples written to {args.output}")
    return 0
