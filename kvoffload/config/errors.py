"""Turning validation failures into messages that name the file and the key.

`ConfigError` lines read `<file>: <key path>: <what is wrong>`, e.g.
`inventories/x/hosts.yml: all.vars.kvoffload_campaign.concurrency[1]: must be a positive integer, got 0`.
Validators raise `KeyedError` when the key to blame is not the one pydantic is validating (cross-field
rules name both keys). Formatting only; no file IO.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from kvoffload.errors import UserError


class ConfigError(UserError):
    """One or more problems in an inventory or campaign file, one `<file>: <key>: <problem>` per line."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class KeyedError(ValueError):
    """A rule violation blamed on `key` (relative to the model being validated), e.g. `num_rounds[0]`."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


def key_path(prefix: str, loc: Sequence[str | int]) -> str:
    """`prefix` + pydantic location as a YAML key path: ('concurrency', 1) -> prefix.concurrency[1]."""
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _join(prefix: str, key: str) -> str:
    if not prefix:
        return key
    return f"{prefix}{key}" if key.startswith("[") else f"{prefix}.{key}"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The first pydantic model inside a type annotation (list[X], dict[str, X | None], ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _allowed_keys(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """Field names of the sub-model at `loc` (for 'unknown key' messages); [] when not a model."""
    current = model
    for part in loc[:-1]:
        fields = current.model_fields
        if isinstance(part, int) or part not in fields:
            continue  # a list index or a mapping key (host or group name): same model below it
        found = _model_in(fields[part].annotation)
        if found is None:
            return []
        current = found
    return sorted(current.model_fields)


def _describe(error: Any, model: type[BaseModel]) -> str:
    kind = error["type"]
    value = error.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, error["loc"])
        return "unknown key" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
    if kind == "missing":
        return "required key is missing"
    if kind == "greater_than" and error.get("ctx", {}).get("gt") == 0:
        return f"must be a positive integer, got {value!r}"
    if kind in {"int_type", "int_parsing", "int_from_float"}:
        return f"must be an integer, got {value!r}"
    if kind == "model_type":
        keys = _allowed_keys(model, [*error["loc"], ""])
        return "must be a mapping" + (f" with keys {', '.join(keys)}" if keys else "") + f", got {value!r}"
    if kind == "value_error":
        return str(error.get("ctx", {}).get("error", error["msg"]))
    return f"{error['msg']}, got {value!r}" if value is not None else error["msg"]


def format_validation_error(
    exc: ValidationError, file: Path | str, prefix: str, model: type[BaseModel]
) -> ConfigError:
    """One line per pydantic error, located in `file` under the key path `prefix`."""
    lines = []
    for error in exc.errors():
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, KeyedError):
            base = key_path(prefix, error["loc"]) if (prefix or error["loc"]) else ""
            where = _join(base, cause.key)
            lines.append(f"{file}: {where}: {cause}")
            continue
        lines.append(f"{file}: {key_path(prefix, error['loc'])}: {_describe(error, model)}")
    return ConfigError(lines)
