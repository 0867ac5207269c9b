"""The report's first screen: one short statement per comparison group and tier, with numbers.

Pure: the tier comparison (summary rows with `comparable`), the warnings table, the software frame and
each cell's request records in; `Finding`s out. A finding's group holds model, concurrency, num_rounds,
ISL and OSL fixed and pools the repeats (FINDING_KEYS); its confidence intervals come from
kvoffload/analysis/bootstrap.py (sessions within a cell, cells across repeats). Each statement says
whether the comparison is valid (and if not, why), whether offload was exercised (and whether by history
retained beyond the GPU cache or by replicas sharing one LMCache server), where prompt tokens came from
(GPU prefix cache, LMCache L1 and L2), and how requests were routed, as the request records show it;
and what the verdict rests on (analysis/noise.py): one repeat, a change within noise with the repeats
that would separate it, host CPU that differed widely between the cells. Every rule is in
docs/metrics.md "Validity rules" and "Noise".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from kvoffload.analysis import bootstrap, noise
from kvoffload.analysis.compare import (
    GROUP_KEYS,
    NEAR_FULL_PCT,
    OFFLOAD_TIERS,
    group_label,
    l1_oom_warning,
    offload_exercised,
    replicas,
    routing_check_text,
    unclean_reason,
)
from kvoffload.analysis.software import version_splits
from kvoffload.tiers import TIERS

FINDING_KEYS = [k for k in GROUP_KEYS if k != "repeat"]
# Warning kinds that make a comparison invalid, and the ones that qualify it. The group kinds come from
# the group warnings; the cell kinds (a fault, failed requests, flaps) are issued for every cell, and a
# cell that is the only one of its repeat's group has no group warning to carry them: `_reasons` checks
# those cells itself (compare.unclean_reason).
INVALIDATING = (
    "sessions_differ",
    "sessions_missing",
    "cells_not_clean",
    "routing_breach",
    "cell_faulted",
    "failed_requests",
    "caddy_upstream_flaps",
)
CAVEATS = (
    "cell_not_done",
    "concurrency_above_ceiling",
    "scrape_gaps",
    "no_engine_metrics",
    "no_virtual_users",
    "routing_unchecked",
    "attribution_mismatch",
    "l2_prefetch_l1_oom",
)
ROUTING = {
    "header X-User-Id": "sticky by X-User-Id",
    "least_conn": "least_conn",
}
ROUTING_NOTE = (
    "Routing differs by design: with two or more replicas the gpu tier routes sticky by the X-User-Id "
    "header (a user's rounds return to the replica whose prefix cache holds its history), while the cpu "
    "and nvme tiers use least_conn (every replica reads the one shared LMCache server). Each finding says "
    "whether the request records show that this held (the replica that answered each request); a cell "
    "where it did not makes its group not comparable."
)


@dataclass(frozen=True)
class Finding:
    """One tier of one comparison group, as the first screen states it."""

    group: str
    model: str
    concurrency: int
    num_rounds: int
    isl: int
    osl: str
    tier: str
    cells: list[str]
    repeats: int
    comparable: bool
    not_comparable_reasons: list[str]
    caveats: list[str]
    offload_exercised: bool | None
    later_p50_s: float | None
    later_p50_ci_s: list[float] | None
    later_p95_s: float | None
    later_p95_ci_s: list[float] | None
    p50_change_vs_gpu_pct: float | None
    p50_change_ci_pct: list[float] | None
    p95_change_vs_gpu_pct: float | None
    p95_change_ci_pct: list[float] | None
    sessions: int
    gpu_prefix_token_share: float | None
    lmcache_token_share: float | None
    lmcache_l1_hit_share: float | None
    lmcache_l2_hit_share: float | None
    routing: str | None
    statement: str
    details: dict[str, Any] = field(default_factory=dict)
    # Offload evidence of a cpu/nvme finding (None: unknown, or the gpu tier): history outgrew the GPU
    # cache (findings._cell_exceeded); 2+ replicas answered and some user's rounds moved between them.
    gpu_capacity_exceeded: bool | None = None
    cross_replica_sharing: bool | None = None
    # Noise (analysis/noise.py): the p50 verdict against gpu ("faster", "slower", "indistinguishable":
    # its interval includes 0; None without one), whether the interval includes 0, the repeats per cell
    # that would separate it, the gpu side's repeats, whether a side has one repeat, and per role the
    # CPU utilization spread over the group's cells.
    p50_verdict: str | None = None
    p50_within_noise: bool | None = None
    repeats_to_separate: int | None = None
    gpu_repeats: int | None = None
    one_repeat: bool | None = None
    cpu_spread: list[dict[str, Any]] = field(default_factory=list)
    # Whether L2 loads of the tier's cells failed for lack of room in L1 (summary
    # `lmcache_l2_prefetch_l1_oom`; None: unknown, or the gpu tier) and how many chunks.
    l2_prefetch_l1_oom: bool | None = None
    l2_prefetch_failed_l1_oom_chunks: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean(rows: pd.DataFrame, column: str) -> float | None:
    if column not in rows:
        return None
    v = pd.to_numeric(rows[column], errors="coerce").dropna()
    return float(v.mean()) if len(v) else None


def _sum(rows: pd.DataFrame, column: str) -> float | None:
    if column not in rows:
        return None
    v = pd.to_numeric(rows[column], errors="coerce").dropna()
    return float(v.sum()) if len(v) else None


def _pct(share: float | None) -> str:
    return "–" if share is None else f"{100 * share:.0f} %"


def _seconds(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g} s"


def _too_few(i: bootstrap.Interval) -> str:
    sides = f"{i.sessions}" if i.base_sessions is None else f"{i.sessions} against {i.base_sessions}"
    return f"too few sessions for an interval: {sides}, at least {bootstrap.MIN_SESSIONS} per side"


def _change_text(what: str, change: bootstrap.Interval) -> str:
    """ "cuts X by 56 % (95 % CI 41-66 %)" and its kin."""
    est, ci = change.estimate, change.as_list()
    if est is None:
        return f"{what}: no change can be computed (no later-round TTFT on one side)"
    if ci is None:
        why = _too_few(change) if change.too_few_sessions else "no interval"
        return f"changes {what} by {est:+.0f} % ({why})"
    lo, hi = ci
    if hi < 0:
        return f"cuts {what} by {-est:.0f} % (95 % CI {-hi:.0f}-{-lo:.0f} %)"
    if lo > 0:
        return f"raises {what} by {est:.0f} % (95 % CI {lo:.0f}-{hi:.0f} %)"
    return f"does not change {what} measurably: {est:+.0f} % (95 % CI {lo:+.0f} to {hi:+.0f} %)"


def p50_verdict(ci: list[float] | None) -> str | None:
    """ "faster" / "slower" than gpu when the p50 change's interval lies below / above 0,
    "indistinguishable" when it includes 0 (never "faster"), None without an interval."""
    if ci is None:
        return None
    return "faster" if ci[1] < 0 else "slower" if ci[0] > 0 else "indistinguishable"


def _noise_text(c50: bootstrap.Interval, repeats: int, base_repeats: int, spreads: list[str]) -> str:
    """What the verdict rests on: within noise (and the repeats that would separate it), one repeat,
    host CPU that differed between the cells; "" when none applies."""
    n0 = min(repeats, base_repeats)
    parts = [noise.noise_text(c50.estimate, c50.as_list(), n0)]
    if noise.one_repeat(repeats, base_repeats) and c50.estimate is not None:
        counted = noise.repeats_to_separate(c50.estimate, c50.as_list(), n0) is not None
        parts.append(noise.one_repeat_text(c50.as_list() is not None, counted))
    parts += [f"warning: {s}" for s in spreads]
    return "; ".join(p for p in parts if p)


def _p95_text(change: bootstrap.Interval | None) -> str:
    """The p95 change beside the p50 one; the p50's text already says when there are too few sessions."""
    if change is None:
        return "–"
    if change.too_few_sessions and change.estimate is not None:
        return f"{change.estimate:+.0f} %, no interval"
    return _change_text("it", change)


