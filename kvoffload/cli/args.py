"""What several `kvoffload-lab` commands build alike: a command's parser, its actions, and the flags
they take with one meaning (the lab, its results, the wheels).

CLI layer only: argparse in, nothing else; each command module adds its own flags after these. The one
module of this package that the command modules share: a command never imports another's code.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvoffload.errors import UserError

# Where `run`, `plan --emit-extravars`, `doctor` and `demo` build the wheelhouse shipped to the hosts.
DEFAULT_WHEEL_CACHE = Path.home() / ".cache" / "kvoffload-lab" / "wheels"


def add_command(
    sub: Any,
    name: str,
    func: Callable[[argparse.Namespace], int] | None = None,
    *,
    help: str | None = None,
    description: str | None = None,
    **options: Any,
) -> argparse.ArgumentParser:
    """The parser of command (or action) `name` under `sub`, running `func`.

    As in click, the handler's docstring documents the command: its first paragraph is the line that
    the command list shows, the paragraphs after it open the command's own --help (the CLI's formatter,
    argparse's default, folds their white space and wraps them to the terminal). `help` and
    `description` given here are for a command without a handler (one made of actions) or with a
    description laid out by hand; `options` go to argparse as they are (formatter_class, epilog...).
    A command with neither a help line nor a documented handler is refused (ValueError)."""
    if func is not None:
        summary, _, rest = inspect.cleandoc(func.__doc__ or "").partition("\n\n")
        help = help or " ".join(summary.split()) or None
        description = description or rest or None
    # A command listed without a word: its handler lost its docstring (python -OO drops them all: then
    # the commands still run, as click's do, only their help is gone).
    if not help and sys.flags.optimize < 2:
        raise ValueError(f"command {name!r}: give `help`, or a docstring on its handler")
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help, description=description, **options)
    if func is not None:
        parser.set_defaults(func=func)
    return parser


def add_actions(parser: argparse.ArgumentParser, dest: str, metavar: str = "ACTION") -> Any:
    """The required ACTION of a command made of actions (`lab up`, `metrics sample`): its sub-parsers,
    for `add_command`; the action's name lands in `dest`."""
    return parser.add_subparsers(dest=dest, metavar=metavar, required=True)


def add_lab_arguments(p: argparse.ArgumentParser, *, results: bool = True) -> None:
    """INVENTORY, --campaign and (unless `results` is False) --results, as every lab command takes them."""
    p.add_argument("inventory", type=Path, help="Ansible YAML inventory (file, or folder holding hosts.yml)")
    p.add_argument("--campaign", type=Path, help="campaign YAML (default: all.vars.kvoffload_campaign)")
    if results:
        add_results_argument(p)


def add_results_argument(p: argparse.ArgumentParser) -> None:
    """--results: the base folder that holds one results folder per campaign (`run`, `doctor`, `demo`)."""
    p.add_argument(
        "--results", type=Path, default=Path("results"), help="results base folder (default ./results)"
    )


def hosts_python_flag(value: str | None) -> str | None:
    """The `--hosts-python` value (of run, doctor and plan --emit-extravars), checked; None when not
    given: the hosts are then asked before the wheelhouse is built
    (kvoffload/orchestrate/installs/host_python.py)."""
    from kvoffload.orchestrate.installs.wheelhouse import DEFAULT_HOSTS_PYTHON  # lazily: the CLI starts light

    if value is None:
        return None
    if not re.fullmatch(r"3\.[0-9]+\.[0-9]+", value):
        raise UserError(
            f"--hosts-python {value!r}: give the hosts' python3 version as X.Y.Z, e.g. {DEFAULT_HOSTS_PYTHON}"
        )
    return value
