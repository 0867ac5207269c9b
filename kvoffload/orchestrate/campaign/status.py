"""The run's status file, `<campaign>/status.json`: where each node is, for the live page.

`CampaignRunner` owns one `StatusBoard` and tells it every move (the campaign's own phases, each
cell's phases, replay progress, the engines' live counters, a cell's end); the board is the file's
only writer and writes it whole (kvoffload/atomic.py), so a reader (`kvoffload-lab watch`) never sees
half of it. Phase changes are written at once, and so are a replay's first and last finished request;
the counts between and the live counters at most every `min_interval_s`, so that a replay's 2 s polls
cost the controller one small file write now and then.
A write that fails (a full disk) is logged once and never fails the run: the file is a view, not a
result. Schema in docs/contracts.md ("Status file"). No network, no reading of other files.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvoffload.atomic import write_text_atomic

log = logging.getLogger(__name__)
STATUS_SCHEMA = 1
# Live points kept per running cell: an hour of 15 s points; older ones drop off the front.
MAX_POINTS = 240


def planned(estimate: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The part of the run's estimate the live page's ETA needs: the run's start and total, each cell's
    seconds and its replay's, and the knee search's worst case (not in the total)."""
    if not estimate or not isinstance(estimate.get("cells"), Mapping):
        return None
    cells: Mapping[str, Mapping[str, float]] = estimate["cells"]
    knee = estimate.get("knee_search")
    priors = estimate.get("priors")
    return {
        "total_s": estimate.get("total_s"),
        "start_s": priors.get("campaign_s") if isinstance(priors, Mapping) else None,
        "cells": {c: round(sum(phases.values()), 3) for c, phases in cells.items()},
        "replay": {c: phases.get("replay") for c, phases in cells.items()},
        "knee_s": knee.get("total_s") if isinstance(knee, Mapping) else None,
    }