def _sources_text(gpu: float | None, lmc: float | None, l1: float | None, l2: float | None) -> str:
    parts = []
    if lmc is not None:
        split = ""
        if l1 is not None and l2 is not None and (l1 or l2):
            split = f" (L1 {_pct(l1)}, L2 {_pct(l2)} of its hits)"
        parts.append(f"{_pct(lmc)} of prompt tokens came from LMCache{split}")
    if gpu is not None:
        parts.append(f"{_pct(gpu)} {'from' if parts else 'of prompt tokens came from'} the GPU prefix cache")
    return ", ".join(parts)


def _exercised(rows: pd.DataFrame) -> bool | None:
    values = [offload_exercised(r) for _, r in rows.iterrows()]
    if any(v is True for v in values):
        return True
    if values and all(v is False for v in values):
        return False
    return None


def _not_exercised_text(rows: pd.DataFrame) -> str:
    kv = _mean(rows, "kv_usage_max_pct")
    kv_text = "unknown" if kv is None else f"{kv:.0f} %"
    return (
        f"offload was never exercised: KV usage peaked at {kv_text} (below {NEAR_FULL_PCT:.0f} %), "
        "no LMCache evictions, no external prefix-cache hits, so this comparison does not measure offloading"
    )


def _routing(rows: pd.DataFrame) -> str | None:
    policies = {str(p) for p in rows.get("caddy_policy", pd.Series(dtype=object)).dropna()}
    check = routing_check_text(rows)
    if policies:
        text = " / ".join(ROUTING.get(p, p) for p in sorted(policies))
        return f"{text} ({check})" if check else text
    n = _mean(rows, "gpu_replicas")
    return "one replica, no load balancer" if n == 1 else check


