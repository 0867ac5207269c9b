"""Turning validation failures into messages that name the file and the key.

`ConfigError` lines read `<file>: <key path>: <what is wrong>`, e.g.
`inventories/x/hosts.yml: all.vars.kvoffload_campaign.concurrency[1]: must be a positive integer, got 0`.
Validators raise `KeyedError` when the key to blame is not the one pydantic is validating (cross-field
rules name both keys). Formatting only; no file IO.
"""

from __future__ import annotations

import difflib
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


def _model_at(model: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The sub-model holding the last key of `loc`; None when the path leaves the models."""
    current = model
    for part in loc[:-1]:
        fields = current.model_fields
        if isinstance(part, int) or part not in fields:
            continue  # a list index or a mapping key (host or group name): same model below it
        found = _model_in(fields[part].annotation)
        if found is None:
            return None
        current = found
    return current


def _allowed_keys(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """Field names of the sub-model at `loc` (for 'unknown key' messages); [] when not a model."""
    current = _model_at(model, loc)
    return sorted(current.model_fields) if current is not None else []


def _holds(annotation: Any, kind: type) -> bool:
    """Whether `kind` appears in a type annotation (float | None, list[PositiveInt], Annotated[...])."""
    if annotation is kind:
        return True
    return any(_holds(arg, kind) for arg in getattr(annotation, "__args__", ()))


def _is_float_field(model: type[BaseModel], loc: Sequence[str | int]) -> bool:
    """Whether the field that `loc` ends in (or whose list it indexes) holds floats."""
    keys = [i for i, part in enumerate(loc) if isinstance(part, str)]
    if not keys:
        return False
    last = keys[-1]
    holder = _model_at(model, loc[: last + 1])
    field = holder.model_fields.get(str(loc[last])) if holder is not None else None
    return field is not None and _holds(field.annotation, float)


def _unknown_key(key: Any, allowed: list[str]) -> str:
    """'unknown key', with the closest allowed key (difflib) and the whole list. The cutoff is high
    enough that a typo is caught (concurrencies, hots) and a key refused on purpose is not "corrected"
    (lmcache_l1_size_gb.gpu is not a misspelt cpu)."""
    if not allowed:
        return "unknown key"
    close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key{hint} (allowed: {', '.join(allowed)})"


def _describe(error: Any, model: type[BaseModel]) -> str:
    kind = error["type"]
    value = error.get("input")
    if kind == "extra_forbidden":
        return _unknown_key(error["loc"][-1] if error["loc"] else "", _allowed_keys(model, error["loc"]))
    if kind == "missing":
        return "required key is missing"
    if kind == "greater_than":
        bound = error.get("ctx", {}).get("gt")
        number = "number" if _is_float_field(model, error["loc"]) else "integer"
        if bound == 0:
            return f"must be a positive {number}, got {value!r}"
        return f"must be a {number} greater than {bound:g}, got {value!r}"
    if kind in {"int_type", "int_parsing", "int_from_float"}:
        return f"must be an integer, got {value!r}"
    if kind in {"float_type", "float_parsing", "finite_number"}:
        return f"must be a finite number, got {value!r}"
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
