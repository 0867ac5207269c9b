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

import bisect
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvoffload.config import Cell, LabConfig
from kvoffload.config.cells import make_cell
from kvoffload.contracts.layout import CampaignPaths
from kvoffload.orchestrate.campaign.estimate import (
    DEFAULT_VLLM_START_S,
    PHASES,
    RECORDED_OSL_TOKENS,
    CellWork,
    Estimate,
    KneeRamp,
    Measured,
    Priors,
    estimate,
    learn,
    phase_seconds,
    profile_priors,
)
from kvoffload.orchestrate.campaign.replay_model import ReplayModel
from kvoffload.orchestrate.campaign.schedule import schedule
from kvoffload.orchestrate.cell.deployment import cold_start_methods

if TYPE_CHECKING:
    from kvoffload.datasets import VirtualUser
    from kvoffload.sim.profile import CostProfile


# Concurrencies of a ramp whose replay is played (estimate.py's knee search); the rest interpolated.
KNEE_ANCHORS = 24


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


def earlier_cells(
    paths: CampaignPaths, modelled: Callable[[Mapping[str, Any], str | None], float | None] | None = None
) -> list[Measured]:
    """Every DONE cell of the folder with its timings, the requests it sent (sessions.json, else its
    records), how many were in flight and, with `modelled`, what the replay model says of a cell of
    its configuration (cell.json `config`) on its node; unreadable ones are left out (the estimate is
    a guide, not a result)."""
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
        node = str(meta["node"]) if meta.get("node") else None
        model_s = modelled(config, node) if modelled is not None and isinstance(config, dict) else None
        out.append(Measured(meta["timings"], requests, in_flight, own_s, model_s))
    return out


def _knee_cells(campaign: Any) -> set[str]:
    """The cells of campaign.json `knee_search` (the steps its ramps ran)."""
    ramps = campaign.get("knee_search") if isinstance(campaign, dict) else None
    return {
        str(step["cell_id"])
        for ramp in (ramps if isinstance(ramps, list) else [])
        if isinstance(ramp, dict)
        for step in ramp.get("steps") or []
        if isinstance(step, dict) and step.get("cell_id")
    }


def earlier_starts(paths: CampaignPaths) -> list[float]:
    """How long the folder's last run took before its cells (hosts' Python, wheelhouse, preflight,
    provision, doctor): its wall time (campaign.json `timings.cells`) less its knee search
    (`timings.knee-search`, which ran after the cells) and its slowest node's campaign cells (the DONE
    cells' `timings.total` summed per node, the knee search's steps left out); none before a first
    run."""
    campaign = _json(paths.campaign_json)
    timings = campaign.get("timings") if isinstance(campaign, dict) else None
    wall = timings.get("cells") if isinstance(timings, dict) else None
    if not isinstance(wall, int | float):
        return []
    assert isinstance(timings, dict)
    knee_s = timings.get("knee-search")
    knee_cells = _knee_cells(campaign)
    nodes: dict[str, float] = {}
    for cell in paths.cells():
        meta = _json(cell.cell_json) if cell.done.is_file() and cell.cell_id not in knee_cells else None
        if isinstance(meta, dict) and isinstance(meta.get("timings"), dict):
            node = str(meta.get("node"))
            nodes[node] = nodes.get(node, 0.0) + float(meta["timings"].get("total") or 0.0)
    knee = float(knee_s) if isinstance(knee_s, int | float) else 0.0
    start = float(wall) - knee - max(nodes.values(), default=0.0)
    return [start] if start > 0 else []


def base_priors(lab: LabConfig) -> Priors:
    """The simulator's cost profile for a `sim` campaign; the defaults otherwise (a real vLLM's engine
    start at DEFAULT_VLLM_START_S). The request `plan` shows (a request alone, cold): a prompt of half
    the campaign's largest isl (a conversation growing to it), its answer the largest fixed osl (256
    tokens when the campaign replays the recorded ones)."""
    campaign = lab.campaign
    if campaign.engine != "sim" or not campaign.sim_profile:
        sources = {**Priors().sources, "engine_start_s": "default (real vLLM)"}
        return Priors(engine_start_s=DEFAULT_VLLM_START_S, sources=sources)
    profile = _profile(lab)
    assert profile is not None
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


