"""The LMCache server's per-request prefetch lines and their join to the request records at ingest."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from kvoffload.ingest import lmcache_log
from kvoffload.ingest.tables import ingest_campaign, load_tables
from tests.support.small_campaign import copy_small

ROOT = Path(__file__).resolve().parents[3]
REAL = ROOT / "tests" / "fixtures" / "lmcache-0.5.6-cpu-attribution" / "server.log"


def test_the_real_servers_lines_parse_and_reconcile_with_its_counters() -> None:
    text = REAL.read_text()
    found = lmcache_log.parse(text.splitlines())
    # Every prefetch line of the capture, no other line; each names a distinct request.
    assert len(found) == text.count("Prefetch request completed") == 14
    assert all(rid.startswith("chatcmpl-") for rid in found)
    assert all(p.l1 + p.l2 <= p.asked for p in found.values())
    # The server's own counters after the capture (lmcache-metrics.txt): 54 L1 and 13 L2 hit keys.
    assert sum(p.l1 for p in found.values()) == 54 and sum(p.l2 for p in found.values()) == 13
    # Joined to the answers' ids: the cold first request had no line (a lookup without a hit).
    answers = [json.loads(x) for x in (REAL.parents[1] / "vllm-0.32-cpu-attribution" / "answers.jsonl")
               .read_text().splitlines()]  # fmt: skip
    ids = [a["id"] for a in answers if "id" in a]
    joined = lmcache_log.join(pa.table({"response_id": ids}), found)
    l1 = joined["lmcache_l1_hit_chunks"].to_pylist()
    assert l1[0] == 0 and None not in l1 and sum(l1) == 54


def _line(rid: str, l1: int, l2: int, asked: int) -> str:
    return (
        f"2026-12-04T22:56:01+0000 lab lmcache[1]: [2026-12-04 22:56:01,123] LMCache INFO: Prefetch request "
        f"completed (L1+L2): {l1 + l2}/{asked} retained keys ({l1} L1, {l2} L2) in 1.2 ms "
        f"(external_request_id={rid}, prefetch_request_id=7) (storage_manager.py:301)"
    )


def test_join_by_the_answer_id_without_vllms_suffix() -> None:
    lines = [
        _line("chatcmpl-aaaaaaaaaaaaaaaa-0123abcd", 3, 0, 4),
        _line("chatcmpl-bbbbbbbbbbbbbbbb-89abcdef", 1, 2, 5),
        _line("chatcmpl-bbbbbbbbbbbbbbbb-00000000", 0, 3, 5),  # a later lookup of the same request wins
        _line("chatcmpl-cccccccccccccccc-11111111", 9, 9, 20),  # no record: an earlier cell's
        "INFO: Stored 768 tokens in 0.002 seconds",
    ]
    requests = pa.table(
        {"response_id": ["chatcmpl-aaaaaaaaaaaaaaaa", "chatcmpl-bbbbbbbbbbbbbbbb", "chatcmpl-dddd", None]}
    )
    out = lmcache_log.join(requests, lmcache_log.parse(lines))
    # dddd: no line, while the cell has lines: a lookup without a hit (LMCache logs hits only).
    assert out["lmcache_l1_hit_chunks"].to_pylist() == [3, 0, 0, None]
    assert out["lmcache_l2_hit_chunks"].to_pylist() == [0, 3, 0, None]
    # No line at all (no KV cache server, lines not collected): the server did not say.
    none = lmcache_log.join(requests, {})
    assert none["lmcache_l1_hit_chunks"].to_pylist() == [None] * 4


def test_ingest_adds_the_chunks_from_the_units_folder(tmp_path: Path) -> None:
    results = copy_small(tmp_path / "campaign")
    cell = results / "cells" / "a2cpu"
    rows = [json.loads(x) for x in (cell / "requests.jsonl").read_text().splitlines()]
    rows[0]["response_id"] = "chatcmpl-0123456789abcdef"
    (cell / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (cell / "units").mkdir(exist_ok=True)
    prefetch = cell / "units" / "node1--kvoffload-lmcache.service.prefetch.txt"
    prefetch.write_text(_line("chatcmpl-0123456789abcdef-deadbeef", 2, 1, 4) + "\n")
    ingest_campaign(results)
    t = load_tables(results).requests
    mine = t[t["cell_id"] == "a2cpu"]
    assert (mine["lmcache_l1_hit_chunks"].notna() == mine["response_id"].notna()).all()
    hit = mine[mine["response_id"] == "chatcmpl-0123456789abcdef"].iloc[0]
    assert (hit["lmcache_l1_hit_chunks"], hit["lmcache_l2_hit_chunks"]) == (2, 1)
    assert t.loc[t["cell_id"] != "a2cpu", "lmcache_l1_hit_chunks"].isna().all()