# --- offload evidence: history beyond the GPU cache vs cross-replica sharing ---
def _known(rows: pd.DataFrame, column: str) -> list[float]:
    if column not in rows:
        return []
    return [float(v) for v in pd.to_numeric(rows[column], errors="coerce").dropna()]


def _any_of(values: list[bool | None]) -> bool | None:
    """True if any is True, False if all are False, else None."""
    if any(v is True for v in values):
        return True
    return False if values and all(v is False for v in values) else None


def _cell_sharing(r: pd.Series) -> bool | None:
    """One cell: 2+ replicas (sharing one LMCache server) answered and some user's rounds moved
    between them (per-replica evidence of the records); None when the records cannot tell."""
    n, moved = replicas(r), r.get("users_on_several_replicas")
    if n is not None and n < 2:
        return False
    if moved is None or pd.isna(moved) or not r.get("replicas_answering"):
        return None
    return int(moved) > 0


def _cell_exceeded(r: pd.Series) -> tuple[bool | None, str]:
    """One cell: did the history outgrow the GPU KV cache, and the evidence, in words.

    True: KV usage reached NEAR_FULL_PCT on a replica; or the live history (min(concurrency,
    sessions_replayed) x live_context_mean_tokens: the users in flight at once) is larger than the GPU
    prefix cache of all replicas (gpu_cache_tokens); or external hits came while no user moved between
    replicas (the replica's own history, dropped from its GPU cache). False: KV usage stayed below
    NEAR_FULL_PCT and none of the others holds. vLLM's KV usage counts the blocks of running requests
    only (cached blocks of finished ones count as free), so the other two override a low peak."""
    kv = _num(r.get("kv_usage_max_pct"))
    sessions = _num(r.get("sessions_replayed"))
    context = _num(r.get("live_context_mean_tokens"))
    live = None if sessions is None else min(sessions, float(r["concurrency"]))
    held = None if live is None or context is None else live * context
    cache = _num(r.get("gpu_cache_tokens"))
    external = _num(r.get("external_hit_tokens")) or 0.0
    if kv is not None and kv >= NEAR_FULL_PCT:
        return True, f"KV usage reached {kv:.0f} %"
    if held is not None and cache and held > cache:
        return True, f"the live history ({held:.0f} tokens) exceeds the GPU prefix cache ({cache:.0f})"
    if external > 0 and _cell_sharing(r) is False:
        return True, "external hits came while every user stayed on one replica"
    if kv is None:
        return None, ""
    return False, f"KV usage peaked at {kv:.0f} %, below {NEAR_FULL_PCT:.0f} %"


def _flag(v: Any) -> bool | None:
    """A summary flag as True/False; None where it is null."""
    return None if v is None or pd.isna(v) else bool(v)


