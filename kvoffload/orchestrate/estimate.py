"""How long a campaign will take, before it starts: per node and in total, per phase (`plan`, `run`).

Four phases, each from figures called priors:
- install: once per node (software, model staging: the node's first cell's `install` timing);
- engine start: every cell whose engines (re)start (`deploy`), the model load and warm-up;
- replay: a cell's expected requests (the dataset's virtual users at its num_rounds and isl, times
  num_rounds) times a request's time, over the requests in flight at once (the cell's concurrency,
  at most its users): the replay's own time (sessions.json `duration_s`);
- overhead: the rest of a cell (cold check or reset, collect, teardown, the replay playbook's steps
  around the requests: snapshots, sampler, fetch).
Nodes run in parallel: the campaign takes its slowest node, after the run's own start (preflight and
provision of every host, before the first cell).

Priors come, in this order, from earlier runs of the same results folder (`learn`: the mean of the
measured figures, so a second `plan` learns from the first run), from the simulator's cost profile
(`profile_priors`: its start-up, and a request's cold prefill plus its decode), else from the
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
# Output tokens of a request whose campaign replays the recorded answers (osl: recorded), for the
# profile's decode time.
RECORDED_OSL_TOKENS = 256
PHASES = ("install", "engine_start", "replay", "overhead")
PRIORS = ("install_s", "engine_start_s", "request_s", "cell_overhead_s", "campaign_s")
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
    sources: Mapping[str, str] = field(default_factory=lambda: dict.fromkeys(PRIORS, "default"))


@dataclass(frozen=True)
class CellWork:
    """What one cell will do, as the schedule says."""

    cell_id: str
    node: str
    requests: int
    in_flight: int  # requests at once: the concurrency, at most the cell's virtual users
    starts_engines: bool
    installs: bool  # the node's first cell


@dataclass(frozen=True)
class Estimate:
    """Seconds per phase per cell, per node and for the campaign (its start, then the slowest node)."""

    cells: Mapping[str, Mapping[str, float]]
    nodes: Mapping[str, float]
    total_s: float
    priors: Priors
    where: Mapping[str, str] = field(default_factory=dict)  # cell -> node

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
        }


def estimate(work: Sequence[CellWork], priors: Priors) -> Estimate:
    """Each cell's phases, each node's sum, the campaign's start and slowest node."""
    cells: dict[str, dict[str, float]] = {}
    nodes: dict[str, float] = {}
    for w in work:
        phases = {
            "install": priors.install_s if w.installs else 0.0,
            "engine_start": priors.engine_start_s if w.starts_engines else 0.0,
            "replay": w.requests * priors.request_s / max(1, w.in_flight),
            "overhead": priors.cell_overhead_s,
        }
        cells[w.cell_id] = phases
        nodes[w.node] = nodes.get(w.node, 0.0) + sum(phases.values())
    total = priors.campaign_s + max(nodes.values(), default=0.0) if work else 0.0
    return Estimate(cells, nodes, total, priors, {w.cell_id: w.node for w in work})


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
    """One finished cell of an earlier run: its cell.json `timings`, requests sent and in flight, and
    the replay's own time (sessions.json `duration_s`; None: unknown)."""

    timings: Mapping[str, float]
    requests: int
    in_flight: int
    replay_own_s: float | None = None


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
    install and engine start over the cells that had one, a request's time as the replay's own
    seconds (else its phase's) times requests in flight over requests, the mean overhead; the run's
    start as the mean of earlier runs' `starts` (their wall time less their slowest node's cells)."""

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
    overheads = [phases["overhead"] for phases in split]
    learned = {
        "install_s": (mean(installs), len(installs)),
        "engine_start_s": (mean(deploys), len(deploys)),
        "request_s": (mean(requests), len(requests)),
        "cell_overhead_s": (mean(overheads), len(overheads)),
        "campaign_s": (mean([float(v) for v in starts]), len(starts)),
    }
    sources = dict(fallback.sources)
    values: dict[str, float] = {}
    for key, (value, n) in learned.items():
        if value is not None:
            values[key] = round(value, 3)
            sources[key] = f"{n} earlier run(s)" if key == "campaign_s" else f"{n} earlier cell(s)"
    return replace(fallback, **values, sources=sources)
