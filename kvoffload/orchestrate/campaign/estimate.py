"""How long a campaign will take, before it starts: per node and in total, per phase (`plan`, `run`).

Four phases, each from figures called priors:
- install: once per node (software, model staging: the node's first cell's `install` timing);
- engine start: every cell whose engines (re)start (`deploy`), the model load and warm-up;
- replay: each cell's replay played in modelled time (kvoffload/orchestrate/campaign/replay_time.py): its
  virtual users in the order the replay takes them, `concurrency` at a time over the node's replicas,
  the recorded gaps waited where the campaign honors them, stopped at `duration_s`, each request
  costing what the simulator profile says (or a flat time without one) and stretched by the requests
  in flight with it; times `replay_scale`, what earlier cells measured over what this model said of
  them (1 before any). The replay's own time (sessions.json `duration_s`);
- overhead: the rest of a cell (cold check or reset, collect, teardown, the replay playbook's steps
  around the requests: snapshots, sampler, fetch).
Nodes run in parallel: the campaign takes its slowest node, after the run's own start (preflight and
provision of every host, before the first cell).

The knee search (the campaign option) runs after the campaign's cells, ramp after ramp, with cells it
decides as it goes: its estimate is apart (`KneeEstimate`), the worst case over every place the knee
could be (kvoffload.analysis.ramp.ramp_paths), and is not in `total_s`.

Priors come, in this order, from earlier runs of the same results folder (`learn`: the mean of the
measured figures, so a second `plan` learns from the first run), from the simulator's cost profile
(`profile_priors`: its start-up; the replay model reads the rest of the profile), else from the
documented defaults below. Pure: no IO; the CLI reads the files and hands the figures in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

# Defaults when neither an earlier run nor a profile gives a figure (seconds): what the lab test's
# campaign (tests/lab/test_lab_campaign.py: the simulator, 3 cells on one node of the virtual lab, a
# 2-core machine, 2026-12-04) measured, rounded: a node's install (34.2 s), an engine start of the
# simulator (deploy, 7.3 to 12.8 s), a cell's overhead (teardown-before, cold check, collect and
# teardown, 3.2 to 5.4 s, plus the replay playbook's own steps around the requests, 8.8 to 11.4 s),
# and the run's start before its first cell (hosts' Python, wheelhouse, preflight, provision, doctor:
# 36 s). A real lab's installs and provisioning take longer: its first run teaches the next plan.
DEFAULT_INSTALL_S = 35.0
DEFAULT_ENGINE_START_S = 10.0
# Real vLLM without an earlier run: a model load and its warm-up take minutes (the sim profiles'
# start-up of an 8B model on a datasheet disk is 2 to 3 min, their provenance says how it was sized).
DEFAULT_VLLM_START_S = 180.0
DEFAULT_CELL_OVERHEAD_S = 15.0
DEFAULT_CAMPAIGN_S = 40.0
# A request's time without a profile or an earlier run (real vLLM): a long multi-turn prompt's prefill
# and a short answer, order of a second.
DEFAULT_REQUEST_S = 1.0
# Without a profile, the share of that time that is engine work the requests in flight share (and so
# stretches with concurrency), the rest overlapping: an assumption, not a measurement. A replay of
# multi-thousand-token prompts with short answers is prefill-bound: in the simulator's tiny profile
# (a 5K-token tau2 prompt, 32 tokens out) the prefill and per-sequence decode are 75 % of a request
# alone with no cache hit. The first run's `replay_scale` corrects the level, not this split.
DEFAULT_SERIAL_SHARE = 0.75
# Output tokens of a request whose campaign replays the recorded answers (osl: recorded), for the
# profile's decode time.
RECORDED_OSL_TOKENS = 256
PHASES = ("install", "engine_start", "replay", "overhead")
PRIORS = ("install_s", "engine_start_s", "request_s", "cell_overhead_s", "campaign_s", "replay_scale")
# cell.json `timings` keys of each phase; every other key is overhead but `total` and `wait-client`
# (the client's install, once per run, runs beside the nodes' first engine starts).
_PHASE_KEYS = {"install": ("install",), "engine_start": ("deploy",), "replay": ("replay",)}
_NOT_OVERHEAD = ("total", "wait-client")


@dataclass(frozen=True)
class Priors:
    """Seconds per unit of work, each with where it came from (`default`, `profile <name>`, `N earlier
    cell(s)`)."""

    install_s: float = DEFAULT_INSTALL_S
    engine_start_s: float = DEFAULT_ENGINE_START_S
    request_s: float = DEFAULT_REQUEST_S
    cell_overhead_s: float = DEFAULT_CELL_OVERHEAD_S
    campaign_s: float = DEFAULT_CAMPAIGN_S
    # measured replay time over modelled replay time of earlier cells (1: nothing measured yet)
    replay_scale: float = 1.0
    sources: Mapping[str, str] = field(default_factory=lambda: dict.fromkeys(PRIORS, "default"))


@dataclass(frozen=True)
class CellWork:
    """What one cell will do, as the schedule says: `replay_s` is its replay in modelled time (before
    `Priors.replay_scale`), `requests` what it sends."""

    cell_id: str
    node: str
    replay_s: float
    starts_engines: bool
    installs: bool  # the node's first cell
    requests: int = 0


@dataclass(frozen=True)
class KneeRamp:
    """One ramp of the knee search as the estimate sees it: for every path the ramp can take (one per
    place of the knee), the modelled replay seconds of its steps, in order."""

    tier: str
    num_rounds: int
    isl: int
    osl: str
    node: str
    paths: tuple[tuple[tuple[int, float], ...], ...]  # per path: (concurrency, replay_s) per step


@dataclass(frozen=True)
class KneeEstimate:
    """The knee search's worst case: per ramp its longest path (the first step restarts the engines,
    the others reset them), and their sum (the ramps run one after the other)."""

    ramps: tuple[dict[str, Any], ...]
    cells: int
    total_s: float

    def to_json(self) -> dict[str, Any]:
        return {"cells": self.cells, "total_s": round(self.total_s, 3), "ramps": list(self.ramps)}


@dataclass(frozen=True)
class Estimate:
    """Seconds per phase per cell, per node and for the campaign (its start, then the slowest node);
    the knee search's worst case apart."""

    cells: Mapping[str, Mapping[str, float]]
    nodes: Mapping[str, float]
    total_s: float
    priors: Priors
    where: Mapping[str, str] = field(default_factory=dict)  # cell -> node
    knee: KneeEstimate | None = None
    basis: str = ""  # how the replay time was modelled, in words

    def phases(self) -> dict[str, float]:
        """Seconds of each phase, summed over the cells (node time, not wall time)."""
        return {p: round(sum(c[p] for c in self.cells.values()), 3) for p in PHASES}

    def to_json(self) -> dict[str, Any]:
        return {
            "total_s": round(self.total_s, 3),
            "nodes": {n: round(s, 3) for n, s in self.nodes.items()},
            "phases": self.phases(),
            "cells": {c: {p: round(v, 3) for p, v in ph.items()} for c, ph in self.cells.items()},
            "priors": {
                **{key: getattr(self.priors, key) for key in PRIORS},
                "sources": dict(self.priors.sources),
            },
            "replay_model": self.basis,
            "knee_search": self.knee.to_json() if self.knee is not None else None,
        }