class StatusBoard:
    """Per node: the running cell, its phase and since when, its queue, what finished and failed."""

    def __init__(
        self,
        path: Path,
        campaign: str,
        *,
        sample_interval_s: float = 15.0,
        min_interval_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.sample_interval_s = sample_interval_s
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._written = float("-inf")
        self._warned = False
        now = clock()
        self.data: dict[str, Any] = {
            "schema": STATUS_SCHEMA,
            "campaign": campaign,
            "state": "starting",
            "started_at": now,
            "updated_at": now,
            "finished_at": None,
            "phase": "starting",
            "phase_since": now,
            "total": 0,
            "skipped": [],
            "nodes": {},
            "estimate": None,
        }

    # -- what the runner tells it ------------------------------------------------------------------
    def start(
        self,
        queues: Mapping[str, Sequence[str]],
        skipped: Sequence[str],
        estimate: Mapping[str, Any] | None = None,
    ) -> None:
        """The run's plan: each node's cells in order (all queued), the cells already done, and what
        `plan` estimates for it (campaign.json `estimate`, kvoffload/orchestrate/campaign/estimate.py), so
        that
        the live page shows an ETA from the start, before the run's own pace is known."""
        with self._lock:
            self.data["state"] = "running"
            self.data["skipped"] = list(skipped)
            self.data["total"] = sum(len(q) for q in queues.values())
            for node, cells in queues.items():
                self._node(node)["queued"] = list(cells)
            self.data["estimate"] = planned(estimate)
            self._write()

    def campaign_phase(self, phase: str | None) -> None:
        """A phase of the whole run (wheelhouse, preflight, provision, ...); None: the cells run."""
        with self._lock:
            self.data["phase"] = phase
            self.data["phase_since"] = self.clock()
            self._write()

    def phase(self, node: str, cell_id: str, phase: str) -> None:
        """`cell_id` enters `phase` on `node` (its first phase takes it off the queue)."""
        with self._lock:
            entry = self._node(node)
            now = self.clock()
            if entry["cell"] != cell_id:
                entry["cell"] = cell_id
                entry["cell_since"] = now
                entry["replay"] = None
                entry["live"] = None
                if cell_id in entry["queued"]:
                    entry["queued"].remove(cell_id)
                else:  # a cell no plan listed (a knee-search step)
                    self.data["total"] += 1
            entry["phase"] = phase
            entry["since"] = now
            self.data["phase"] = None
            self._write()

    def node_phase(self, node: str, phase: str) -> None:
        """A phase of `node` between cells (giving its disk jobs back, `finished` after its last)."""
        with self._lock:
            self._node(node).update(cell=None, phase=phase, since=self.clock(), replay=None, live=None)
            self._write()

    def replay(self, node: str, done: int, expected: int) -> None:
        """Requests finished so far in the node's running replay (of `expected`; 0: unknown)."""
        with self._lock:
            entry = self._node(node)
            replay = entry.get("replay") or {"since": self.clock()}
            # the first request done and the last are written at once; the counts between, throttled
            landmark = (done > 0 and not replay.get("done")) or (expected > 0 and done >= expected)
            changed = replay.get("done") != done
            replay.update(done=done, expected=expected)
            entry["replay"] = replay
            self._write(throttled=not (landmark and changed))

    def live(self, node: str, counters: Mapping[str, float | None], ttft: Mapping[str, float]) -> None:
        """The engines' counters now (summed over the node's replicas) and their TTFT histogram
        (cumulative count per upper bound). A point is kept every `sample_interval_s`, and the
        latest; the histogram as first and latest seen, whose difference is the replay's."""
        with self._lock:
            entry = self._node(node)
            now = self.clock()
            live = entry.get("live") or {"cell": entry["cell"], "points": [], "ttft_first": dict(ttft)}
            points: list[dict[str, Any]] = live["points"]
            # the newest poll is always the last point; it stays only once it is `sample_interval_s`
            # after the point before it (so a replay shorter than that still shows a rate)
            if live.get("latest_only"):
                points.pop()
            live["latest_only"] = bool(points) and now - points[-1]["t"] < self.sample_interval_s
            points.append({"t": now, **counters})
            del points[:-MAX_POINTS]
            if not live["ttft_first"]:
                live["ttft_first"] = dict(ttft)
            live["ttft_last"] = dict(ttft)
            entry["live"] = live
            self._write(throttled=True)

    def cell_done(self, node: str, cell_id: str, status: str, error: str | None, seconds: float) -> None:
        """The cell ended: `status` done, failed or interrupted (with `error` saying why)."""
        with self._lock:
            entry = self._node(node)
            item = {"cell": cell_id, "seconds": round(seconds, 3), "at": self.clock()}
            if status == "done":
                entry["done"].append(item)
            else:
                entry["failed"].append({**item, "status": status, "why": error or status})
            if entry["cell"] == cell_id:
                entry.update(cell=None, phase=None, since=self.clock(), replay=None)
            self._write()

    def finish(self, state: str) -> None:
        """The run is over: `done`, `failed` (some cell failed) or `interrupted`."""
        with self._lock:
            now = self.clock()
            self.data.update(state=state, finished_at=now, phase=None, phase_since=now)
            for entry in self.data["nodes"].values():
                if entry["cell"] is not None and state == "interrupted":
                    entry["phase"] = "interrupted"
            self._write()

    # -- the file -----------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """A copy of what the file holds now."""
        with self._lock:
            copied: dict[str, Any] = json.loads(json.dumps(self.data))
            return copied

    def _node(self, node: str) -> dict[str, Any]:
        nodes: dict[str, dict[str, Any]] = self.data["nodes"]
        if node not in nodes:
            nodes[node] = {
                "cell": None,
                "cell_since": None,
                "phase": None,
                "since": None,
                "queued": [],
                "done": [],
                "failed": [],
                "replay": None,
                "live": None,
            }
        return nodes[node]

    def _write(self, throttled: bool = False) -> None:
        now = self.clock()
        if throttled and now - self._written < self.min_interval_s:
            return
        self.data["updated_at"] = now
        try:
            write_text_atomic(self.path, json.dumps(self.data, sort_keys=True) + "\n")
        except OSError as exc:
            if not self._warned:
                log.warning("cannot write %s (the live page shows an older state): %s", self.path, exc)
                self._warned = True
            return
        self._written = now
