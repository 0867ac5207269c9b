"""Build a campaign's report: ingest if needed, analyse, write derived tables, Markdown and HTML.

`build_report(results_dir)` is what the orchestrator calls at the end of a campaign and what
`kvoffload-lab report` runs. It writes `tables/{summary,rounds,warnings}.parquet`,
`report/report.md` and a self-contained `report/index.html` (inline SVG plots and CSS, no scripts,
no network), and returns the path of index.html.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from kvoffload import __version__
from kvoffload.analysis import capacity as cap
from kvoffload.analysis.attribution import TierAttribution, tier_attribution
from kvoffload.analysis.capacity import Knee, Stated, TierCapacity
from kvoffload.analysis.client import replay_window, ttft_by_round, ttft_cdf
from kvoffload.analysis.compare import GROUP_KEYS, group_label, tier_comparison, warnings_table
from kvoffload.analysis.engine import engine_series
from kvoffload.analysis.findings import ROUTING_NOTE, Finding, by_group, findings
from kvoffload.analysis.hosts import disk_series, gpu_table, parse_targets
from kvoffload.analysis.nulls import grouped_info, is_info, note_warnings
from kvoffload.analysis.recommend import Recommendation, recommend
from kvoffload.analysis.software import engine_sets, software_frame, software_table
from kvoffload.analysis.summary import relevant, rounds_table, summarize
from kvoffload.atomic import atomic_path, write_text_atomic
from kvoffload.contracts.layout import CampaignPaths
from kvoffload.errors import UserError
from kvoffload.ingest import Tables, ensure_tables
from kvoffload.profiles.resolve import LmcacheProfile, lmcache_profile
from kvoffload.report import decision_view, plots
from kvoffload.report.model_config import find_model_config, is_hub_id
from kvoffload.report.prompts import shared_prefix_reuse
from kvoffload.report.views import (
    CACHE_COLUMNS,
    COMPARISON_COLUMNS,
    COMPARISON_NOTE,
    DISK_COLUMNS,
    LATENCY_COLUMNS,
    OFFLOAD_COLUMNS,
    SESSION_COLUMNS,
    FindingsView,
    Table,
    attribution_tables,
    findings_markdown,
    findings_view,
    fmt,
    frame_table,
    gpu_memory_note,
    hosts_table,
    knee_table,
    left_out_text,
    prediction_tables,
    rounds_pivot,
    software_view,
    table,
)
from kvoffload.sim.profile import load_profile
from kvoffload.tiers import Tier
from kvoffload.tokenizer import hf_hub_cache

# The title of the turn-by-turn section (Markdown, HTML and the terminal's findings).
TURNS_TITLE = "Where each turn's prompt came from"


@dataclass(frozen=True)
class Analysis:
    """Everything the renderers need, computed once."""

    tables: Tables
    summary: pd.DataFrame
    comparison: pd.DataFrame
    warnings: pd.DataFrame
    rounds: pd.DataFrame
    software: pd.DataFrame
    attribution: list[TierAttribution] = field(default_factory=list)


@dataclass(frozen=True)
class Conclusions:
    """The answers to the methodology's three questions: findings, capacity, recommendation."""

    findings: list[Finding]
    predictions: list[TierCapacity]
    knees: list[Knee]
    recommendations: list[Recommendation]
    # issue 42: sessions at the campaign's slo, goodput and cost per tier (report/decision_view.py)
    decision: decision_view.DecisionSection | None = None


@dataclass(frozen=True)
class FindingGroup:
    """The findings of one comparison group with the plot shown beside them."""

    title: str
    comparable: bool
    statements: list[str]
    plot: str | None
    # issue 53: the findings as a table with warning tags, each tag explained once (report/views.py)
    view: FindingsView | None = None


@dataclass(frozen=True)
class GroupView:
    title: str
    comparison: Table
    latency: Table
    cache: Table
    offload: Table
    hardware: Table
    rounds: Table
    plots: list[tuple[str, str]]


def with_prefix_reuse(summary: pd.DataFrame, t: Tables) -> pd.DataFrame:
    """The summary with `shared_prefix_reuse_share` after `reuse_share` (report/prompts.py); a cell
    whose figure is null gets an informational `prefix_reuse_unknown` data note saying why."""
    if summary.empty:
        return summary
    reuse = shared_prefix_reuse(t.cells, t.requests, t.campaign)  # campaign.json: where the dataset was
    out = summary.copy()
    values = [reuse.get(str(c), (None, None)) for c in out["cell_id"]]
    at = list(out.columns).index("reuse_share") + 1
    figures = [float("nan") if v is None else float(v) for v, _ in values]
    out.insert(at, "shared_prefix_reuse_share", pd.Series(figures, index=out.index, dtype=float))
    notes = []
    for text, (_, why) in zip(out["data_notes"], values, strict=True):
        listed = json.loads(text) if isinstance(text, str) and text else []
        if why is not None:
            message = f"shared-prefix reuse is null: {why}"
            listed.append({"kind": "prefix_reuse_unknown", "message": message})
        notes.append(json.dumps(listed) if listed else None)
    out["data_notes"] = notes
    return out