def estimate(
    work: Sequence[CellWork], priors: Priors, knee: Sequence[KneeRamp] = (), basis: str = ""
) -> Estimate:
    """Each cell's phases, each node's sum, the campaign's start and slowest node; the knee search's
    worst case (None without ramps)."""
    cells: dict[str, dict[str, float]] = {}
    nodes: dict[str, float] = {}
    for w in work:
        phases = {
            "install": priors.install_s if w.installs else 0.0,
            "engine_start": priors.engine_start_s if w.starts_engines else 0.0,
            "replay": w.replay_s * priors.replay_scale,
            "overhead": priors.cell_overhead_s,
        }
        cells[w.cell_id] = phases
        nodes[w.node] = nodes.get(w.node, 0.0) + sum(phases.values())
    total = priors.campaign_s + max(nodes.values(), default=0.0) if work else 0.0
    where = {w.cell_id: w.node for w in work}
    return Estimate(cells, nodes, total, priors, where, knee_worst_case(knee, priors), basis)


def knee_worst_case(ramps: Sequence[KneeRamp], priors: Priors) -> KneeEstimate | None:
    """The longest path of each ramp at these priors (a step: its replay and a reset's overhead; the
    ramp's first step an engine start, as the node ran another tier before), summed over the ramps;
    None without ramps."""
    if not ramps:
        return None

    def seconds(path: tuple[tuple[int, float], ...]) -> float:
        steps = sum(replay * priors.replay_scale + priors.cell_overhead_s for _, replay in path)
        return steps + (priors.engine_start_s if path else 0.0)

    out: list[dict[str, Any]] = []
    for ramp in ramps:
        worst = max(ramp.paths, key=lambda p: (seconds(p), len(p)), default=())
        out.append(
            {
                "tier": ramp.tier,
                "num_rounds": ramp.num_rounds,
                "isl": ramp.isl,
                "osl": ramp.osl,
                "node": ramp.node,
                "cells": len(worst),
                "concurrency": [c for c, _ in worst],
                "seconds": round(seconds(worst), 3),
            }
        )
    cells = sum(int(r["cells"]) for r in out)
    return KneeEstimate(tuple(out), cells, sum(float(r["seconds"]) for r in out))


