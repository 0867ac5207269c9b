"""The live page's figures (`kvoffload-lab watch`): where a campaign is now, as one JSON object.

Report layer, read-only on the results folder: status.json (kvoffload/orchestrate/campaign/status.py, re-read
only when it changed), each cell's requests.jsonl once it is on the controller (tailed: every read
starts where the last one ended, so a poll costs what was appended since), and the report's own
findings (`kvoffload.report.build.finding_groups`) for the cells that are DONE, computed again only
when that set changes and on a copy of those cells, so that the watcher never writes into a folder a
run is writing. The live engine figures come from status.json's points (the controller's scrapes
during the replay); rates are counter increases between points, corrected for resets as the analysis
corrects them (`kvoffload.analysis.series.corrected`). status.json names cells by id only; the page
names them by their values (`cell_label`) from campaign.json `cells` (every cell the run planned,
written before its first) or, for a cell it does not list (a knee-search step, an older campaign.json),
the cell's cell.json `config`, read once.
"""

from __future__ import annotations

import itertools
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvoffload.analysis.series import corrected
from kvoffload.contracts.layout import CampaignPaths, CellPaths

# The rates the page plots: name -> (numerator counter, denominator counter) of status.json points.
RATES = {
    "local_hit": ("local_hits", "local_queries"),
    "external_hit": ("external_hits", "external_queries"),
    "lmcache_l1_hit": ("lmcache_hit_l1", "lmcache_requested"),
    "lmcache_l2_hit": ("lmcache_hit_l2", "lmcache_requested"),
}
# Gauges plotted as they are: name -> (point key, scale).
GAUGES = {"kv_usage": ("kv_usage", 1.0), "l1_gb": ("l1_bytes", 1e-9), "l2_gb": ("l2_bytes", 1e-9)}
FINAL_STATES = ("done", "failed", "interrupted")
# A record file is read in pieces of this size, so that a large one never sits in memory whole.
READ_CHUNK = 1 << 22
# The cell values a label names only where the campaign has more than one of them.
VARIED = ("isl", "osl")


def cell_label(config: Mapping[str, Any], varied: Collection[str] = ()) -> str | None:
    """A person's name for a cell, from its config (cell.json `config`, campaign.json `cells`):
    `gpu c=16 r=5` (tier, concurrency, num_rounds), then `isl=...` and `osl=...` for those in `varied`,
    then `#2` for a repeat past the first. None when the config lacks one of the first three (the page
    then shows the id, which it shows beside the label anyway: the cell's folder is named by it)."""
    tier, concurrency, rounds = config.get("tier"), config.get("concurrency"), config.get("num_rounds")
    if not isinstance(tier, str) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in (concurrency, rounds)
    ):
        return None
    parts = [tier, f"c={concurrency}", f"r={rounds}"]
    parts += [f"{key}={config[key]}" for key in VARIED if key in varied and config.get(key) is not None]
    repeat = config.get("repeat")
    if isinstance(repeat, int) and repeat > 1:
        parts.append(f"#{repeat}")
    return " ".join(parts)


