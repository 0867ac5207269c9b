"""Flags the real servers accept that the simulator does not model: accepted, logged, ignored.

Shared by the engine (`vllm serve`) and cache-server (`lmcache server`) argument parsers, so a unit
file written for the real binary starts the simulator unchanged.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable

PREFIX = "ignored_"


def add_ignored_flags(
    p: argparse.ArgumentParser, value_flags: Iterable[str], bool_flags: Iterable[str]
) -> None:
    """Accept each flag silently (hidden from --help); its value lands in `ignored_<name>`."""
    for flag in value_flags:
        p.add_argument(
            flag, dest=PREFIX + flag.lstrip("-").replace("-", "_"), default=None, help=argparse.SUPPRESS
        )
    for flag in bool_flags:
        p.add_argument(
            flag,
            dest=PREFIX + flag.lstrip("-").replace("-", "_"),
            action="store_true",
            help=argparse.SUPPRESS,
        )


def log_ignored(ns: argparse.Namespace, log: logging.Logger, binary: str) -> tuple[str, ...]:
    """The ignored flags that were given, each logged once; returned for the parsed-args record."""
    given = tuple(
        f"--{k.removeprefix(PREFIX).replace('_', '-')}"
        for k, v in vars(ns).items()
        if k.startswith(PREFIX) and v not in (None, False)
    )
    for flag in given:
        log.info("flag %s is accepted for compatibility with %s and not modelled", flag, binary)
    return given
