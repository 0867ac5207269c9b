"""Recorded multi-turn conversations: loaders per dataset code, sessions and virtual users.

Used by the replay runner (on the client host) and by `plan` (virtual-user ceilings). Depends only on
the standard library (and pyarrow for parquet). See docs/architecture.md section 6 for the semantics.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kvoffload.datasets import generic, sammshen, tau2
from kvoffload.datasets.model import Call, Session, VirtualUser
from kvoffload.datasets.users import MIN_CHUNK_ROUNDS, ceiling_table, chunk_floor, virtual_users
from kvoffload.errors import UserError

LOADERS: dict[str, Callable[[Path], list[Session]]] = {
    "sammshen": sammshen.load,
    "tau2-bench-v1": tau2.load,
    "generic": generic.load,
}
DATASET_CODES = tuple(LOADERS)


def load_dataset(code: str, path: Path | str) -> list[Session]:
    """Sessions of a dataset; bad input raises `UserError` naming the file and record."""
    loader = LOADERS.get(code)
    if loader is None:
        raise UserError(f"unknown dataset code {code!r}: choose one of {', '.join(DATASET_CODES)}")
    sessions = loader(Path(path))
    if not sessions:
        raise UserError(f"{path}: no sessions found for dataset code {code!r}")
    return sessions


__all__ = [
    "DATASET_CODES",
    "MIN_CHUNK_ROUNDS",
    "Call",
    "Session",
    "VirtualUser",
    "ceiling_table",
    "chunk_floor",
    "load_dataset",
    "virtual_users",
]