def profile_priors(
    name: str, startup_s: float, cold_prefill_s: float, decode_step_s: float, osl_tokens: int
) -> Priors:
    """Priors from a cost profile: its start-up as the engine start (the simulator's own service
    start added), and a request as a cold prefill of its prompt plus `osl_tokens` decode steps. A
    cold prefill bounds a later round's (its history is cached): the replay estimate errs long."""
    source = f"profile {name}"
    sources = {**dict.fromkeys(PRIORS, "default"), "engine_start_s": source, "request_s": source}
    return Priors(
        engine_start_s=DEFAULT_ENGINE_START_S + startup_s,
        request_s=cold_prefill_s + osl_tokens * decode_step_s,
        sources=sources,
    )


@dataclass(frozen=True)
class Measured:
    """One finished cell of an earlier run: its cell.json `timings`, requests sent and in flight, the
    replay's own time (sessions.json `duration_s`; None: unknown) and what the replay model says of a
    cell of its configuration now (`modelled_s`, before any scale; None: not modelled)."""

    timings: Mapping[str, float]
    requests: int
    in_flight: int
    replay_own_s: float | None = None
    modelled_s: float | None = None


def phase_seconds(timings: Mapping[str, float], replay_own_s: float | None = None) -> dict[str, float]:
    """A cell's measured timings grouped as the estimate's phases (`overhead`: all other keys). With
    `replay_own_s`, the replay phase is the requests' own time and the rest of it is overhead."""
    out = {p: sum(float(timings.get(k, 0.0)) for k in _PHASE_KEYS.get(p, ())) for p in PHASES}
    named = {k for keys in _PHASE_KEYS.values() for k in keys}
    out["overhead"] = sum(float(v) for k, v in timings.items() if k not in named and k not in _NOT_OVERHEAD)
    if replay_own_s is not None and "replay" in timings:
        own = min(out["replay"], max(0.0, replay_own_s))
        out["overhead"] += out["replay"] - own
        out["replay"] = own
    return out


def learn(measured: Sequence[Measured], fallback: Priors, starts: Sequence[float] = ()) -> Priors:
    """Priors from earlier cells where they measured the figure, `fallback`'s otherwise: the mean
    install and engine start over the cells that had one, the mean overhead, `replay_scale` as their
    replays' own seconds (else their phase's) over what the replay model says of them now, and a
    request's time (what the flat model without a profile uses, and what `plan` shows) as the replay's
    own seconds times requests in flight over requests; the run's start as the mean of earlier runs'
    `starts` (their wall time less their knee search and their slowest node's cells)."""

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    installs = [float(m.timings["install"]) for m in measured if m.timings.get("install")]
    deploys = [float(m.timings["deploy"]) for m in measured if m.timings.get("deploy")]
    split = [phase_seconds(m.timings, m.replay_own_s) for m in measured]
    requests = [
        phases["replay"] * max(1, m.in_flight) / m.requests
        for m, phases in zip(measured, split, strict=True)
        if m.requests > 0 and phases["replay"] > 0
    ]
    pairs = [
        (phases["replay"], m.modelled_s)
        for m, phases in zip(measured, split, strict=True)
        if m.modelled_s and phases["replay"] > 0
    ]
    scale = sum(a for a, _ in pairs) / sum(b for _, b in pairs) if pairs else None
    overheads = [phases["overhead"] for phases in split]
    learned = {
        "install_s": (mean(installs), len(installs)),
        "engine_start_s": (mean(deploys), len(deploys)),
        "request_s": (mean(requests), len(requests)),
        "cell_overhead_s": (mean(overheads), len(overheads)),
        "campaign_s": (mean([float(v) for v in starts]), len(starts)),
        "replay_scale": (scale, len(pairs)),
    }
    sources = dict(fallback.sources)
    values: dict[str, float] = {}
    for key, (value, n) in learned.items():
        if value is not None:
            values[key] = round(value, 3)
            sources[key] = f"{n} earlier run(s)" if key == "campaign_s" else f"{n} earlier cell(s)"
    return replace(fallback, **values, sources=sources)
