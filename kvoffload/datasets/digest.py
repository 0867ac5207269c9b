"""A dataset's digest: a cheap, stable name of its files' contents, to find the same dataset again.

`run` records it in campaign.json `dataset` beside the dataset's absolute path (docs/contracts.md,
"campaign.json dataset"); the report (kvoffload/report/prompts.py) takes a copy of the dataset only
when its digest matches, wherever it finds one. Stable: it depends on the files' relative paths, sizes
and bytes only (never a time stamp or the folder's place), so a copy elsewhere has the same digest.
Cheap: a file larger than WHOLE_BYTES counts by its size and its first and last EDGE_BYTES, so a
multi-GB trace folder is named in milliseconds; two such files differing only in their middle with the
same size would share a digest, which a dataset never edited in place does not risk. Standard library
only, like the loaders.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

WHOLE_BYTES = 8 << 20  # files up to 8 MiB are hashed whole
EDGE_BYTES = 1 << 20  # of a larger file: its first and last MiB
PREFIX = "sha256:"


def _files(path: Path) -> list[tuple[str, Path]]:
    """(relative posix path, file) of `path` itself or of every file under it, sorted; names starting
    with a dot (a copy tool's or an editor's) are left out, at any depth."""
    if path.is_file():
        return [("", path)]  # a file's digest does not depend on its name, like a folder's
    found = []
    for p in path.rglob("*"):
        rel = p.relative_to(path)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts):
            found.append((rel.as_posix(), p))
    return sorted(found)


def _content(file: Path, size: int) -> bytes:
    """The bytes that stand for a file's content: all of it, or its two edges past WHOLE_BYTES."""
    with file.open("rb") as fh:
        if size <= WHOLE_BYTES:
            return fh.read()
        head = fh.read(EDGE_BYTES)
        fh.seek(size - EDGE_BYTES)
        return head + fh.read(EDGE_BYTES)


def dataset_digest(path: Path | str) -> str | None:
    """The digest, "sha256:<hex>", of the dataset file or folder at `path`; None when it is not there or
    holds no file. An unreadable file raises OSError (the caller says where)."""
    root = Path(path)
    if not root.exists():
        return None
    files = _files(root)
    if not files:
        return None
    outer = hashlib.sha256()
    for rel, file in files:
        size = file.stat().st_size
        inner = hashlib.sha256(_content(file, size)).hexdigest()
        outer.update(f"{rel}\0{size}\0{inner}\n".encode())
    return PREFIX + outer.hexdigest()
