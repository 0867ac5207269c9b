"""Where a campaign's wall time goes: each cell's phases and its overhead (everything but the replay).

Reads the `timings` every cell.json records (deploy, cold-check or reset, replay, collect, teardown)
and the task durations in the teardown playbooks' ansible-runner events, and prints per cell and in
total: each phase's seconds, the overhead and its share of the cell's time, and the campaign's wall
time from its first cell's start to its last cell's end. The overhead is counted twice: outside the
replay phase (the replay playbook: snapshots, sampler, replay, fetch) and, stricter, outside the
replay's own run (sessions.json `duration_s`, first request to last answer), which also counts the
replay playbook's other tasks and the replay process's start as overhead. Give several campaign
folders (for example the demo with cold_start: reset and with restart, or on one node and on two)
to compare them; the last line then gives each one's wall time as a ratio of the first's.

    python bench/campaign_overhead.py results/demo [results/demo-restart ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

# The plays of teardown.yml, which replay.yml also runs at its end (kvoffload_teardown_after).
TEARDOWN_PLAYS = frozenset(
    play["name"]
    for play in yaml.safe_load((Path(__file__).parents[1] / "playbooks" / "teardown.yml").read_text())
)

PHASES = (
    "install",
    "teardown-before",
    "deploy",
    "cold-check",
    "reset",
    "wait-client",
    "replay",
    "collect",
    "teardown",
)
# Once per node and run, not per cell (the first cell of a node carries it): left out of a cell's
# overhead, shown on their own with the campaign's other once-only phases. wait-client: a node's first
# replay waiting for the client's install, which runs while the nodes start their first engines.
NODE_PHASES = ("install", "wait-client")


def cells(campaign: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted((campaign / "cells").glob("*/cell.json")):
        record = json.loads(path.read_text())
        try:
            sessions = json.loads((path.parent / "sessions.json").read_text())
            record["_replay_own"] = float(sessions["duration_s"])
        except (OSError, ValueError, KeyError, TypeError):
            record["_replay_own"] = None
        records.append(record)
    return sorted(records, key=lambda r: r.get("started_at") or 0)


def teardown_task_results(campaign: Path) -> list[tuple[float, str, str]]:
    """(seconds, task, host) of every teardown task of the campaign, slowest first: those of its
    teardown.yml runs, and those of the teardown plays that end a replay.yml run (a cell that no next
    cell keeps the engines for is torn down there)."""
    out = []
    for events in (campaign / "ansible" / "artifacts").glob("*/job_events"):
        whole = events.parent.name.endswith("-teardown")
        out += [(s, t, h) for s, t, h, play in task_results_in(events) if whole or play in TEARDOWN_PLAYS]
    return sorted(out, reverse=True)


def slowest_tasks(campaign: Path, top: int = 15) -> None:
    """The tasks that cost the most summed over every playbook run of the campaign (the overhead's
    ingredients; the replay task itself is the measurement)."""
    totals: dict[tuple[str, str], list[float]] = {}
    for events in (campaign / "ansible" / "artifacts").glob("*/job_events"):
        playbook = events.parent.name.rsplit("-", 1)[-1]
        for seconds, task, _host, _play in task_results_in(events):
            totals.setdefault((playbook, task), []).append(seconds)
    if not totals:
        return
    print(f"tasks with the most seconds summed over the campaign (top {top}):")
    ranked = sorted(totals.items(), key=lambda kv: -sum(kv[1]))[:top]
    for (playbook, task), values in ranked:
        print(f"  {sum(values):7.1f} s  {len(values):4d}x  {playbook:9} {task[:70]}")


def task_results_in(events: Path) -> list[tuple[float, str, str, str]]:
    """(seconds, task, host, play) of the task results in one ansible-runner job_events folder."""
    out = []
    for path in events.glob("*.json"):
        try:
            event = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        data = event.get("event_data") or {}
        if event.get("event") in ("runner_on_ok", "runner_on_failed") and "duration" in data:
            out.append(
                (float(data["duration"]), str(data.get("task")), str(data.get("host")), str(data.get("play")))
            )
    return out


def report(campaign: Path) -> dict[str, float]:
    records = cells(campaign)
    if not records:
        print(f"{campaign}: no cells", file=sys.stderr)
        return {}
    print(f"\n== {campaign} ({len(records)} cells)")
    header = f"{'cell':10} {'tier':5} {'node':10} {'start':8}" + "".join(f"{p[:10]:>11}" for p in PHASES)
    print(header + f"{'total':>9}{'overhead':>10}{'share':>7}{'own':>7}{'strict':>8}")
    overheads, strict = [], []
    for r in records:
        t = r.get("timings") or {}
        total = float(t.get("total") or 0.0)
        over = total - float(t.get("replay") or 0.0) - sum(float(t.get(p) or 0.0) for p in NODE_PHASES)
        overheads.append(over)
        own = r["_replay_own"]
        strict_over = over + float(t.get("replay") or 0.0) - own if own is not None else None
        if strict_over is not None:
            strict.append(strict_over)
        method = (r.get("cold_start") or {}).get("method", "-")
        row = f"{r['cell_id']:10} {r['config']['tier']:5} {str(r.get('node', '-'))[:10]:10} {method:8}"
        row += "".join(f"{t[p]:>11.1f}" if p in t else f"{'-':>11}" for p in PHASES)
        if total:
            row += f"{total:>9.1f}{over:>10.1f}{over / total:>7.0%}"
            row += f"{own:>7.1f}{strict_over:>8.1f}" if own is not None and strict_over is not None else ""
        print(row)
    once = json.loads((campaign / "campaign.json").read_text()).get("timings") or {}
    once |= {
        f"{p} ({r.get('node')})": float(r["timings"][p])
        for r in records
        for p in NODE_PHASES
        if p in (r.get("timings") or {})
    }
    if once:
        print(
            "once per run or node: "
            + ", ".join(f"{k} {float(v):.1f} s" for k, v in once.items() if k != "cells")
        )
    wall = max(r.get("finished_at") or 0 for r in records) - min(r.get("started_at") or 0 for r in records)
    replay = sum(float((r.get("timings") or {}).get("replay") or 0) for r in records)
    busy = sum(float((r.get("timings") or {}).get("total") or 0) for r in records)
    print(
        f"wall {wall:.0f} s (cells back to back or in parallel); cell time {busy:.0f} s, of which replay "
        f"{replay:.0f} s; overhead per cell (not counting the install): "
        f"median {statistics.median(overheads):.1f} s, "
        f"max {max(overheads):.1f} s; outside replays: {1 - replay / busy:.0%} of cell time"
    )
    owns = [r["_replay_own"] for r in records if r["_replay_own"] is not None]
    if strict:
        print(
            f"strict (outside the replays' own {sum(owns):.0f} s, sessions.json duration_s): overhead per "
            f"cell median {statistics.median(strict):.1f} s, max {max(strict):.1f} s; outside the replays' "
            f"own time: {1 - sum(owns) / busy:.0%} of cell time"
        )
    run_s = float(once.get("cells") or 0.0)
    print(wall_shares(records, run_s))
    tasks = teardown_task_results(campaign)
    if tasks:
        seconds, task, host = tasks[0]
        print(f"slowest teardown task: {seconds:.1f} s ({task} on {host}); {len(tasks)} task results")
    slowest_tasks(campaign)
    return {
        "wall": wall,
        "median_overhead": statistics.median(overheads),
        "median_strict": statistics.median(strict) if strict else float("nan"),
    }


def wall_shares(records: list[dict[str, Any]], run_s: float) -> str:
    """The share of wall time outside replays, as the issue's targets state it. A node's wall time runs
    from its first cell's start to its last cell's end (its install included); `run_s` is the whole
    `run` (campaign.json timings `cells`: provision, the client's install, every node, the unmasking).
    With several nodes the replays are set against the nodes' summed wall time (node-seconds)."""
    nodes: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        nodes.setdefault(str(r.get("node", "-")), []).append(r)
    node_wall = {
        node: max(r.get("finished_at") or 0 for r in rs) - min(r.get("started_at") or 0 for r in rs)
        for node, rs in nodes.items()
    }
    own = [r["_replay_own"] for r in records if r["_replay_own"] is not None]
    phase = sum(float((r.get("timings") or {}).get("replay") or 0) for r in records)
    walls = sum(node_wall.values())
    # a node's install (software and model, once per node and run) is the first cell's: shown apart too
    installs = sum(float((r.get("timings") or {}).get("install") or 0) for r in records)
    line = (
        f"share of wall time outside replays ({len(nodes)} node(s), {walls:.0f} node-s): "
        f"{1 - phase / walls:.1%} outside replay phases, "
        f"{1 - sum(own) / walls:.1%} outside the replays' own time; "
        f"without the nodes' installs ({installs:.0f} s): {1 - phase / (walls - installs):.1%}"
    )
    if run_s:
        whole = run_s * len(nodes)
        line += (
            f"; over the whole run ({run_s:.0f} s, from provision to the last unmasking): "
            f"{1 - phase / whole:.1%} / {1 - sum(own) / whole:.1%}"
        )
    return line


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("campaigns", nargs="+", type=Path, help="results/<campaign> folders")
    args = parser.parse_args()
    figures = [report(c) for c in args.campaigns]
    if len(figures) > 1 and figures[0].get("wall"):
        ratios = ", ".join(
            f"{c.name}: {f['wall'] / figures[0]['wall']:.2f}x"
            for c, f in zip(args.campaigns, figures, strict=True)
            if f
        )
        print(f"\nwall time against {args.campaigns[0].name}: {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