def _num(v: Any) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def _evidence_text(rows: pd.DataFrame) -> tuple[bool | None, bool | None, str]:
    """(GPU capacity exceeded, cross-replica sharing, the words): which of the two made offload work,
    history retained beyond the GPU cache or replicas reading each other's KV from one LMCache server."""
    verdicts = [_cell_exceeded(r) for _, r in rows.iterrows()]
    exceeded = _any_of([v for v, _ in verdicts])
    sharing = _any_of([_cell_sharing(r) for _, r in rows.iterrows()])
    external = sum(_known(rows, "external_hit_tokens"))
    parts = []
    if exceeded is True:
        why = "; ".join(dict.fromkeys(w for v, w in verdicts if v))
        parts.append(f"history was retained beyond the GPU cache ({why})")
    elif exceeded is False:
        why = "; ".join(dict.fromkeys(w for _, w in verdicts))
        parts.append(f"GPU capacity was never exceeded ({why})")
    if sharing is True and external > 0:
        moved = sum(_known(rows, "users_on_several_replicas"))
        users = sum(_known(rows, "routed_users"))
        n = max((replicas(r) or 0) for _, r in rows.iterrows())
        only = exceeded is False and external
        source = "so its external hits came from" if only else "external hits include"
        parts.append(
            f"{source} cross-replica sharing ({moved:.0f} of {users:.0f} users' rounds moved between "
            f"the {n} replicas that share one LMCache server)"
        )
    return exceeded, sharing, ", ".join(parts)


# --- end offload evidence ---


# --- engine build and model name (issue 34, capacity/recommendation branch) -------------------------
CPU_BUILD_NOTE = (
    "engines: vLLM's CPU build, with LMCache moving KV through its engine-driven CPU copy path (no GPU, "
    "no CUDA transfer), so this figure shows how the tiers rank on this lab's CPU plumbing, not what "
    "offload does on a GPU server"
)


def engine_build(software: pd.DataFrame | None, cells: set[str]) -> str | None:
    """ "cpu" when any of `cells` ran vLLM's CPU build (the software frame marks it "(cpu build)"),
    else None (a GPU build, the simulator, or no software recorded)."""
    if software is None or software.empty or not {"cell_id", "item", "version"} <= set(software.columns):
        return None
    mine = software[software["cell_id"].astype(str).isin(cells) & (software["item"] == "vllm")]
    return "cpu" if mine["version"].astype(str).str.contains("cpu build", regex=False).any() else None


def served_name(model: str) -> str:
    """The name a model is served and known by: a model loaded from a folder (an absolute or ./ path)
    is served under the folder's name (LabConfig.served_model_name); a hub id stays as it is."""
    if model.startswith(("/", "./", "../", "~")):
        return model.rstrip("/").rsplit("/", 1)[-1] or model
    return model


# --- end engine build and model name -----------------------------------------------------------------


def _reasons(
    rows: pd.DataFrame, warnings: pd.DataFrame, labels: set[str], software: pd.DataFrame | None
) -> tuple[list[str], list[str]]:
    """(why not comparable, caveats) of one pooled group, from its group warnings (which name the cells
    at fault) and the cell warnings of its cells, and from the software its cells ran."""
    cells = set(rows["cell_id"].astype(str))
    reasons: list[str] = []
    caveats: list[str] = []
    # A cell alone in its repeat's group (say its gpu cell is missing) gets no cells_not_clean group
    # warning (that needs two cells), yet pools into this finding: its fault, failed requests, flaps or
    # restarts are a reason here. (sessions_missing and routing_breach are group warnings of any group.)
    counts = pd.Series([group_label(r) for _, r in rows.iterrows()]).value_counts()
    for _, r in rows.iterrows():
        unclean = unclean_reason(r) if counts[group_label(r)] == 1 else None
        if unclean:
            reasons.append(unclean)
    if not warnings.empty:
        groups = warnings[(warnings["scope"] == "group") & warnings["group"].isin(labels)]
        for _, w in groups.iterrows():
            if w["kind"] in INVALIDATING:
                reasons.append(str(w["message"]).removeprefix("not comparable: "))
        mine = warnings[(warnings["scope"] == "cell") & warnings["cell_id"].isin(cells)]
        for _, w in mine.iterrows():
            if w["kind"] in CAVEATS:
                caveats.append(f"{w['cell_id']}: {w['message']}")
    splits = version_splits(software, cells) if software is not None else pd.DataFrame()
    if not splits.empty:
        reasons.append(f"software differs between its cells ({', '.join(sorted(set(splits['item'])))})")
    return list(dict.fromkeys(reasons)), list(dict.fromkeys(caveats))


