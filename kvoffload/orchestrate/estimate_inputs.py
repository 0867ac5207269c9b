"""What the campaign-time estimate (estimate.py) is computed from, read for one lab and results folder.

The schedule `run` will follow (schedule.py, and which cells restart their engines), the requests each
cell sends (the caller's count, from the dataset), the simulator's cost profile of a `sim` campaign,
and the earlier runs in the same results folder: every cell with DONE (its cell.json `timings`, its
sessions.json requests, concurrency and the replay's own time) and campaign.json's `timings.cells`.
Reads files; writes nothing. Used by `plan` (which prints it) and `run` (which keeps it in
campaign.json `estimate`, with what the cells measured once they ran, `measured_phases`, for the
report).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvoffload.config import Cell, LabConfig
from kvoffload.contracts.layout import CampaignPaths
from kvoffload.orchestrate.deployment import cold_start_methods
from kvoffload.orchestrate.estimate import (
    DEFAULT_VLLM_START_S,
    PHASES,
    RECORDED_OSL_TOKENS,
    CellWork,
    Estimate,
    Measured,
    Priors,
    estimate,
    learn,
    phase_seconds,
    profile_priors,
)
from kvoffload.orchestrate.schedule import schedule


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _lines(path: Path) -> int:
    try:
        with path.open("rb") as handle:
            return sum(1 for _ in handle)
    except OSError:
        return 0


def earlier_cells(paths: CampaignPaths) -> list[Measured]:
    """Every DONE cell of the folder with its timings, the requests it sent (sessions.json, else its
    records) and how many were in flight; unreadable ones are left out (the estimate is a guide, not a
    result)."""
    out = []
    for cell in paths.cells():
        if not cell.done.is_file():
            continue
        meta, counts = _json(cell.cell_json), _json(cell.sessions)
        if not isinstance(meta, dict) or not isinstance(meta.get("timings"), dict):
            continue
        counts = counts if isinstance(counts, dict) else {}
        config = meta.get("config") or {}
        requests = int(counts.get("requests") or 0) or _lines(cell.requests)  # older files lack it
        in_flight = min(int(config.get("concurrency") or 1), int(counts.get("achieved_sessions") or 1) or 1)
        own = counts.get("duration_s")
        own_s = float(own) if isinstance(own, int | float) and own > 0 else None
        out.append(Measured(meta["timings"], requests, in_flight, own_s))
    return out


def earlier_starts(paths: CampaignPaths) -> list[float]:
    """How long the folder's last run took before its cells (hosts' Python, wheelhouse, preflight,
    provision, doctor): its wall time (campaign.json `timings.cells`) less its slowest node's cells
    (the DONE cells' `timings.total` summed per node); none before a first run."""
    campaign = _json(paths.campaign_json)
    timings = campaign.get("timings") if isinstance(campaign, dict) else None
    wall = timings.get("cells") if isinstance(timings, dict) else None
    if not isinstance(wall, int | float):
        return []
    nodes: dict[str, float] = {}
    for cell in paths.cells():
        meta = _json(cell.cell_json) if cell.done.is_file() else None
        if isinstance(meta, dict) and isinstance(meta.get("timings"), dict):
            node = str(meta.get("node"))
            nodes[node] = nodes.get(node, 0.0) + float(meta["timings"].get("total") or 0.0)
    start = float(wall) - max(nodes.values(), default=0.0)
    return [start] if start > 0 else []


def base_priors(lab: LabConfig) -> Priors:
    """The simulator's cost profile for a `sim` campaign; the defaults otherwise (a real vLLM's engine
    start at DEFAULT_VLLM_START_S). A round's prompt is
    taken as half the campaign's largest isl (a conversation growing to it), its answer as the
    largest fixed osl (256 tokens when the campaign replays the recorded ones)."""
    campaign = lab.campaign
    if campaign.engine != "sim" or not campaign.sim_profile:
        sources = {**Priors().sources, "engine_start_s": "default (real vLLM)"}
        return Priors(engine_start_s=DEFAULT_VLLM_START_S, sources=sources)
    from kvoffload.sim.profile import load_profile

    profile = load_profile(campaign.sim_profile)
    prompt = max(campaign.isl) / 2
    fixed = [o for o in campaign.osl if isinstance(o, int)]
    osl = max(fixed) if fixed else RECORDED_OSL_TOKENS
    return profile_priors(
        profile.name,
        startup_s=profile.startup.total_s,
        cold_prefill_s=profile.prefill.cumulative_s(prompt),
        decode_step_s=profile.decode_step_s(1, int(prompt)),
        osl_tokens=osl,
    )


def campaign_estimate(
    lab: LabConfig, todo: Sequence[Cell], results: Path, requests: Callable[[Cell], int] | None
) -> Estimate:
    """How long `run` will take for `todo`, learning from `results` (the campaign's folder).
    `requests`: what each cell sends (None: unknown, its replay counts 0)."""
    paths = CampaignPaths(results)
    priors = learn(earlier_cells(paths), base_priors(lab), earlier_starts(paths))
    work = []
    for plan in schedule(todo, [n.name for n in lab.nodes], requests):
        for i, (cell, how) in enumerate(
            zip(plan.cells, cold_start_methods(lab, plan.cells, plan.node), strict=True)
        ):
            sent = requests(cell) if requests else 0
            users = sent // cell.num_rounds if cell.num_rounds else 0
            work.append(
                CellWork(
                    cell.id,
                    plan.node,
                    requests=sent,
                    in_flight=max(1, min(cell.concurrency, users)),
                    starts_engines=how == "restart",
                    installs=i == 0,
                )
            )
    return estimate(work, priors)


def measured_phases(paths: CampaignPaths, cells: Sequence[str], wall_s: float) -> dict[str, Any]:
    """What `cells` measured, grouped as the estimate's phases and summed (cell.json `timings`, the
    replay split at sessions.json `duration_s`; a cell without timings counts nothing), and the run's
    wall time: campaign.json `estimate.measured`."""
    sums = dict.fromkeys(PHASES, 0.0)
    for cell in cells:
        meta = _json(paths.cell(cell).cell_json)
        counts = _json(paths.cell(cell).sessions)
        timings = meta.get("timings") if isinstance(meta, dict) else None
        own = counts.get("duration_s") if isinstance(counts, dict) else None
        if isinstance(timings, dict):
            split = phase_seconds(timings, float(own) if isinstance(own, int | float) and own > 0 else None)
            for phase, seconds in split.items():
                sums[phase] += seconds
    return {"phases": {p: round(v, 3) for p, v in sums.items()}, "total_s": round(wall_s, 3)}
