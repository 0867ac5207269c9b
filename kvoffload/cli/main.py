"""Entry point of `kvoffload-lab`: builds the sub-command tree and maps errors to exit codes.

Each sub-command lives in its own module of this package, exposing `register(subparsers)`; the module
adds its parser with `args.add_command`, which runs the handler it names and takes the command's help
line and description from that handler's docstring. Imports of heavy layers happen inside the handlers
so `--help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from kvoffload import __version__
from kvoffload.errors import UserError

# Sub-command modules, in the order `--help` lists them.
COMMAND_MODULES = (
    "kvoffload.cli.datasets",
    "kvoffload.cli.replay",
    "kvoffload.cli.run",
    "kvoffload.cli.demo",
    "kvoffload.cli.watch",
    "kvoffload.cli.lab",
    "kvoffload.cli.doctor",
    "kvoffload.cli.plan",
    "kvoffload.cli.calibrate",
    "kvoffload.cli.sim",
    "kvoffload.cli.metrics",
    "kvoffload.cli.report",
    "kvoffload.cli.compare",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvoffload-lab",
        description=(
            "Provision a GPU lab, replay real multi-turn conversations against vLLM with and without "
            "LMCache KV offloading (gpu, cpu, nvme tiers), and report whether offloading helps."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not args.verbose:
        for noisy in ("httpx", "httpcore", "asyncio"):  # one line per HTTP request is not progress
            logging.getLogger(noisy).setLevel(logging.WARNING)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args))
    except UserError as exc:
        print(f"kvoffload-lab: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("kvoffload-lab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