def varied_keys(spec: Mapping[str, Any] | None, configs: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """Of `VARIED`, those with more than one value: in the campaign's own lists (campaign.json
    `campaign`), or among the cells' configs (an older campaign.json without it, a knee-search step)."""
    configs = list(configs)
    out: set[str] = set()
    for key in VARIED:
        listed = spec.get(key) if isinstance(spec, Mapping) else None
        values = {str(v) for v in listed} if isinstance(listed, list) else set()
        if len(values) > 1 or len({str(c[key]) for c in configs if key in c}) > 1:
            out.add(key)
    return frozenset(out)


def _quantile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between order statistics, as the report's TTFT percentiles."""
    return float(np.quantile(np.asarray(values, dtype=float), q)) if values else None


@dataclass
class RecordTail:
    """One requests.jsonl read incrementally: later-round (round >= 2) TTFTs of ok requests, and
    the failed requests. A file that shrank or was replaced is read again from its start."""

    path: Path
    offset: int = 0
    inode: int | None = None
    partial: bytes = b""
    requests: int = 0
    failed: int = 0
    later_ttfts: list[float] = field(default_factory=list)

    def read(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        if st.st_ino != self.inode or st.st_size < self.offset:
            self.offset, self.inode, self.partial = 0, st.st_ino, b""
            self.requests, self.failed, self.later_ttfts = 0, 0, []
        if st.st_size == self.offset:
            return
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            while self.offset < st.st_size:
                chunk = handle.read(min(READ_CHUNK, st.st_size - self.offset))
                if not chunk:
                    break
                self.offset += len(chunk)
                lines = (self.partial + chunk).split(b"\n")
                self.partial = lines.pop()  # a line still being written
                for line in lines:
                    self._take(line)

    def _take(self, line: bytes) -> None:
        try:
            record = json.loads(line)
        except ValueError:
            return  # a damaged line: ingest reports it; the live page skips it
        if not isinstance(record, dict):
            return
        self.requests += 1
        if record.get("status") != "ok":
            self.failed += 1
        elif (
            isinstance(record.get("round"), int) and record["round"] >= 2 and record.get("ttft_s") is not None
        ):
            self.later_ttfts.append(float(record["ttft_s"]))

    def figures(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "failed": self.failed,
            "later_ttft_p50_s": _quantile(self.later_ttfts, 0.5),
            "later_ttft_p95_s": _quantile(self.later_ttfts, 0.95),
            "later_n": len(self.later_ttfts),
        }


def histogram_quantile(q: float, first: Mapping[str, float], last: Mapping[str, float]) -> float | None:
    """Prometheus `histogram_quantile` over the increase of cumulative buckets (`le` -> count) from
    `first` to `last`: linear inside the bucket that holds the q-th observation; the last finite
    bound when it falls in +Inf; None without observations."""
    bounds = sorted((float(le), last[le] - first.get(le, 0.0)) for le in last)
    if not bounds or bounds[-1][1] <= 0:
        return None
    rank = q * bounds[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in bounds:
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = bound, count
    return lower


def _increases(values: Sequence[float | None]) -> list[float | None]:
    """Increase of a counter from each point to the next, resets corrected; None where either is."""
    out: list[float | None] = []
    for a, b in itertools.pairwise(values):
        if a is None or b is None:
            out.append(None)
        else:
            out.append(float(np.diff(corrected(np.array([a, b], dtype=float)))[0]))
    return out


def live_series(points: Sequence[Mapping[str, Any]]) -> dict[str, list[list[float | None]]]:
    """`[t, value]` pairs per plotted figure: the hit rates between consecutive points (hits over
    queries of that step; None when it had no queries), and the gauges at each point."""
    out: dict[str, list[list[float | None]]] = {}
    times = [float(p["t"]) for p in points]
    for name, (num, den) in RATES.items():
        hits = _increases([p.get(num) for p in points])
        queries = _increases([p.get(den) for p in points])
        pairs: list[list[float | None]] = []
        for t, h, n in zip(times[1:], hits, queries, strict=True):
            pairs.append([t, h / n if h is not None and n else None])
        out[name] = pairs
    for name, (key, scale) in GAUGES.items():
        values = [None if p.get(key) is None else float(p[key]) * scale for p in points]
        out[name] = [[t, v] for t, v in zip(times, values, strict=True)]
    return out


def _latest(series: Sequence[Sequence[float | None]]) -> float | None:
    return next((v[1] for v in reversed(series) if v[1] is not None), None)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def plan_of(estimate: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What the ETA needs of the run's estimate, from status.json `estimate` (already in this shape:
    kvoffload/orchestrate/campaign/status.py) or campaign.json `estimate` (its cells' phases summed)."""
    if not isinstance(estimate, Mapping) or not isinstance(estimate.get("cells"), Mapping):
        return None
    cells = estimate["cells"]
    if all(isinstance(v, int | float) for v in cells.values()):
        return dict(estimate)
    priors, knee = estimate.get("priors"), estimate.get("knee_search")
    priors = priors if isinstance(priors, Mapping) else {}
    knee = knee if isinstance(knee, Mapping) else {}
    return {
        "total_s": estimate.get("total_s"),
        "start_s": priors.get("campaign_s"),
        "cells": {c: sum(float(v) for v in phases.values()) for c, phases in cells.items()},
        "replay": {c: phases.get("replay") for c, phases in cells.items()},
        "knee_s": knee.get("total_s"),
    }


@dataclass(frozen=True)
class Pace:
    """How the run goes against its plan: `planned` cell seconds (None: no plan), `factor` = what the
    finished planned cells took over what the plan gave them (1 before any), and `cell_s` the mean
    finished cell (for cells the plan does not list: knee-search steps; None before any)."""

    planned: Mapping[str, float] | None
    replay: Mapping[str, float | None]
    factor: float
    cell_s: float | None

    def cell(self, cell: str) -> float | None:
        """A cell's expected seconds at the run's pace."""
        if self.planned is not None and cell in self.planned:
            return self.factor * float(self.planned[cell])
        return self.cell_s


def pace_of(nodes: Mapping[str, Mapping[str, Any]], plan: Mapping[str, Any] | None) -> Pace:
    """The run's pace from the cells finished so far (status.json `done`) against the plan."""
    finished = [d for e in nodes.values() for d in (e.get("done") or [])]
    cells = plan.get("cells") if plan else None
    planned = {str(c): float(v) for c, v in cells.items()} if isinstance(cells, Mapping) else None
    factor = 1.0
    if planned is not None:
        pairs = [(float(d["seconds"]), planned[d["cell"]]) for d in finished if planned.get(d["cell"])]
        if pairs:
            factor = sum(a for a, _ in pairs) / sum(b for _, b in pairs)
    replay = plan.get("replay") if plan else None
    return Pace(
        planned,
        replay if isinstance(replay, Mapping) else {},
        factor,
        _mean([float(d["seconds"]) for d in finished]),
    )


def node_view(
    node: str,
    entry: Mapping[str, Any],
    now: float,
    pace: Pace,
    tails: Mapping[str, RecordTail],
) -> dict[str, Any]:
    """One node's row: its cell and phase (with the time in it), replay progress and ETA, live
    figures, queue, finished cells (with their records' figures once on the controller) and failures.
    The ETAs: each cell left at the plan's seconds scaled by the run's pace (`Pace`; a cell the plan
    does not list at the mean finished cell), less the time the running cell has had; a replay's from
    its own progress once a request finished, before that the plan's replay less its time so far."""
    replay = entry.get("replay")
    cell = entry.get("cell")
    progress = None
    if replay:
        done, expected = int(replay.get("done") or 0), int(replay.get("expected") or 0)
        elapsed = max(0.0, now - float(replay["since"]))
        eta = elapsed * (expected - done) / done if done and expected >= done else None
        planned = pace.replay.get(str(cell)) if cell else None
        if eta is None and not done and isinstance(planned, int | float):
            eta = max(0.0, pace.factor * float(planned) - elapsed)
        progress = {"done": done, "expected": expected, "elapsed_s": elapsed, "eta_s": eta}
    live = entry.get("live")
    live_view = None
    if live and live.get("cell") == entry.get("cell"):
        series = live_series(live.get("points") or [])
        first, last = live.get("ttft_first") or {}, live.get("ttft_last") or {}
        tail = tails.get(str(entry.get("cell")))
        records = tail.figures() if tail is not None and tail.requests else None
        live_view = {
            "series": series,
            "latest": {name: _latest(values) for name, values in series.items()},
            "ttft_p50_s": records["later_ttft_p50_s"] if records else histogram_quantile(0.5, first, last),
            "ttft_p95_s": records["later_ttft_p95_s"] if records else histogram_quantile(0.95, first, last),
            # the records reach the controller with the cell's collect; until then the replicas' own
            # histogram (every round, server side) is what the controller has
            "ttft_source": "requests.jsonl, rounds >= 2" if records else "replicas' histogram, all rounds",
            "failed_requests": records["failed"] if records else None,
        }
    in_cell = now - float(entry["cell_since"]) if cell and entry.get("cell_since") else 0.0
    queued = list(entry.get("queued") or [])
    left = [pace.cell(c) for c in queued]
    running = pace.cell(str(cell)) if cell else 0.0
    eta = None
    if running is not None and all(s is not None for s in left):
        eta = sum(float(s) for s in left if s is not None) + max(0.0, running - in_cell)
    return {
        "node": node,
        "cell": cell,
        "phase": entry.get("phase"),
        "in_phase_s": now - float(entry["since"]) if entry.get("since") else None,
        "in_cell_s": in_cell if cell else None,
        "queued": queued,
        "replay": progress,
        "live": live_view,
        "done": [{**d, **_figures(tails, d["cell"])} for d in entry.get("done") or []],
        "failed": [{**f, **_figures(tails, f["cell"])} for f in entry.get("failed") or []],
        "eta_s": eta,
    }


def _figures(tails: Mapping[str, RecordTail], cell: str) -> dict[str, Any]:
    tail = tails.get(cell)
    return tail.figures() if tail is not None and tail.requests else {}


def campaign_view(
    status: Mapping[str, Any],
    now: float,
    tails: Mapping[str, RecordTail],
    estimate: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole page's figures but the findings: the campaign's progress, elapsed time and ETA (the
    slowest node's, `node_view`; before the first cell starts, plus what is left of the run's planned
    start), and a row per node. The plan is status.json's `estimate`, else `estimate` (campaign.json's);
    the knee search's worst case is `knee_worst_s`, apart, while the campaign's own cells run."""
    nodes = status.get("nodes") or {}
    plan = plan_of(status.get("estimate")) or plan_of(estimate)
    pace = pace_of(nodes, plan)
    rows = [node_view(n, e, now, pace, tails) for n, e in sorted(nodes.items())]
    done = sum(len(r["done"]) for r in rows)
    failed = sum(len(r["failed"]) for r in rows)
    final = status.get("state") in FINAL_STATES
    end = float(status["finished_at"]) if final and status.get("finished_at") else now
    elapsed = end - float(status["started_at"])
    etas = [r["eta_s"] for r in rows if r["eta_s"] is not None]
    eta = max(etas) if etas and len(etas) == len(rows) else None
    started = any(r["cell"] or r["done"] or r["failed"] for r in rows)
    if eta is not None and not started and plan and isinstance(plan.get("start_s"), int | float):
        # provisioning and the rest of the run's start, before the first cell
        eta += max(0.0, pace.factor * float(plan["start_s"]) - elapsed)
    planned_left = plan is not None and any(r["queued"] or r["cell"] in pace.replay for r in rows)
    knee = plan.get("knee_s") if plan and planned_left else None
    return {
        "campaign": status.get("campaign"),
        "state": status.get("state"),
        "phase": status.get("phase"),
        "in_phase_s": now - float(status["phase_since"]) if status.get("phase_since") else None,
        "elapsed_s": elapsed,
        "eta_s": 0.0 if final else eta,
        "knee_worst_s": None if final else knee,
        "progress": {"done": done, "failed": failed, "total": int(status.get("total") or 0)},
        "skipped": list(status.get("skipped") or []),
        "estimate_s": plan.get("total_s") if plan else None,
        "updated_at": status.get("updated_at"),
        "nodes": rows,
    }


def _copy_done_cells(paths: CampaignPaths, cells: Sequence[str], dest: Path) -> Path:
    """campaign.json and the DONE cells' folders (what ingest reads) under `dest`, for the findings."""
    root = dest / paths.root.name
    (root / "cells").mkdir(parents=True)
    if paths.campaign_json.is_file():
        shutil.copy2(paths.campaign_json, root / "campaign.json")
    for cell in cells:
        shutil.copytree(
            paths.cell(cell).root, root / "cells" / cell, ignore=shutil.ignore_patterns("logs", "ansible")
        )
    return root


def default_findings(results_dir: Path) -> list[dict[str, Any]]:
    """The report's findings (`finding_groups`) as JSON-ready groups."""
    from kvoffload.report.build import finding_groups

    return [
        {"title": g.title, "comparable": g.comparable, "statements": list(g.statements)}
        for g in finding_groups(results_dir)
    ]


class LiveView:
    """The JSON endpoint's content, kept up to date by cheap incremental reads (`state`), and the
    findings, recomputed by `refresh_findings` (the server runs it in a thread of its own) when the set
    of DONE cells changed."""

    def __init__(
        self,
        results_dir: Path,
        findings: Callable[[Path], list[dict[str, Any]]] = default_findings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.paths = CampaignPaths(results_dir)
        self.findings_of = findings
        self.clock = clock
        self._lock = threading.Lock()
        self._status: dict[str, Any] = {}
        self._status_key: tuple[int, int] | None = None
        self._tails: dict[str, RecordTail] = {}
        self._findings: list[dict[str, Any]] = []
        self._findings_cells: tuple[str, ...] = ()
        self._findings_error: str | None = None
        self._campaign: dict[str, Any] = {}
        self._campaign_key: tuple[int, int] | None = None
        self._planned: dict[str, Mapping[str, Any]] = {}  # campaign.json `cells`: id -> config
        self._configs: dict[str, Mapping[str, Any]] = {}  # cell.json `config` of cells it does not list

    def _read_status(self) -> dict[str, Any]:
        path = self.paths.status_json
        try:
            st = path.stat()
        except FileNotFoundError:
            return {}
        key = (st.st_ino, st.st_mtime_ns)
        if key != self._status_key:
            try:
                self._status = json.loads(path.read_text())
            except (OSError, ValueError):
                return self._status  # replaced while read: the last good one
            self._status_key = key
        return self._status

    def _read_campaign(self) -> dict[str, Any]:
        """campaign.json, read again only when it changed; {} before the run wrote it."""
        path = self.paths.campaign_json
        try:
            st = path.stat()
            key = (st.st_ino, st.st_mtime_ns)
            if key != self._campaign_key:
                campaign = json.loads(path.read_text())
                self._campaign = campaign if isinstance(campaign, dict) else {}
                self._campaign_key = key
                cells = self._campaign.get("cells")
                self._planned = {
                    str(c["id"]): c
                    for c in (cells if isinstance(cells, list) else [])
                    if isinstance(c, dict) and "id" in c
                }
        except (OSError, ValueError):
            pass  # not written yet, or replaced while read: the last good one
        return self._campaign

    def _read_estimate(self) -> dict[str, Any] | None:
        """campaign.json `estimate` (what `plan` said of this run)."""
        estimate = self._read_campaign().get("estimate")
        return estimate if isinstance(estimate, dict) else None

    def _config(self, cell: str) -> Mapping[str, Any] | None:
        """The cell's config: campaign.json's, else its cell.json's (read once it is there: the cell
        has started); None while neither has it."""
        if cell in self._planned:
            return self._planned[cell]
        if cell not in self._configs:
            try:
                record = json.loads(self.paths.cell(cell).cell_json.read_text())
            except (OSError, ValueError):
                return None  # not started yet, or written by a run older than cell.json
            config = record.get("config") if isinstance(record, dict) else None
            if not isinstance(config, dict):
                return None
            self._configs[cell] = config
        return self._configs[cell]

    def _labels(self, cells: Iterable[str]) -> dict[str, str]:
        """`cell_label` of each of `cells` whose config is known (the page shows the others' ids)."""
        configs = {cell: self._config(cell) for cell in cells}
        known = [c for c in configs.values() if c is not None]
        varied = varied_keys(self._read_campaign().get("campaign"), [*self._planned.values(), *known])
        labels = {cell: cell_label(c, varied) if c is not None else None for cell, c in configs.items()}
        return {cell: label for cell, label in labels.items() if label is not None}

    def done_cells(self) -> tuple[str, ...]:
        return tuple(c.cell_id for c in self.paths.cells() if c.done.is_file())

    def _tail(self, cells: Sequence[str]) -> None:
        for cell in cells:
            tail = self._tails.setdefault(cell, RecordTail(CellPaths(self.paths.cell(cell).root).requests))
            tail.read()

    def state(self) -> dict[str, Any]:
        """What the page shows now (the JSON endpoint)."""
        with self._lock:
            status = self._read_status()
            nodes = status.get("nodes") or {}
            cells = {str(e["cell"]) for e in nodes.values() if e.get("cell")}
            for entry in nodes.values():
                cells.update(d["cell"] for d in (entry.get("done") or []) + (entry.get("failed") or []))
            self._tail(sorted(cells))
            queued = {str(c) for entry in nodes.values() for c in entry.get("queued") or []}
            estimate = self._read_estimate()
            empty: dict[str, Any] = {"state": None, "nodes": []}
            view = campaign_view(status, self.clock(), self._tails, estimate) if status else empty
            # id -> `cell_label`, for every cell the page names (an id it lacks: the page shows the id)
            view["labels"] = self._labels(sorted(cells | queued))
            view["findings"] = self._findings
            view["findings_cells"] = list(self._findings_cells)
            view["findings_error"] = self._findings_error
            report = self.paths.report_dir / "index.html"
            view["report"] = str(report) if report.is_file() else None
            view["results"] = str(self.paths.root)
            return view

    def refresh_findings(self) -> bool:
        """Compute the findings again when the DONE cells changed; whether it did."""
        cells = self.done_cells()
        if cells == self._findings_cells:
            return False
        try:
            with tempfile.TemporaryDirectory(prefix="kvoffload-watch-") as scratch:
                found = self.findings_of(_copy_done_cells(self.paths, cells, Path(scratch))) if cells else []
            error = None
        except Exception as exc:  # a cell the report cannot read yet: shown, tried again next change
            found, error = [], f"{type(exc).__name__}: {exc}"
        with self._lock:
            self._findings, self._findings_cells, self._findings_error = found, cells, error
        return True