def _display_group(first: pd.Series) -> str:
    """The group's label without its repeat, the model named by its served name."""
    label = group_label(first).rsplit(" repeat=", 1)[0]
    model = str(first["model"])
    return served_name(model) + label.removeprefix(model) if label.startswith(model) else label


def group_findings(
    rows: pd.DataFrame,
    warnings: pd.DataFrame,
    requests: Mapping[str, pd.DataFrame],
    software: pd.DataFrame | None = None,
    replicates: int = bootstrap.REPLICATES,
    min_sessions: int = bootstrap.MIN_SESSIONS,
) -> list[Finding]:
    """The findings of one pooled group (rows of tier_comparison sharing FINDING_KEYS)."""
    first = rows.iloc[0]
    labels = {group_label(r) for _, r in rows.iterrows()}
    reasons, caveats = _reasons(rows, warnings, labels, software)
    comparable = bool(rows["comparable"].fillna(True).astype(bool).all()) and not reasons
    empty = pd.DataFrame(columns=["user_id", "round", "status", "ttft_s"])

    def cells_of(tier: str) -> list[pd.DataFrame]:
        return [requests.get(str(c), empty) for c in rows.loc[rows["tier"] == tier, "cell_id"]]

    base = cells_of("gpu") if (rows["tier"] == "gpu").any() else []
    base_repeats = int((rows["tier"] == "gpu").sum())
    spreads = noise.cpu_spreads(rows)
    wide = [s.text() for s in spreads if s.wide]
    caveats = caveats + wide
    build = engine_build(software, set(rows["cell_id"].astype(str)))
    where = f"at concurrency {int(first['concurrency'])}, num_rounds {int(first['num_rounds'])}"
    out = []
    for tier in [t for t in TIERS if (rows["tier"] == t).any()]:
        mine_rows = rows[rows["tier"] == tier]
        mine = cells_of(tier)
        p50 = bootstrap.later_percentile(mine, 50, replicates, min_sessions=min_sessions)
        p95 = bootstrap.later_percentile(mine, 95, replicates, min_sessions=min_sessions)
        vs_gpu = bool(base) and tier != "gpu"
        c50 = bootstrap.change_pct(mine, base, 50, replicates, min_sessions=min_sessions) if vs_gpu else None
        c95 = bootstrap.change_pct(mine, base, 95, replicates, min_sessions=min_sessions) if vs_gpu else None
        l1, l2 = _sum(mine_rows, "lmcache_l1_hit_tokens"), _sum(mine_rows, "lmcache_l2_hit_tokens")
        hits = (l1 or 0.0) + (l2 or 0.0)
        l1_share = l1 / hits if l1 is not None and hits > 0 else None
        l2_share = l2 / hits if l2 is not None and hits > 0 else None
        gpu_share, lmc_share = (
            _mean(mine_rows, "gpu_prefix_token_share"),
            _mean(mine_rows, "lmcache_token_share"),
        )
        exercised = _exercised(mine_rows) if tier in OFFLOAD_TIERS else None
        exceeded, sharing, evidence = _evidence_text(mine_rows) if tier in OFFLOAD_TIERS else (None, None, "")
        routing = _routing(mine_rows)
        later = (
            f"later-round p50 TTFT {_seconds(p50.estimate)}"
            + (
                f" (95 % CI {p50.low:.3g}-{p50.high:.3g} s)"
                if p50.low is not None and p50.high is not None
                else f" ({_too_few(p50)})"
                if p50.too_few_sessions
                else ""
            )
            + f", p95 {_seconds(p95.estimate)}"
        )
        if tier == "gpu":
            text = f"gpu (the baseline) {where}: {later}"
            sources = _sources_text(gpu_share, None, None, None)
        elif c50 is None:
            text = f"{tier} {where}: no gpu cell to compare against; {later}"
            sources = _sources_text(gpu_share, lmc_share, l1_share, l2_share)
        else:
            text = (
                f"{tier} {_change_text('later-round p50 TTFT', c50)} "
                f"against gpu {where}"
                f" (p95: {_p95_text(c95)})"
            )
            said = _noise_text(c50, len(mine_rows), base_repeats, wide)
            text += f"; {said}" if said else ""
            sources = _sources_text(gpu_share, lmc_share, l1_share, l2_share)
        if tier in OFFLOAD_TIERS:
            if exercised is True:
                text += "; offload was exercised" + (f": {sources}" if sources else "")
                text += f"; {evidence}" if evidence else ""
            elif exercised is False:
                text += f"; {_not_exercised_text(mine_rows)}"
            else:
                text += (
                    "; whether offload was exercised is unknown (no KV usage, eviction or external-hit data)"
                )
        elif sources:
            text += f"; {sources}"
        l1_oom = l1_oom_warning(mine_rows) if tier in OFFLOAD_TIERS else None
        if l1_oom is not None:
            text += f"; warning: {l1_oom}"
        if routing:
            text += f"; routing {routing}"
        if build == "cpu":
            text += f"; {CPU_BUILD_NOTE}"
        if not comparable:
            text = (
                "NOT A VALID COMPARISON ("
                + "; ".join(reasons or ["see the validity warnings"])
                + "). "
                + text
            )
        out.append(
            Finding(
                group=_display_group(first),
                model=str(first["model"]),
                concurrency=int(first["concurrency"]),
                num_rounds=int(first["num_rounds"]),
                isl=int(first["isl"]),
                osl=str(first["osl"]),
                tier=tier,
                cells=sorted(mine_rows["cell_id"].astype(str)),
                repeats=len(mine_rows),
                comparable=comparable,
                not_comparable_reasons=reasons,
                caveats=caveats,
                offload_exercised=exercised,
                later_p50_s=p50.estimate,
                later_p50_ci_s=p50.as_list(),
                later_p95_s=p95.estimate,
                later_p95_ci_s=p95.as_list(),
                p50_change_vs_gpu_pct=None if c50 is None else c50.estimate,
                p50_change_ci_pct=None if c50 is None else c50.as_list(),
                p95_change_vs_gpu_pct=None if c95 is None else c95.estimate,
                p95_change_ci_pct=None if c95 is None else c95.as_list(),
                sessions=p50.sessions,
                gpu_prefix_token_share=gpu_share,
                lmcache_token_share=lmc_share,
                lmcache_l1_hit_share=l1_share,
                lmcache_l2_hit_share=l2_share,
                routing=routing,
                statement=text + ".",
                gpu_capacity_exceeded=exceeded,
                cross_replica_sharing=sharing,
                p50_verdict=None if c50 is None else p50_verdict(c50.as_list()),
                p50_within_noise=None if c50 is None else noise.within_noise(c50.as_list()),
                repeats_to_separate=None
                if c50 is None
                else noise.repeats_to_separate(
                    c50.estimate, c50.as_list(), min(len(mine_rows), base_repeats)
                ),
                gpu_repeats=base_repeats if vs_gpu else None,
                one_repeat=noise.one_repeat(len(mine_rows), base_repeats if vs_gpu else None),
                cpu_spread=[s.as_dict() for s in spreads],
                l2_prefetch_l1_oom=_any_of(
                    [_flag(v) for v in mine_rows.get("lmcache_l2_prefetch_l1_oom", [])]
                )
                if tier in OFFLOAD_TIERS
                else None,
                l2_prefetch_failed_l1_oom_chunks=_sum(mine_rows, "lmcache_l2_prefetch_failed_l1_oom_chunks"),
            )
        )
    return out


def findings(
    comparison: pd.DataFrame,
    warnings: pd.DataFrame,
    requests: Mapping[str, pd.DataFrame],
    software: pd.DataFrame | None = None,
    replicates: int = bootstrap.REPLICATES,
    min_sessions: int = bootstrap.MIN_SESSIONS,
) -> list[Finding]:
    """Every finding of a campaign, groups in summary order, tiers gpu, cpu, nvme."""
    out: list[Finding] = []
    if comparison.empty:
        return out
    for _, rows in comparison.groupby(FINDING_KEYS, sort=False, dropna=False):
        out.extend(group_findings(rows, warnings, requests, software, replicates, min_sessions))
    return out


def by_group(items: Sequence[Finding]) -> dict[str, list[Finding]]:
    """Findings keyed by their group label, in order."""
    out: dict[str, list[Finding]] = {}
    for f in items:
        out.setdefault(f.group, []).append(f)
    return out
