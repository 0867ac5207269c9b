"""The KV cache server's per-request prefetch lines, joined to the request records at ingest.

LMCache 0.5.6 says which of a request's lookup hits came from L1 and which from L2 only in its log, one
line per lookup (the simulator's cache server writes the same line):

    Prefetch request completed (L1+L2): 18/18 retained keys (18 L1, 0 L2) in 2.4 ms
    (external_request_id=chatcmpl-93d271d214c75184-9082fe43, ...)

The collect role keeps these lines per host (units/<host>--kvoffload-lmcache.service.prefetch.txt). The
external request id is vLLM's engine request id: the answer's `id` (the record's `response_id`) with a
`-<8 hex>` suffix vLLM adds. LMCache writes the line only for a lookup that hit (the real capture's
first, cold request has none; tests/fixtures/lmcache-0.5.6-cpu-attribution/README.md), so where the cell
has prefetch lines at all, a record with an id that no line names had a lookup without a hit: 0 and 0.
Without any line (no KV cache server, or its lines not collected) every record gets nulls: the server
did not say. A line that names no record (an earlier cell's, a warm-up) is ignored; where two lines
name one request (a lookup repeated while it waited), the last one counts. No pandas here; pyarrow in,
pyarrow out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

PREFETCH_GLOB = "*--kvoffload-lmcache.service.prefetch.txt"
_LINE = re.compile(
    r"Prefetch request completed \(L1\+L2\): (?P<hit>\d+)/(?P<total>\d+) \w+(?: \w+)? "
    r"\((?P<l1>\d+) L1, (?P<l2>\d+) L2\).*?external_request_id=(?P<rid>[^,)\s]+)"
)
_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
# Columns ingest adds to the requests table (docs/contracts.md "requests table").
COLUMNS = (
    ("lmcache_l1_hit_chunks", pa.int64()),
    ("lmcache_l2_hit_chunks", pa.int64()),
)


@dataclass(frozen=True)
class Prefetch:
    """One request's lookup as the server logged it: chunks hit in L1 and in L2, of the chunks asked."""

    l1: int
    l2: int
    asked: int


def parse(lines: Iterable[str]) -> dict[str, Prefetch]:
    """Engine request id -> its prefetch (the last line wins); lines of any other kind are skipped."""
    out: dict[str, Prefetch] = {}
    for line in lines:
        m = _LINE.search(line)
        if m is not None:
            out[m["rid"]] = Prefetch(int(m["l1"]), int(m["l2"]), int(m["total"]))
    return out


def read_folder(units_dir: Path) -> dict[str, Prefetch]:
    """Every prefetch line the collect role kept in a cell's units/ folder (none: empty)."""
    out: dict[str, Prefetch] = {}
    if units_dir.is_dir():
        for path in sorted(units_dir.glob(PREFETCH_GLOB)):
            with path.open(encoding="utf-8", errors="replace") as f:
                out.update(parse(f))
    return out


def join(requests: pa.Table, prefetches: dict[str, Prefetch]) -> pa.Table:
    """`requests` with COLUMNS appended: each record's L1 and L2 hit chunks (module docstring: 0 for a
    record no line names when there are lines, null without any line or without a response id).

    The server's ids carry vLLM's suffix, the records the answer's id: both sides are keyed without it.
    """
    by_answer = {_SUFFIX.sub("", rid): p for rid, p in prefetches.items()}
    miss = Prefetch(0, 0, 0) if prefetches else None
    found = [by_answer.get(rid, miss) if rid else None for rid in requests["response_id"].to_pylist()]
    l1 = pa.array([p.l1 if p else None for p in found], pa.int64())
    l2 = pa.array([p.l2 if p else None for p in found], pa.int64())
    return requests.append_column(COLUMNS[0][0], l1).append_column(COLUMNS[1][0], l2)
