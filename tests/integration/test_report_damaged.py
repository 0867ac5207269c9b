"""A corpus of damaged results folders, built from the campaign-small fixture: `report` never raises,
never prints a figure the intact folder would not, and names what is missing (issue 34).

The intact campaign is campaign-small with every counter lifted by a lifetime offset (long-running
servers: a counter read from 0 instead of its before value shows up as a wrong number). The damaged
campaign holds one copy of a fixture cell per damage, under its own cell id, so a single ingest and
report covers the whole corpus.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from kvoffload.report.build import (
    _context,
    analyse,
    conclude,
    render_html,
    render_markdown,
    report_json,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "campaign-small"
LIFETIME = 1e6  # added to every counter sample: the servers ran before the cell
COUNTER_SUFFIXES = ("_total", "_sum", "_count")

Damage = Callable[[Path], None]


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_lines(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _lift_counters(cell: Path) -> None:
    for path in (cell / "metrics").glob("*.jsonl"):
        rows = _lines(path)
        for r in rows:
            if str(r["name"]).endswith(COUNTER_SUFFIXES) and not str(r["name"]).startswith("gpu_"):
                r["value"] = float(r["value"]) + LIFETIME  # type: ignore[arg-type]
        _write_lines(path, rows)


def _cut(path: Path, fraction: float = 0.6) -> None:
    data = path.read_bytes()
    cut = int(len(data) * fraction)
    if data[cut - 1 : cut] == b"\n":
        cut -= 3  # mid-line, as a writer killed mid-write leaves it
    path.write_bytes(data[:cut])


def _drop_target(path: Path, target: str) -> None:
    _write_lines(path, [r for r in _lines(path) if r["target"] != target])


def _reset(cell: Path, target: str, after_ts: float) -> None:
    """The target restarted just after `after_ts`: its counters count again from 0 from there on."""
    files = [cell / "metrics" / f"{target}.jsonl", cell / "metrics" / "snapshot-after.jsonl"]
    at = {
        (r["name"], json.dumps(r["labels"], sort_keys=True)): float(r["value"])  # type: ignore[arg-type]
        for r in _lines(files[0])
        if r["ts"] == after_ts
    }
    for path in files:
        rows = _lines(path)
        for r in rows:
            key = (r["name"], json.dumps(r["labels"], sort_keys=True))
            later = r["target"] == target and float(r["ts"]) > after_ts  # type: ignore[arg-type]
            if later and key in at and str(r["name"]).endswith(COUNTER_SUFFIXES):
                r["value"] = float(r["value"]) - at[key]  # type: ignore[arg-type]
        _write_lines(path, rows)


def _rename(path: Path, old: str, new: str) -> None:
    rows = _lines(path)
    for r in rows:
        if r["name"] == old:
            r["name"] = new
    _write_lines(path, rows)


def _rename_l1_evictions(cell: Path) -> None:
    """A server whose L1 eviction counter has another name than LMCache 0.5.6's."""
    for name in ("lmcache.jsonl", "snapshot-before.jsonl", "snapshot-after.jsonl"):
        _rename(
            cell / "metrics" / name, "lmcache_mp_l1_evicted_chunks_total", "lmcache_mp_l1_evictions_total"
        )


T_MID = 1_800_000_060.0
# name -> (source cell, damages, words its warnings must name). Independent damages share a cell (each
# cell costs an ingest of its files).
CORPUS: dict[str, tuple[str, tuple[Damage, ...], tuple[str, ...]]] = {
    "nosessions-cutsampler": (
        "a2cpu",
        (lambda c: (c / "sessions.json").unlink(), lambda c: _cut(c / "metrics" / "lmcache.jsonl", 0.5)),
        ("sessions.json", "lmcache.jsonl"),
    ),
    "cutsessions-reset": (
        "a2cpu",
        (lambda c: _cut(c / "sessions.json"), lambda c: _reset(c, "vllm-0", T_MID)),
        ("sessions.json", "reset"),
    ),
    "nocelljson": ("a2cpu", (lambda c: (c / "cell.json").unlink(),), ("cell.json",)),
    "cutcelljson": ("a2cpu", (lambda c: _cut(c / "cell.json"),), ("cell.json",)),
    "nobefore": ("a3nvme", (lambda c: (c / "metrics" / "snapshot-before.jsonl").unlink(),), ("vllm-0",)),
    "nobeforetarget-renamed": (
        "a3nvme",
        (lambda c: _drop_target(c / "metrics" / "snapshot-before.jsonl", "vllm-0"), _rename_l1_evictions),
        ("vllm-0", "lmcache_mp_l1_evictions_total"),
    ),
    "cutbefore": ("a3nvme", (lambda c: _cut(c / "metrics" / "snapshot-before.jsonl"),), ("before snapshot",)),
    "noafter": ("a3nvme", (lambda c: (c / "metrics" / "snapshot-after.jsonl").unlink(),), ("lmcache",)),
    "nosampler": ("a3nvme", (lambda c: (c / "metrics" / "vllm-0.jsonl").unlink(),), ("vllm-0.jsonl",)),
    "norequests": ("a2cpu", (lambda c: (c / "requests.jsonl").write_text(""),), ("requests.jsonl",)),
}
# Counts of what was read, not figures of the cell: fewer with fewer files, by design.
BOOKKEEPING = {"scrapes", "scrape_failures", "gpus"}