def _profile(lab: LabConfig) -> CostProfile | None:
    """The simulator's cost profile of a `sim` campaign (None otherwise)."""
    campaign = lab.campaign
    if campaign.engine != "sim" or not campaign.sim_profile:
        return None
    from kvoffload.sim.profile import load_profile

    return load_profile(campaign.sim_profile)


def replay_model(lab: LabConfig, users: Callable[[Cell], Sequence[VirtualUser]]) -> ReplayModel:
    """The lab's replay model (replay_model.py): tokens counted as `run` counts them (the model folder's
    tokenizer, the Hugging Face cache's for a hub id, else the approximate fallback)."""
    from kvoffload.tokenizer import load_tokenizer

    folder = lab.model_folder
    tokenizer = load_tokenizer(str(folder) if folder is not None else lab.campaign.model)
    return ReplayModel(lab, users, tokenizer, base_priors(lab).request_s, _profile(lab))


def _modelled(lab: LabConfig, model: ReplayModel) -> Callable[[Mapping[str, Any], str | None], float | None]:
    """What the replay model says of an earlier cell, from its cell.json `config` and node."""

    def modelled(config: Mapping[str, Any], node: str | None) -> float | None:
        try:
            cell = make_cell(
                lab.campaign,
                config["tier"],
                int(config["concurrency"]),
                int(config["num_rounds"]),
                int(config["isl"]),
                config["osl"],
                int(config.get("repeat") or 1),
            )
            return model.seconds(cell, node or lab.nodes[0].name)
        except (KeyError, TypeError, ValueError):
            return None

    return modelled


def knee_ramps(lab: LabConfig, model: ReplayModel, where: Mapping[str, str]) -> list[KneeRamp]:
    """The campaign's knee search as the estimate sees it: per ramp (kvoffload/orchestrate/campaign/knee.py),
    its node (the one the schedule gives the seed's sweep at its largest concurrency) and every path
    it can take up to the load the campaign can produce (`knee_search.max_concurrency`, `max_sessions`
    and the users the cells replay), each step with its modelled replay."""
    from kvoffload.analysis.ramp import ramp_paths
    from kvoffload.orchestrate.campaign import knee

    spec = lab.campaign.knee_spec()
    if spec is None:
        return []
    rule = knee.policy(spec, lab.campaign)
    out = []
    for seed in knee.ramps(lab.cells):
        sweep = [
            c
            for c in lab.cells
            if (c.tier, c.num_rounds, c.isl, str(c.osl), c.repeat)
            == (seed.tier, seed.num_rounds, seed.isl, str(seed.osl), 1)
        ]
        largest = max(sweep, key=lambda c: c.concurrency)
        node = where.get(largest.id, lab.nodes[0].name)
        ceiling = min(rule.max_concurrency, max(1, len(model.users(seed))))
        capped = replace(rule, max_concurrency=ceiling, start=min(rule.start, ceiling))
        paths = ramp_paths([c.concurrency for c in sweep], capped)

        def replay(c: int, seed: Cell = seed, node: str = node) -> float:
            cell = make_cell(lab.campaign, seed.tier, c, seed.num_rounds, seed.isl, seed.osl, 1)
            return model.seconds(cell, node)

        seconds = _step_seconds(sorted({c for path in paths for c in path}), replay)
        out.append(
            KneeRamp(
                seed.tier,
                seed.num_rounds,
                seed.isl,
                str(seed.osl),
                node,
                tuple(tuple((c, seconds[c]) for c in path) for path in paths),
            )
        )
    return out


