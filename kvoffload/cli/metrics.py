"""`kvoffload-lab metrics sample|snapshot|gpu-textfile`: the samplers that run on lab hosts.

Thin CLI over `kvoffload.metrics` (base deps only, so it works on hosts without the controller extra).
`sample` (started by the replay role on the client) runs until SIGTERM/SIGINT, or with `--replay-lock`
until the replay it samples for has ended, and exits 0 after closing its files; `snapshot` scrapes
once; `gpu-textfile` (kvoffload-gpu-telemetry.service on `vllm` hosts) rewrites a node-exporter
textfile until SIGTERM/SIGINT, or once with `--once`.
"""

from __future__ import annotations

import argparse
import math
import signal
import threading
from pathlib import Path
from typing import Any

from kvoffload.cli.args import add_actions, add_command
from kvoffload.errors import UserError
from kvoffload.orchestrate.checks.controller import check_folder_flag

# kvoffload.metrics.gpu.GPU_TOOLS, spelled out so that building the parser imports no metrics code.
GPU_TOOL_CHOICES = ("nvidia-smi", "amd-smi")


def register(sub: Any) -> None:
    p = add_command(sub, "metrics", help="sample Prometheus targets and GPU telemetry into raw JSONL")
    msub = add_actions(p, "metrics_command")

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

    s = add_command(msub, "sample", _sample)
    common(s)
    s.add_argument("--interval", type=float, default=15.0, help="seconds between scrapes (15)")
    s.add_argument("--output", type=Path, required=True, help="folder for <NAME>.jsonl files")
    s.add_argument(
        "--replay-lock",
        type=Path,
        default=None,
        metavar="FILE",
        help="also stop once the replay holding an flock on FILE has ended, or none took it within "
        "--lock-grace seconds (the replay role runs the replay under `flock FILE`)",
    )
    s.add_argument(
        "--lock-grace", type=float, default=300.0, help="seconds a replay has to take --replay-lock (300)"
    )

    n = add_command(msub, "snapshot", _snapshot)
    common(n)
    n.add_argument("--output", type=Path, required=True, help="file to write, e.g. snapshot-before.jsonl")

    g = add_command(msub, "gpu-textfile", _gpu_textfile)
    g.add_argument("--tool", choices=GPU_TOOL_CHOICES, required=True, help="GPU tool to poll on this host")
    g.add_argument(
        "--output",
        type=Path,
        required=True,
        help="file to replace, ending in .prom, e.g. /var/lib/prometheus/node-exporter/kvoffload_gpu.prom",
    )
    g.add_argument("--interval", type=float, default=15.0, help="seconds between polls (15)")
    g.add_argument("--timeout", type=float, default=10.0, help="seconds the tool may take per poll (10)")
    g.add_argument(
        "--once",
        action="store_true",
        help="poll once, write the file and exit: 0 when the tool answered, 1 when it failed (file kept)",
    )


def _seconds(value: float, flag: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"{flag} {value}: must be a finite number of seconds > 0")


def _output_file(path: Path) -> None:
    """--output of a single file: not a folder, in a folder that is not a file."""
    if path.is_dir():
        raise UserError(f"--output {path}: is a folder; give the file to write")
    for parent in path.parents:
        check_folder_flag(parent, f"--output {path}: folder")


def _scraper(args: argparse.Namespace) -> Any:
    from kvoffload.metrics.sampler import Scraper
    from kvoffload.metrics.targets import check_unique, parse_gpu_target, parse_http_target

    http = [parse_http_target(t) for t in args.target]
    gpus = [parse_gpu_target(g) for g in args.gpu]
    if not http and not gpus:
        raise UserError("metrics: give at least one --target NAME=URL or --gpu NAME=TOOL")
    check_unique([t.name for t in http] + [g.name for g in gpus])
    _seconds(args.timeout, "--timeout")
    return Scraper(http, gpus, timeout_s=args.timeout)


def _sample(args: argparse.Namespace) -> int:
    """scrape every --interval seconds until SIGTERM

    Scrape every --target (Prometheus text) and poll every --gpu tool each --interval seconds, appending one
    JSON line per sample to --output/<NAME>.jsonl (whole lines only, so a cut run leaves readable files).
    SIGTERM or SIGINT ends the current round and exits 0. The replay role runs it on the client next to each
    replay; the report reads the files.
    """
    from kvoffload.metrics.sampler import ReplayLease, run_sampler

    _seconds(args.interval, "--interval")
    _seconds(args.lock_grace, "--lock-grace")
    check_folder_flag(args.output, "--output")
    lease = None
    if args.replay_lock is not None:
        if not args.replay_lock.is_file():
            raise UserError(f"--replay-lock {args.replay_lock}: no such file (the replay role creates it)")
        lease = ReplayLease(args.replay_lock, args.lock_grace)
    scraper = _scraper(args)
    stop = threading.Event()

    def _on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        rounds = run_sampler(scraper, args.output, args.interval, stop, lease)
    finally:
        scraper.close()
    print(f"metrics sample: {rounds} rounds written to {args.output}")
    return 0


def _snapshot(args: argparse.Namespace) -> int:
    """scrape every target once into one JSONL file"""
    from kvoffload.metrics.sampler import take_snapshot

    _output_file(args.output)
    scraper = _scraper(args)
    try:
        n = take_snapshot(scraper, args.output)
    except OSError as exc:  # the disk is full or read-only: say so, leave no partial file
        raise UserError(f"--output {args.output}: cannot write: {exc.strerror}") from exc
    finally:
        scraper.close()
    print(f"metrics snapshot: {n} samples written to {args.output}")
    return 0


def _gpu_textfile(args: argparse.Namespace) -> int:
    """poll nvidia-smi or amd-smi into a file for node-exporter's textfile collector

    Poll a GPU tool every --interval seconds and replace --output (atomically, mode 0644) with Prometheus
    gauges gpu_power_watts, gpu_utilization_percent, gpu_memory_used_bytes and gpu_memory_total_bytes per GPU
    (labels gpu, vendor, and uuid, model where the tool prints them), plus kvoffload_gpu_telemetry_up. Put
    --output in node-exporter's textfile folder: the client's sampler then reads the GPU series from the
    host's node-<host> target. A tool that fails (missing, too slow, non-zero exit) logs a warning and leaves
    only kvoffload_gpu_telemetry_up 0 in the file; sampling goes on. SIGTERM or SIGINT removes the file and
    exits 0.
    """
    from kvoffload.metrics.textfile import gpu_series, run_textfile, write_once

    output: Path = args.output
    if output.suffix != ".prom":
        raise UserError(f"--output {output}: must end in .prom (node-exporter reads only *.prom files)")
    if not output.parent.is_dir():
        raise UserError(
            f"--output {output}: folder {output.parent} does not exist (node-exporter's textfile folder)"
        )
    if output.is_dir():
        raise UserError(f"--output {output}: is a folder; give the .prom file to write")
    _seconds(args.interval, "--interval")
    _seconds(args.timeout, "--timeout")
    if args.once:
        poll = write_once(output, args.tool, args.timeout)
        if poll.error:
            print(f"metrics gpu-textfile: {args.tool} failed, {output} holds no GPU series: {poll.error}")
            return 1
        n = sum(len(series) for series in gpu_series(poll.samples).values())
        print(f"metrics gpu-textfile: {n} GPU series written to {output}")
        return 0
    stop = threading.Event()

    def _on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    polls = run_textfile(output, args.tool, args.interval, stop, timeout_s=args.timeout)
    print(f"metrics gpu-textfile: {polls} polls written to {output}, file removed")
    return 0
