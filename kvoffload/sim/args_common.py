"""Command-line pieces both simulated servers share: ignored flags, checked values, JSON numbers.

Sits below `kvoffload.sim.engine_args` (`vllm serve`) and `kvoffload.sim.cache_args`
(`lmcache server`), which keep their own flags, defaults and messages. Both accept the real binary's
flags that the simulator does not model, log them once and ignore them, so a unit file written for
the real binary starts the simulator unchanged (`add_ignored_flags`, `log_ignored`); both check a
flag's value in its argparse type, so a bad one exits 2 with argparse's message as the real CLI does
(`checked_type`); both read numbers out of a JSON flag (`--kv-transfer-config`, `--l2-adapter`) with
one error naming the keys (`json_number`); both turn the parsed flags into a frozen dataclass of the
flags they model (`args_from`). No IO.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from kvoffload.errors import UserError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

PREFIX = "ignored_"

T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")


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


def checked_type(
    name: str, convert: Callable[[str], T], reject: Callable[[T], bool], message: str
) -> Callable[[str], T]:
    """An argparse `type`: `convert` the text, refuse a value `reject` holds true for.

    A text `convert` cannot read is "invalid NAME value: 'TEXT'" (argparse names the type by its
    `__name__`, hence `name`); a rejected value is `message` with `{}` replaced by the text.
    """

    def parse(text: str) -> T:
        value = convert(text)
        if reject(value):
            raise argparse.ArgumentTypeError(message.format(text))
        return value

    parse.__name__ = parse.__qualname__ = name
    return parse


def json_number(
    obj: Mapping[str, Any], key: str, default: float, convert: Callable[[Any], T], message: str
) -> T:
    """`obj[key]` (or `default`) through `convert` (int, float); `UserError(message)` if it is no number."""
    try:
        return convert(obj.get(key, default))
    except (TypeError, ValueError) as exc:
        raise UserError(message) from exc


def args_from(cls: type[D], ns: argparse.Namespace, **given: Any) -> D:
    """`cls`, the dataclass of the modelled flags, from the parsed ones.

    Each field not in `given` (values worked out from the flags) is the flag of the same name.
    """
    parsed = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if f.name not in given}
    return cls(**given, **parsed)
