"""Faults of a cell: servers that stopped answering during its replay, units that restarted or died.

A replica or the lmcache-server that fails mid-replay does not stop the cell: the replay runs to its
end and counts the requests that failed. But the cell's figures are then not those of the deployment
it names, so the cell is marked with each fault (what, when, why) and is not valid for comparison.
Two sources, because each misses what the other sees:
- `TargetWatch` (during the replay): each vLLM replica's and the lmcache-server's metrics endpoint is
  polled every second from the controller; an endpoint that stops answering opens an outage, one that
  answers again closes it. A killed replica that systemd restarts within seconds shows up here.
- the units' states, collected after the replay (`units/*.json`): NRestarts and an inactive engine
  unit, which say what systemd saw even when no poll fell into a short outage.
`fault_effects` then reads the requests the replay recorded to say what the engines did from the
first fault on (requests served, requests failed and why, per replica).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from math import inf
from pathlib import Path
from typing import Any

import httpx


@dataclass(frozen=True)
class Fault:
    """One fault of a cell. `at`/`until` are wall-clock seconds (None when only systemd saw it); the
    fault began between `answered` (the last poll the target answered, if any) and `at`."""

    target: str
    kind: str  # "unreachable" | "restarted" | "not running"
    detail: str
    at: float | None = None
    until: float | None = None
    answered: float | None = None

    def reason(self) -> str:
        when = ""
        if self.at is not None:
            when = " at " + time.strftime("%H:%M:%S", time.localtime(self.at))
            if self.until is not None:
                when += f" for {self.until - self.at:.1f} s"
            else:
                when += " until the replay ended"
        return f"{self.target} {self.kind}{when}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "reason": self.reason()}


def _answers(client: httpx.Client, url: str) -> str | None:
    """None when the endpoint answered 200, else what went wrong."""
    try:
        resp = client.get(url)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"[:200]
    return None if resp.status_code == 200 else f"HTTP {resp.status_code}"


class TargetWatch:
    """Polls endpoints in a thread and keeps the outages it saw (a use-once context manager)."""

    def __init__(
        self, targets: Sequence[Mapping[str, str]], interval_s: float = 1.0, timeout_s: float = 2.0
    ) -> None:
        self.targets = {
            t["name"]: t["url"] for t in targets if t["name"].startswith("vllm") or t["name"] == "lmcache"
        }
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._open: dict[str, tuple[float, str, float | None]] = {}
        self._answered: dict[str, float] = {}
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="target-watch", daemon=True)

    def poll_once(self, client: httpx.Client) -> None:
        for name, url in self.targets.items():
            error = _answers(client, url)
            now = time.time()
            with self._lock:
                if self._stop.is_set():
                    return  # watching ended while this poll waited for an answer: not the watch's to judge
                if error is not None and name not in self._open:
                    self._open[name] = (now, error, self._answered.get(name))
                elif error is None:
                    if name in self._open:
                        since, first_error, answered = self._open.pop(name)
                        self._faults.append(Fault(name, "unreachable", first_error, since, now, answered))
                    self._answered[name] = now

    def _loop(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            while not self._stop.wait(self.interval_s):
                self.poll_once(client)

    def faults(self) -> list[Fault]:
        """Closed outages, then those still open (their `until` is None)."""
        with self._lock:
            still_open = [
                Fault(n, "unreachable", e, since, None, answered)
                for n, (since, e, answered) in self._open.items()
            ]
            return sorted(self._faults + still_open, key=lambda f: (f.at or 0.0, f.target))

    def stop(self) -> None:
        """Stop watching now (what follows is a planned stop of the targets, such as a teardown): no poll
        records anything after this; an outage already open stays open."""
        self._stop.set()

    def __enter__(self) -> TargetWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s * max(1, len(self.targets)) + 5)


def unit_faults(
    units: Mapping[str, Mapping[str, Any]],
    expected: Collection[str],
    baseline: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Fault]:
    """Restarted or stopped units among `expected` (`<host>--<unit>` keys, the cell's engine units),
    from the collect role's `systemctl show` records; an expected unit with no record is a fault too.

    `baseline`: the states collected after the previous cell when its engines kept running into this
    one (cold_start: reset); restarts are counted from there, not from the unit's start."""
    faults: list[Fault] = []
    for key in sorted(expected):
        host, unit = key.split("--", 1)
        target = f"{unit} on {host}"
        state = units.get(key)
        if state is None:
            faults.append(Fault(target, "not running", "no state was collected for it"))
            continue
        before = (baseline or {}).get(key) or {}
        restarts = int(state.get("NRestarts") or 0) - int(before.get("NRestarts") or 0)
        if restarts > 0:
            faults.append(Fault(target, "restarted", f"systemd restarted it {restarts} time(s)"))
        if state.get("ActiveState") != "active":
            faults.append(
                Fault(
                    target,
                    "not running",
                    f"{state.get('ActiveState')}/{state.get('SubState')} after the replay, "
                    f"result {state.get('Result')}, main process status {state.get('ExecMainStatus')}",
                )
            )
    return faults


def fault_effects(requests_jsonl: Path, faults: Sequence[Fault]) -> dict[str, Any] | None:
    """What the engines did from the first timed fault on (from the last poll that still answered, since
    the fault came after it): requests served and failed, per replica."""
    starts = [min(f.at, f.answered or f.at) for f in faults if f.at is not None]
    if not starts or not requests_jsonl.is_file():
        return None
    first = min(starts)
    ok: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    with requests_jsonl.open(encoding="utf-8") as handle:
        for line in handle:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            latency = rec.get("latency_s")
            end = float(rec.get("t_start") or 0.0) + (float(latency) if latency is not None else inf)
            if end < first:
                continue  # ended before the fault
            replica = str(rec.get("replica") or "none")
            if rec.get("status") == "ok":
                ok[replica] += 1
            else:
                failed[replica] += 1
                errors[str(rec.get("error") or rec.get("status"))[:160]] += 1
    return {
        "since": first,
        "requests_ok": dict(ok),
        "requests_failed": dict(failed),
        "errors": [{"error": e, "count": n} for e, n in errors.most_common(5)],
    }