def _step_seconds(concurrencies: Sequence[int], replay: Callable[[int], float]) -> dict[int, float]:
    """Each concurrency's modelled replay: played at up to KNEE_ANCHORS of them (spread over the sorted
    list), the others interpolated between their neighbours on a log scale of concurrency (a ramp
    up to 1024 users visits about 1000 concurrencies; the replay time changes smoothly with it)."""
    if len(concurrencies) <= KNEE_ANCHORS:
        return {c: replay(c) for c in concurrencies}
    last = len(concurrencies) - 1
    anchors = sorted({concurrencies[round(i * last / (KNEE_ANCHORS - 1))] for i in range(KNEE_ANCHORS)})
    played = {c: replay(c) for c in anchors}
    out = {}
    for c in concurrencies:
        hi = bisect.bisect_left(anchors, c)
        if anchors[hi] == c:
            out[c] = played[c]
            continue
        a, b = anchors[hi - 1], anchors[hi]
        w = (math.log(c) - math.log(a)) / (math.log(b) - math.log(a))
        out[c] = played[a] + w * (played[b] - played[a])
    return out


def campaign_estimate(
    lab: LabConfig,
    todo: Sequence[Cell],
    results: Path,
    requests: Callable[[Cell], int] | None,
    users: Callable[[Cell], Sequence[VirtualUser]] | None = None,
) -> Estimate:
    """How long `run` will take for `todo`, learning from `results` (the campaign's folder).
    `requests`: what each cell sends (None: the dataset is not on this machine, and replays count 0);
    `users`: the virtual users each cell replays (by default, selected again from the dataset)."""
    paths = CampaignPaths(results)
    if users is None and requests is not None:
        from kvoffload.orchestrate.campaign.pools import CellPools

        users = CellPools(lab).users
    model = replay_model(lab, users) if users is not None else None
    measured = earlier_cells(paths, _modelled(lab, model) if model is not None else None)
    priors = learn(measured, base_priors(lab), earlier_starts(paths))
    work = []
    where: dict[str, str] = {}
    for plan in schedule(todo, [n.name for n in lab.nodes], requests, lab.campaign.repeat_order):
        for i, (cell, how) in enumerate(
            zip(plan.cells, cold_start_methods(lab, plan.cells, plan.node), strict=True)
        ):
            where[cell.id] = plan.node
            work.append(
                CellWork(
                    cell.id,
                    plan.node,
                    replay_s=model.seconds(cell, plan.node) if model is not None else 0.0,
                    starts_engines=how == "restart",
                    installs=i == 0,
                    requests=requests(cell) if requests else 0,
                )
            )
    if model is None:
        return estimate(work, priors, basis="the dataset is not on this machine: replays count 0")
    placed = {**{c.id: lab.nodes[0].name for c in lab.cells}, **where}
    return estimate(work, priors, knee_ramps(lab, model, placed), model.basis())


def measured_phases(
    paths: CampaignPaths,
    cells: Sequence[str],
    wall_s: float,
    knee_s: float | None = None,
    knee_cells: Sequence[str] = (),
) -> dict[str, Any]:
    """What `cells` measured, grouped as the estimate's phases and summed (cell.json `timings`, the
    replay split at sessions.json `duration_s`; a cell without timings counts nothing), and the run's
    wall time: campaign.json `estimate.measured`. `total_s` is the wall time of what the estimate's
    `total_s` covers (the run less its knee search, `knee_s`); the knee search's own wall time and
    cells are apart, under `knee_search`, beside its worst case; `wall_s` is the whole run."""
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
    knee = {"cells": len(knee_cells), "total_s": round(knee_s, 3)} if knee_s is not None else None
    return {
        "phases": {p: round(v, 3) for p, v in sums.items()},
        "total_s": round(wall_s - (knee_s or 0.0), 3),
        "wall_s": round(wall_s, 3),
        "knee_search": knee,
    }