def _copy_cell(src: Path, dst: Path, cell_id: str) -> None:
    shutil.copytree(src, dst)
    meta = json.loads((dst / "cell.json").read_text())
    meta["cell_id"] = cell_id
    (dst / "cell.json").write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[pd.DataFrame, Path]:
    """(intact summary indexed by cell_id, damaged campaign folder)."""
    root = tmp_path_factory.mktemp("corpus")
    intact, damaged = root / "intact", root / "damaged"
    shutil.copytree(FIXTURE, intact, ignore=shutil.ignore_patterns("tables", "report", "*.py"))
    sources = {source for source, _, _ in CORPUS.values()}
    for cell in list((intact / "cells").iterdir()):
        if cell.name in sources:
            _lift_counters(cell)
        else:
            shutil.rmtree(cell)
    (damaged / "cells").mkdir(parents=True)
    shutil.copy(intact / "campaign.json", damaged / "campaign.json")
    for name, (source, damages, _) in CORPUS.items():
        cell_id = f"{source}-{name}"
        _copy_cell(intact / "cells" / source, damaged / "cells" / cell_id, cell_id)
        for damage in damages:
            damage(damaged / "cells" / cell_id)
    return analyse(intact).summary.set_index("cell_id"), damaged


def _differs(damaged: object, intact: object) -> bool:
    if damaged is None or (isinstance(damaged, float) and math.isnan(damaged)):
        return False  # null is always allowed
    if isinstance(damaged, int | float) and not isinstance(damaged, bool):
        if intact is None or (isinstance(intact, float) and math.isnan(intact)):
            return True
        return not math.isclose(float(damaged), float(intact), rel_tol=1e-6, abs_tol=1e-9)  # type: ignore[arg-type]
    return False


def test_report_on_the_damaged_corpus_never_raises_never_invents_and_names_what_is_missing(
    corpus: tuple[pd.DataFrame, Path],
) -> None:
    intact, damaged_dir = corpus
    a = analyse(damaged_dir)
    c = conclude(a)
    ctx = _context(a, damaged_dir, c)
    markdown = render_markdown(ctx)
    assert "<html" in render_html(ctx).lower()
    json.loads(report_json(a, c))

    wrong = []
    for _, row in a.summary.iterrows():
        cell_id = str(row["cell_id"])
        source = cell_id.split("-")[0]
        for column, value in row.items():
            if column in BOOKKEEPING or column not in intact.columns:
                continue
            if _differs(value, intact.loc[source, column]):
                wrong.append(f"{cell_id}.{column}: {value} (intact {intact.loc[source, column]})")
    assert not wrong, "\n".join(wrong)

    warnings = a.warnings
    for name, (source, _, words) in CORPUS.items():
        mine = warnings[warnings["cell_id"] == f"{source}-{name}"]
        text = " ".join(mine["message"])
        for word in words:
            assert word in text, f"{name}: no warning names {word!r}: {text}"
        if words:
            assert f"{source}-{name}" in markdown
    # the fallbacks that keep a figure are grouped apart from the validity warnings
    validity = markdown.split("## Validity warnings")[1].split("### Notes (information, not validity)")
    assert len(validity) == 2 and "**before_snapshot_missing**" in validity[1]
    assert "**before_snapshot_missing**" not in validity[0] and "**counter_renamed**" in validity[0]


def _campaign_with_counted_requests(root: Path, cells: tuple[str, ...]) -> Path:
    """campaign-small's `cells`, each sessions.json counting its 12 requests sent (the fixture's files
    predate that count)."""
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("tables", "report", "*.py"))
    for cell in list((root / "cells").iterdir()):
        if cell.name not in cells:
            shutil.rmtree(cell)
            continue
        counts = json.loads((cell / "sessions.json").read_text())
        counts["requests"] = len(_lines(cell / "requests.jsonl"))
        (cell / "sessions.json").write_text(json.dumps(counts))
    return root


def test_requests_lost_at_a_line_boundary_make_the_cell_invalid(tmp_path: Path) -> None:
    """Issue 43, defect 8: a2cpu's requests.jsonl keeps its first 6 of 12 records (cut at a line
    boundary, so every line still reads). Its TTFT changes; the cell must say so, name the counts and
    the file, and its group must not be comparable, while the intact campaign's is."""
    cells = ("a1gpu", "a2cpu")
    intact = analyse(_campaign_with_counted_requests(tmp_path / "intact", cells))
    assert intact.comparison["comparable"].all()
    assert "requests_lost" not in set(intact.warnings["kind"])

    damaged_dir = _campaign_with_counted_requests(tmp_path / "damaged", cells)
    path = damaged_dir / "cells" / "a2cpu" / "requests.jsonl"
    _write_lines(path, _lines(path)[:6])
    a = analyse(damaged_dir)
    assert not a.comparison["comparable"].any()
    lost = a.warnings[a.warnings["kind"] == "requests_lost"]
    assert list(lost["cell_id"]) == ["a2cpu"]
    message = str(lost["message"].iloc[0])
    assert "cells/a2cpu/requests.jsonl holds 6 request records" in message
    assert "sessions.json counts 12 requests sent (6 lost" in message
    row = a.summary.set_index("cell_id").loc["a2cpu"]
    assert (row["requests"], row["requests_sent"], row["requests_lost"]) == (6, 12, 6)
    c = conclude(a)
    cpu = [f for f in c.findings if f.tier == "cpu"]
    assert cpu and not any(f.comparable for f in cpu)
    assert "6 request record(s) lost" in " ".join(f.statement for f in cpu)