def analyse(results_dir: Path) -> Analysis:
    """Ingest when needed, then compute summary, comparison, warnings and per-round tables."""
    t = ensure_tables(results_dir)
    cut = {c["cell_id"] for c in t.cut_off if c["file"].endswith("snapshot-before.jsonl")}
    summary = with_prefix_reuse(summarize(t.cells, t.requests, t.sessions, t.samples, cut), t)
    software = software_frame(t.cells)
    return Analysis(
        tables=t,
        summary=summary,
        comparison=tier_comparison(summary, software),
        warnings=pd.concat(
            [
                warnings_table(summary, t.skipped, software, t.cells),
                note_warnings(summary, t.unreadable, t.cut_off),
            ],
            ignore_index=True,
        ),
        rounds=rounds_table(t.cells, t.requests),
        software=software,
        attribution=tier_attribution(summary, t.requests, relevant(t.samples)),
    )


def _lmcache(tier: Tier) -> LmcacheProfile | None:
    """The shipped lmcache profile of `tier` through its model (None, and the figure unstated, when the
    file cannot be read: the report still builds)."""
    try:
        return lmcache_profile(tier)
    except UserError:
        return None


def _kv_bytes_input(
    config: dict[str, Any], tensor_parallel_sizes: Sequence[int] = (), hub_cache: Path | None = None
) -> Stated:
    """KV bytes per token of one cell: the simulator profile a sim cell ran with (its server stores
    exactly that), else the model's config.json where this machine has it (the model's folder, for a hub
    id the Hugging Face hub cache, the lab's staged copy: report/model_config.py), sized for the
    replicas' tensor-parallel sizes and the campaign's extra_engine_args."""
    name = "KV bytes per token"
    profile = config.get("sim_profile") if config.get("engine") == "sim" else None
    if profile:
        try:
            value = load_profile(str(profile)).model.kv_bytes_per_token
        except UserError as exc:
            return Stated(name, None, "B", f"simulator profile {profile!r}: {exc}")
        source = f"kvoffload/profiles/sim/{profile}.yaml model.kv_bytes_per_token (the simulator's model)"
        return Stated(name, float(value), "B", source)
    model = str(config.get("model") or "")
    found = find_model_config(model, hub_cache)
    if found is None:
        cache = (
            f", nor in the Hugging Face hub cache {hub_cache or hf_hub_cache()}" if is_hub_id(model) else ""
        )
        why = f"model {model!r}: no config.json in a folder of that name{cache}, nor in the lab's staged copy"
        return Stated(name, None, "B", why)
    source = f"{found.path} (from {found.where})"
    try:
        parsed = json.loads(found.path.read_text("utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        return Stated(name, None, "B", f"{source}: unreadable ({exc})")
    if not isinstance(parsed, dict):
        return Stated(name, None, "B", f"{source}: not a JSON object")
    args = config.get("extra_engine_args")
    engine_args = [str(a) for a in args] if isinstance(args, list) else []
    return cap.kv_bytes_from_model_config(parsed, source, tensor_parallel_sizes, engine_args)


def capacity_inputs(
    t: Tables,
) -> tuple[dict[str, Stated], dict[str, Stated], dict[str, Stated]]:
    """The file-backed inputs of the capacity prediction: KV bytes per token and L2 capacity per cell,
    and the lmcache profiles' L1 size per tier (GiB), never more than the memory of the smallest
    lmcache-server host among the tier's cells (cell.json hosts: capacity.within_host_memory), so that
    neither the capacity nor the DRAM priced for it counts memory no host of the campaign has."""
    kv: dict[str, Stated] = {}
    l2: dict[str, Stated] = {}
    memory: list[dict[str, Any]] = []
    nvme = _lmcache("nvme")
    adapter = nvme.l2_adapter if nvme is not None else None
    fraction = Stated(
        "L2 capacity fraction",
        adapter.capacity_fraction if adapter is not None else None,
        "",
        "kvoffload/profiles/lmcache/nvme.yaml l2_adapter.capacity_fraction",
    )
    for _, cell in t.cells.iterrows():
        cid = str(cell["cell_id"])
        config = json.loads(cell["config"]) if isinstance(cell.get("config"), str) else {}
        targets = parse_targets(cell.get("targets") if isinstance(cell.get("targets"), str) else None)
        hosts = json.loads(cell["hosts"]) if isinstance(cell.get("hosts"), str) else {}
        memory.append({"cell_id": cid, "tier": cell["tier"], **cap.lmcache_host_memory(hosts, targets)})
        kv[cid] = _kv_bytes_input(config, sorted(set(cap.replica_tensor_parallel_sizes(targets).values())))
        if cell["tier"] == "nvme":
            device = cell.get("l2_device")
            l2[cid] = cap.l2_from_hosts(hosts, str(device) if isinstance(device, str) else None, fraction)
    memories = pd.DataFrame(memory, columns=["cell_id", "tier", "lmcache_host", "lmcache_host_memory_bytes"])
    profile_l1: dict[str, Stated] = {}
    offload: tuple[Tier, ...] = ("cpu", "nvme")
    for tier in offload:
        lm = _lmcache(tier)
        if lm is not None:
            configured = Stated(
                "L1 pool", lm.l1_size_gb, "GiB", f"kvoffload/profiles/lmcache/{tier}.yaml l1_size_gb"
            )
            host = cap.smallest_host_memory(memories[memories["tier"] == tier])
            profile_l1[tier] = cap.within_host_memory(configured, host)
    return kv, profile_l1, l2


def watermark_inputs() -> dict[str, Stated]:
    """The eviction watermark of each offload tier's capacity store: cpu's L1 from its lmcache profile.
    nvme's L2 has none stated: the profile's l2_adapter sets no eviction watermark (LMCache's default
    applies), so the report names none rather than guess."""
    out: dict[str, Stated] = {}
    cpu = _lmcache("cpu")
    if cpu is not None:
        out["cpu"] = Stated(
            "eviction watermark",
            cpu.eviction_trigger_watermark,
            "",
            "kvoffload/profiles/lmcache/cpu.yaml eviction_trigger_watermark (--eviction-trigger-watermark)",
        )
    return out


def conclude(a: Analysis, replicates: int | None = None) -> Conclusions:
    """Findings (with bootstrap CIs), capacity predictions and knees, and the recommendation."""
    split = _CellFrames(a.tables)
    requests = {str(c): split(str(c))[0] for c in a.tables.cells["cell_id"]}
    extra = {} if replicates is None else {"replicates": replicates}
    kv, profile_l1, l2 = capacity_inputs(a.tables)
    predictions = cap.predict(a.summary, kv, profile_l1, l2, watermark_inputs())
    knees = cap.knees(a.summary)
    found = findings(a.comparison, a.warnings, requests, a.software, **extra)
    return Conclusions(
        findings=found,
        predictions=predictions,
        knees=knees,
        recommendations=recommend(a.comparison, predictions, knees, found),
        decision=decision_view.section(
            a.tables.campaign,
            a.summary,
            requests,
            predictions,
            profile_l1,
            l2,
            software=a.software,
            cells=a.tables.cells,
            **extra,
        ),
    )


def _finding_groups(c: Conclusions) -> list[FindingGroup]:
    out = []
    for title, items in by_group(c.findings).items():
        rows = [f.as_dict() for f in items]
        out.append(
            FindingGroup(
                title=title,
                comparable=all(f.comparable for f in items),
                statements=[f.statement for f in items],
                plot=plots.later_ttft_ci(rows),
                view=findings_view(items),
            )
        )
    return out


def _tradeoff_plot(a: Analysis, c: Conclusions) -> str | None:
    points: dict[str, pd.DataFrame] = {}
    for k in c.knees:
        if k.axis != "concurrency":
            continue
        frame = pd.DataFrame(
            {
                "live_history_tokens": [p.live_history_tokens for p in k.points],
                "ttft_later_p50_s": [_point_stat(a.summary, p.cells, "ttft_later_p50_s") for p in k.points],
                "ttft_later_p95_s": [p.later_p95_s for p in k.points],
            },
            dtype=float,
        )
        label = k.tier if sum(1 for x in c.knees if x.tier == k.tier) == 1 else f"{k.tier} {k.fixed}"
        points[label] = frame
    capacities = {p.tier: p.tokens for p in c.predictions if p.tokens is not None}
    return plots.tradeoff(points, capacities)


def _point_stat(summary: pd.DataFrame, cells: list[str], column: str) -> float | None:
    v = pd.to_numeric(summary.loc[summary["cell_id"].isin(cells), column], errors="coerce").dropna()
    return float(v.mean()) if len(v) else None


class _CellFrames:
    """Requests and (relevant) samples split by cell once, for the per-cell plots and tables."""

    def __init__(self, t: Tables) -> None:
        self._req = {str(k): g for k, g in t.requests.groupby("cell_id", sort=False)}
        self._smp = {str(k): g for k, g in relevant(t.samples).groupby("cell_id", sort=False)}
        self._no_req, self._no_smp = t.requests.iloc[0:0], t.samples.iloc[0:0]

    def __call__(self, cell_id: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        return self._req.get(cell_id, self._no_req), self._smp.get(cell_id, self._no_smp)


def _group_views(a: Analysis, split: _CellFrames) -> list[GroupView]:
    views: list[GroupView] = []
    if a.comparison.empty:
        return views
    cells = a.tables.cells.set_index("cell_id")
    for _, group in a.comparison.groupby(GROUP_KEYS, sort=False, dropna=False):
        curves, cdfs, cache, disk = {}, {}, {}, {}
        for _, row in group.iterrows():
            cid = str(row["cell_id"])
            label = f"{row['tier']} {cid}" if (group["tier"] == row["tier"]).sum() > 1 else str(row["tier"])
            req, smp = split(cid)
            curves[label] = ttft_by_round(req)
            cdfs[label] = ttft_cdf(req)
            cache[label] = engine_series(smp, replay_window(req))  # KV usage over the table's window
            if row["tier"] == "nvme":
                targets = parse_targets(str(cells.loc[cid, "targets"]))
                device = cells.loc[cid, "l2_device"]
                disk[label] = disk_series(smp, targets, str(device) if isinstance(device, str) else None)
        svgs = [
            ("TTFT by round", plots.ttft_by_round(curves)),
            ("TTFT CDF", plots.ttft_cdf(cdfs)),
            ("hit rate and KV usage over time", plots.cache_over_time(cache)),
            ("L2 disk throughput", plots.disk_throughput(disk)),
        ]
        title = group_label(group.iloc[0])
        views.append(
            GroupView(
                title=title,
                comparison=table("Tier comparison", group, COMPARISON_COLUMNS, note=COMPARISON_NOTE),
                latency=table("TTFT, token latency and throughput", group, LATENCY_COLUMNS),
                cache=table("Prefix cache, KV usage and engine times", group, CACHE_COLUMNS, key_columns=2),
                offload=table("KV offload (LMCache) and reuse", group, OFFLOAD_COLUMNS, key_columns=2),
                hardware=table(
                    "L2 disk and GPU", group, DISK_COLUMNS, note=gpu_memory_note(group), key_columns=3
                ),
                rounds=rounds_pivot(curves),
                plots=[(n, s) for n, s in svgs if s is not None],
            )
        )
    return views


CAMPAIGN_SKIP = frozenset({"campaign", "cells", "schema", "versions", "estimate"})
PHASE_NAMES = {
    "install": "install (once per node)",
    "engine_start": "engine starts",
    "replay": "replays",
    "overhead": "overhead (cold check, reset, collect, teardown)",
}


def timing_table(campaign: dict[str, Any]) -> Table | None:
    """The run's estimate (campaign.json `estimate`, what `plan` prints) against what its cells
    measured, like with like: per phase (summed over the campaign's cells), the wall time of what the
    estimate's total covers (the run's start and its cells), and the knee search apart (its worst case
    against what it ran); None before a run kept one. The ratio is estimate / measured (docs/metrics.md,
    "Run time: estimate against measured")."""
    estimate = campaign.get("estimate")
    if not isinstance(estimate, dict) or not isinstance(estimate.get("measured"), dict):
        return None
    measured = estimate["measured"]
    rows = []
    pairs = [(PHASE_NAMES.get(k, k), v, measured["phases"].get(k)) for k, v in estimate["phases"].items()]
    knee_ran = measured.get("knee_search") if isinstance(measured.get("knee_search"), dict) else None
    knee_plan = estimate.get("knee_search") if isinstance(estimate.get("knee_search"), dict) else None
    if "wall_s" in measured:
        pairs.append(("wall time of the campaign's cells (with the run's start)", estimate["total_s"],
                      measured.get("total_s")))  # fmt: skip
    else:
        # written before the knee search was timed apart: its wall time may hold a knee search
        knee = campaign.get("knee_search")
        pairs.append(("wall time of the run" + (" (knee search included)" if knee else ""),
                      estimate["total_s"], None if knee else measured.get("total_s")))  # fmt: skip
    if knee_plan is not None or knee_ran is not None:
        cells = f"worst case {knee_plan.get('cells')} cell(s)" if knee_plan else "not estimated"
        cells += f", ran {knee_ran.get('cells')}" if knee_ran else ""
        planned_s, ran_s = (knee_plan or {}).get("total_s"), (knee_ran or {}).get("total_s")
        pairs.append((f"knee search ({cells})", planned_s, ran_s))
    for name, planned, actual in pairs:
        ratio = planned / actual if planned is not None and actual else None
        rows.append(
            [
                name,
                fmt(None if planned is None else planned / 60, 1),
                fmt(None if actual is None else actual / 60, 1),
                fmt(ratio, 2),
            ]
        )
    sources = estimate.get("priors", {}).get("sources", {})
    note = (
        "Phases are node time summed over the campaign's cells; the knee search's cells are its own row, "
        "beside its worst case (not in the estimate's total). Estimate / measured below 1: the run took "
        "longer than estimated. The estimate's figures came from: "
        + ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v}" for k, v in sources.items())
        + (f"; replays: {estimate['replay_model']}" if estimate.get("replay_model") else "")
    )
    return Table("Run time: estimate against measured", ["phase", "estimate (min)", "measured (min)",
                                                         "estimate / measured"], rows, note)  # fmt: skip


def _campaign_items(t: Tables, results_dir: Path) -> list[tuple[str, str]]:
    items = [("results folder", str(results_dir))]
    # campaign.json: the campaign's own settings first, one line each; the cell list is shown below
    flat = {**(t.campaign.get("campaign") or {}), **t.campaign}
    for key, value in flat.items():
        if key in CAMPAIGN_SKIP or value is None or value == []:
            continue
        items.append((str(key), value if isinstance(value, str) else json.dumps(value, sort_keys=True)))
    items.append(("cells", f"{len(t.cells)} ({', '.join(sorted(set(t.cells['tier'])))} tiers)"))
    datasets = sorted(
        {f"{c} ({p})" for c, p in zip(t.cells["dataset_code"], t.cells["dataset_path"], strict=True) if c}
    )
    if datasets:
        items.append(("dataset", "; ".join(datasets)))
    versions = sorted(set(t.cells["versions"].dropna()) - {"{}"})
    if versions:
        # the lab hosts' software is the "Software per host" table
        items.append(("controller software versions", " | ".join(versions)))
    return items


def _cpu_table(summary: pd.DataFrame) -> Table:
    """The summary's `cpu_util_pct_by_host`, one row per cell and host."""
    rows = []
    for _, row in summary.iterrows():
        text = row.get("cpu_util_pct_by_host")
        if isinstance(text, str) and text:
            for host, pct in json.loads(text).items():
                rows.append({"cell": row["cell_id"], "tier": row["tier"], "host": host, "cpu_util_pct": pct})
    return frame_table("CPU utilization per host (%)", pd.DataFrame(rows), 1)


def _gpu_table(t: Tables, split: _CellFrames) -> Table:
    frames = []
    for _, cell in t.cells.iterrows():
        _, smp = split(str(cell["cell_id"]))
        gpus = gpu_table(smp)
        if not gpus.empty:
            gpus.insert(0, "cell", cell["cell_id"])
            frames.append(gpus)
    return frame_table("GPU telemetry per GPU (means)", pd.concat(frames) if frames else pd.DataFrame(), 2)


def _title(a: Analysis, results_dir: Path) -> str:
    name = a.tables.campaign.get("name") if isinstance(a.tables.campaign.get("name"), str) else None
    return str(name or results_dir.name)


def _context(a: Analysis, results_dir: Path, c: Conclusions) -> dict[str, Any]:
    frames = _CellFrames(a.tables)
    warnings: list[dict[str, Any]] = [
        {str(k): (None if isinstance(v, float) and pd.isna(v) else v) for k, v in w.items()}
        for w in a.warnings.to_dict("records")
    ]
    predicted, inputs = prediction_tables(c.predictions)
    return {
        "decision": c.decision,
        "decision_title": decision_view.TITLE,
        "decision_views": [] if c.decision is None else decision_view.views(c.decision),
        "finding_groups": _finding_groups(c),
        "turns_title": TURNS_TITLE,
        "attribution": attribution_views(a.attribution),
        "routing_note": ROUTING_NOTE,
        "predicted": predicted,
        "capacity_inputs": inputs,
        "knees": knee_verdicts(c.knees, a.tables.campaign.get("knee_search")),
        "knee_table": knee_table(c.knees),
        "tradeoff": _tradeoff_plot(a, c),
        "recommendations": recommendation_lines(
            [r.statement for r in c.recommendations], c.decision is not None
        ),
        "title": _title(a, results_dir),
        "version": __version__,
        "campaign": _campaign_items(a.tables, results_dir),
        "hosts": hosts_table(a.tables.cells),
        "timing": timing_table(a.tables.campaign),
        "software": _software(a),
        "warnings": [w for w in warnings if not is_info(str(w["kind"]))],
        "info_notes": grouped_info(warnings),
        "groups": _group_views(a, frames),
        "sessions": table("Sessions per cell", a.summary, SESSION_COLUMNS),
        "cpu": _cpu_table(a.summary),
        "gpus": _gpu_table(a.tables, frames),
    }


def _software(a: Any) -> Any:
    """The "Software per host" table, with the engine set each node installed (kvoffload/engines)."""
    sets = engine_sets(a.tables.cells)
    ids = a.tables.cells["cell_id"].astype(str).tolist()
    return software_view(software_table(a.software, ids, sets), sets)


def attribution_views(views: Sequence[TierAttribution]) -> list[dict[str, Any]]:
    """The turn-by-turn section's entries, one per group and tier that has a valid cell or a cell left
    out: `group` (with `new_group` where it starts), `statement`, `left_out` and `tables`."""
    out: list[dict[str, Any]] = []
    for v in views:
        if v.rounds.empty and not v.excluded:
            continue
        new = not out or out[-1]["group"] != v.group
        tables = attribution_tables(v) if not v.rounds.empty else ()
        entry = {"group": v.group, "new_group": new, "statement": v.statement, "tables": tables}
        out.append({**entry, "left_out": left_out_text(v)})
    return out


def md_table(t: Table | None) -> str:
    """A GitHub-flavoured Markdown table (empty string for an empty table)."""
    if t is None or not t.rows:
        return ""
    esc = [[c.replace("|", "\\|") for c in row] for row in t.rows]
    lines = [f"### {t.title}", ""]
    if t.note:
        lines += [t.note, ""]
    lines.append("| " + " | ".join(t.headers) + " |")
    lines.append("|" + "|".join("---" for _ in t.headers) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in esc]
    return "\n".join(lines) + "\n"


def render_markdown(ctx: dict[str, Any]) -> str:
    """The Markdown report (findings first, campaign settings last; plots are in the HTML report)."""
    out = [f"# kvoffload-lab report: {ctx['title']}", ""]
    out += [] if ctx.get("decision") is None else decision_view.markdown(ctx["decision"])
    out += ["## Findings", ""]
    for g in ctx["finding_groups"]:
        out += [f"### {g.title}", ""]
        out += findings_markdown(g.view) if g.view else [f"- {s}" for s in g.statements] + [""]
    if not ctx["finding_groups"]:
        out += ["No comparison group has a measured cell.", ""]
    out += [ctx["routing_note"], ""]
    if ctx["attribution"]:
        out += [f"## {TURNS_TITLE}", ""]
        for v in ctx["attribution"]:
            out += [f"### {v['group']}", ""] if v["new_group"] else []
            out += [f"- {v['statement']}", ""] if v["statement"] else []
            out += [v["left_out"], ""] if v["left_out"] else []
            out += [md_table(t) for t in v["tables"]]
    out += ["## Capacity: how much history each tier retains", ""]
    out += [md_table(ctx["predicted"]), md_table(ctx["capacity_inputs"]), "### Measured knee", ""]
    out += [f"- {k}" for k in ctx["knees"]] + [""]
    out += [md_table(ctx["knee_table"]), "## Trade-off and recommendation", ""]
    out += [f"- {r}" for r in ctx["recommendations"]] + [""]
    if ctx["tradeoff"]:
        out += ["Plot (later-round TTFT against live history, predicted capacities): see index.html.", ""]
    out += ["## Validity warnings", ""]
    if ctx["warnings"]:
        for w in ctx["warnings"]:
            where = f" [{w['cell_id']}]" if w["cell_id"] else ""
            group = f" ({w['group']})" if w["group"] else ""
            out.append(f"- **{w['kind']}**{where}{group}: {w['message']}")
    else:
        out.append("No validity warnings.")
    out.append("")
    # -- information notes (issue 34): fallbacks that give the same figure, grouped by kind
    if ctx["info_notes"]:
        out += ["### Notes (information, not validity)", ""]
        for g in ctx["info_notes"]:
            cells = f" in {', '.join(g['cells'])}" if g["cells"] else ""
            out.append(f"- **{g['kind']}** ({g['count']} note(s){cells}): " + "; ".join(g["messages"]))
        out.append("")
    # -- end information notes
    for g in ctx["groups"]:
        out += [f"## {g.title}", "", md_table(g.comparison), md_table(g.latency), md_table(g.cache)]
        out += [md_table(g.rounds), md_table(g.offload), md_table(g.hardware)]
        if g.plots:
            out += [f"Plots ({', '.join(n for n, _ in g.plots)}): see index.html.", ""]
    out += ["## Session counts", "", md_table(ctx["sessions"]), md_table(ctx["cpu"]), md_table(ctx["gpus"])]
    out += ["## Campaign settings", ""] + [f"- **{k}**: {v}" for k, v in ctx["campaign"]] + [""]
    out += [md_table(ctx["timing"]), md_table(ctx["hosts"]), md_table(ctx["software"])]
    return "\n".join(out).rstrip() + "\n"


def render_html(ctx: dict[str, Any]) -> str:
    """The self-contained HTML report."""
    source = resources.files("kvoffload.report").joinpath("templates/report.html.j2").read_text("utf-8")
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.from_string(source).render(**ctx)


def write_derived_tables(a: Analysis, results_dir: Path) -> None:
    """summary, rounds and warnings as parquet next to the ingest tables."""
    tables_dir = CampaignPaths(results_dir).tables_dir
    for name, frame in (("summary", a.summary), ("rounds", a.rounds), ("warnings", a.warnings)):
        with atomic_path(tables_dir / f"{name}.parquet") as tmp:
            frame.to_parquet(tmp, index=False)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)


@dataclass(frozen=True)
class BuiltReport:
    """What `write_report` wrote: report/index.html, and the findings of its first section."""

    path: Path
    finding_groups: list[FindingGroup]
    # The turn-by-turn section's sentence per tier (the findings' "where each turn's prompt came from").
    turn_statements: list[str] = field(default_factory=list)
    # issue 42: the decision tables and sentences as terminal lines (report/decision_view.py)
    decision_lines: list[str] = field(default_factory=list)


def write_report(results_dir: Path, formats: tuple[str, ...] = ("md", "html")) -> BuiltReport:
    """Write the report of `results_dir` (ingesting first when needed): its index.html path and its
    findings, so that the caller can show them without computing them again.

    `formats` picks which of report.md / index.html to write; the returned path is index.html even
    when only Markdown was asked for (it then may not exist).
    """
    a = analyse(results_dir)
    write_derived_tables(a, results_dir)
    ctx = _context(a, results_dir, conclude(a))
    report_dir = CampaignPaths(results_dir).report_dir
    if "md" in formats:
        _write(report_dir / "report.md", render_markdown(ctx))
    if "html" in formats:
        _write(report_dir / "index.html", render_html(ctx))
    turns = [v["statement"] for v in ctx["attribution"] if v["statement"]]
    decision = [] if ctx["decision"] is None else decision_view.terminal_lines(ctx["decision"])
    return BuiltReport(report_dir / "index.html", ctx["finding_groups"], turns, decision)


def build_report(results_dir: Path, formats: tuple[str, ...] = ("md", "html")) -> Path:
    """Write the report of `results_dir` (`write_report`); return report/index.html."""
    return write_report(results_dir, formats).path


def finding_groups(results_dir: Path) -> list[FindingGroup]:
    """The findings of the report's first section, computed from the results as they are now (ingest
    first when needed), without writing the report: the live page's finished cells."""
    return _finding_groups(conclude(analyse(results_dir)))


def findings_text(groups: Sequence[FindingGroup], turns: Sequence[str] = ()) -> str:
    """The report's first section as plain text, for a terminal: a title per group, a line per
    statement, then the turn-by-turn sentence of each tier (`turns`) under its own title."""
    if not groups:
        return "Findings: no comparison group has a measured cell.\n"
    lines = ["Findings:"]
    for g in groups:
        mark = "" if g.comparable else " (not comparable)"
        lines += ["", f"  {g.title}{mark}"] + [f"  - {s}" for s in g.statements]
    if turns:
        lines += ["", f"  {TURNS_TITLE}"] + [f"  - {s}" for s in turns]
    return "\n".join(lines) + "\n"


def summary_records(summary: pd.DataFrame) -> list[dict[str, Any]]:
    """The summary table as a list of JSON-ready objects (NaN -> None)."""
    records: list[dict[str, Any]] = json.loads(summary.to_json(orient="records", double_precision=10))
    return records


def _clean_json(value: Any) -> Any:
    """NaN and infinities -> None, recursively (JSON has neither)."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: _clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean_json(v) for v in value]
    return value


def knee_search_lines(ramps: Any) -> list[str]:
    """campaign.json `knee_search` (the campaign option that ramps concurrency) in words: one line per
    tier's ramp with its outcome and the concurrencies it ran."""
    lines = []
    for ramp in ramps or []:
        ran = [str(step["concurrency"]) for step in ramp["steps"] if step["action"] == "try"]
        last = ramp["steps"][-1]["reason"] if ramp["steps"] else "no step"
        lines.append(
            f"knee search, {ramp['tier']} (num_rounds={ramp['num_rounds']}, isl={ramp['isl']}, "
            f"osl={ramp['osl']}): {ramp['outcome']}; ran concurrency {', '.join(ran) or 'none'}; {last}"
        )
    return lines


def _ramp_of(k: Knee, ramps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The knee search ramp of the same tier and sweep as a concurrency-axis knee, if any."""
    if k.axis != "concurrency":
        return None
    for ramp in ramps:
        if (
            ramp.get("tier") == k.tier
            and str(ramp.get("num_rounds")) == str(k.fixed.get("num_rounds"))
            and str(ramp.get("isl")) == str(k.fixed.get("isl"))
            and str(ramp.get("osl")) == str(k.fixed.get("osl"))
        ):
            return ramp
    return None


def knee_verdicts(knees: Sequence[Knee], ramps: Any) -> list[str]:
    """One statement per tier and sweep: the measured knee of the sweep (capacity.knees) and, where the
    campaign ran a knee search for the same tier and sweep, its outcome in the same sentence, so the
    report never says "knee not reached" and "bracketed" side by side. The two use different limits
    (the sweep: a collapse of the hit rate or a rise of degradation; the search: the campaign's SLO or
    hit-rate floor), and the sentence says which limit binds first."""
    left = [r for r in (ramps or []) if isinstance(r, dict)]
    out = []
    for k in knees:
        ramp = _ramp_of(k, left)
        if ramp is None:
            out.append(k.statement)
            continue
        left.remove(ramp)
        head, _, sweep = k.statement.partition(": ")
        reason = ramp["steps"][-1]["reason"] if ramp.get("steps") else "no step"
        where = f" on node {ramp['node']}" if ramp.get("node") else ""
        if ramp.get("outcome") == "bracketed" and ramp.get("bracket"):
            lo, hi = ramp["bracket"]
            if k.status == "found" and k.bracket:
                tail = f"by the sweep's own criterion ({k.criterion}) the knee lies between concurrency " + (
                    f"{k.bracket[0]} and {k.bracket[1]}"
                )
            else:
                tail = (
                    f"the sweep's own criterion ({k.criterion}) was not crossed in the measured range, so "
                    "the search's limit binds first"
                )
            out.append(f"{head}: the knee search{where} bracketed the knee between concurrency {lo} and {hi} "
                       f"({reason}); {tail}")  # fmt: skip
        else:
            out.append(f"{head}: {sweep}; the knee search{where} ended {ramp.get('outcome')}: {reason}")
    return out + knee_search_lines(left)


def recommendation_lines(statements: list[str], decided: bool) -> list[str]:
    """The trade-off section's lines. With a decision (the campaign's `slo`), the decision table's
    verdict column answers which tier (issue 42), so each recommendation paragraph becomes its list of
    conditions, one clause a line; without one, the paragraphs stay the answer."""
    if not decided:
        return statements
    return [clause.strip() for s in statements for clause in s.split("; ") if clause.strip()]


def report_json(a: Analysis, c: Conclusions) -> str:
    """`report --format json`: {"summary": one object per cell (the summary table), "findings": one per
    comparison group and tier, "attribution": one per comparison group, node and tier (its valid cells
    and those left out, rounds with their token sources, the cost of each source per 1K tokens with its
    interval and verdict, the sentence), "capacity": {"predicted", "measured",
    "recommendation"}}."""
    doc = {
        "summary": summary_records(a.summary),
        "findings": [f.as_dict() for f in c.findings],
        "attribution": [v.as_dict() for v in a.attribution],
        "capacity": {
            "predicted": [p.as_dict() for p in c.predictions],
            "measured": [k.as_dict() for k in c.knees],
            "recommendation": [r.as_dict() for r in c.recommendations],
            "knee_search": a.tables.campaign.get("knee_search"),
        },
        "decision": None if c.decision is None else decision_view.json_section(c.decision),
    }
    return json.dumps(_clean_json(doc), indent=1, sort_keys=False) + "\n"


def summary_csv(summary: pd.DataFrame) -> str:
    """The summary table as CSV (empty fields for missing figures)."""
    return str(summary.to_csv(index=False))
