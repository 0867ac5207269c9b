"""Arrow column schemas derived from the contract models, so a column exists only where a field does.

Maps each field's annotation (int, float, str, bool, a Literal of strings, each optionally `| None`)
to an arrow type; any other annotation is a programming error (TypeError at import of the caller).
No IO.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any, Literal, Union, get_args, get_origin

import pyarrow as pa
from pydantic import BaseModel

_SCALARS: dict[Any, pa.DataType] = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}


def arrow_type(annotation: Any) -> pa.DataType:
    """The arrow type of a scalar field annotation; TypeError for anything else."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return arrow_type(args[0])
    elif origin is Literal:
        kinds = {type(v) for v in get_args(annotation)}
        if len(kinds) == 1:
            return _SCALARS[kinds.pop()]
    elif annotation in _SCALARS:
        return _SCALARS[annotation]
    raise TypeError(f"no arrow column type for {annotation!r}")


def arrow_schema(
    model: type[BaseModel], order: Sequence[str] | None = None, exclude: Sequence[str] = ()
) -> pa.Schema:
    """One column per field of `model` but `exclude`, named by its alias, in `order` (default: field
    order); ValueError when `order` does not name those fields exactly once."""
    by_name = {
        (info.alias or name): info
        for name, info in model.model_fields.items()
        if (info.alias or name) not in exclude
    }
    names = list(order) if order is not None else list(by_name)
    if sorted(names) != sorted(by_name):
        raise ValueError(f"order {names} does not list the fields of {model.__name__} exactly once")
    return pa.schema([(name, arrow_type(by_name[name].annotation)) for name in names])


def column_defaults(model: type[BaseModel]) -> dict[str, Any]:
    """alias -> default of every field whose default is not None: what an older file's absent column means."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if not info.is_required() and info.default is not None:
            out[info.alias or name] = info.default
    return out
