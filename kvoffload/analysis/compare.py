"""Comparison rules and validity warnings (docs/metrics.md), over summary rows.

A tier comparison holds model, concurrency, num_rounds, ISL, OSL and repeat fixed (GROUP_KEYS).
Cells of a group whose session counts (achieved, complete, error, incomplete) differ, or any of which
had a failed request, a fault (cell.json `valid: false`: a replica or lmcache-server that went
down mid-replay), a Caddy upstream flap, a restart of one of our units (analysis/health.py) or lost
request records (requests.jsonl holds fewer than sessions.json counts sent) make the group not
comparable; an offload tier
cell whose KV usage never came near full (< NEAR_FULL_PCT), with no LMCache eviction and no external
prefix-cache hit, is flagged "offload never exercised". Cell warnings cover concurrency above the
virtual-user ceiling, zero virtual users, unfinished cells, failed requests, scrape gaps, absent
engine metrics and the before/after fallback. When the hosts of one role ran another version of vLLM,
LMCache, this package, torch, Caddy or the GPU driver in some cells (software.COMPARED_ITEMS), the
campaign gets a "software_differs" warning and the groups holding both versions are not comparable.
A cell without sessions.json (its session counts unknown, never assumed equal to the group's) and a
cell whose request records breach the routing the tier requires (ROUTING_RULES) make their group not
comparable too. `compare_campaigns` applies the cell rules to each campaign's cell and asks the
matched cells for equal session counts. docs/metrics.md "Validity rules" lists every rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from kvoffload.analysis.lmcache import L1_OOM
from kvoffload.analysis.nodes import (
    client_differences,
    client_warning_text,
    node_differences,
    node_warning_text,
)
from kvoffload.analysis.noise import cpu_warnings
from kvoffload.analysis.software import version_splits
from kvoffload.tiers import LMCACHE_REGISTRATION_GRACE_S

GROUP_KEYS = ["model", "concurrency", "num_rounds", "isl", "osl", "repeat"]
MATCH_KEYS = ["tier", *GROUP_KEYS]
NEAR_FULL_PCT = 90.0
OFFLOAD_TIERS = ("cpu", "nvme")
WARNING_COLUMNS = ["scope", "cell_id", "group", "kind", "message"]


def group_label(row: pd.Series | dict[str, Any]) -> str:
    """Human label of a comparison group."""
    label = (
        f"{row['model']} c={row['concurrency']} rounds={row['num_rounds']} "
        f"isl={row['isl']} osl={row['osl']} repeat={row['repeat']}"
    )
    node = row.get("node")
    return f"{label} on {node}" if isinstance(node, str) and node else label


def as_float(v: Any) -> float | None:
    """A known number as float; None for None or NaN."""
    return None if v is None or pd.isna(v) else float(v)


def _is_zero_or_none(v: Any) -> bool:
    return v is None or pd.isna(v) or float(v) == 0.0


def _w(scope: str, cell_id: str | None, group: str, kind: str, message: str) -> dict[str, Any]:
    return {"scope": scope, "cell_id": cell_id, "group": group, "kind": kind, "message": message}


def _count(row: pd.Series, key: str) -> int:
    value = row.get(key)
    return 0 if value is None or pd.isna(value) else int(value)


def _client_clock_warnings(row: pd.Series, cid: str, grp: str) -> list[dict[str, Any]]:
    """The replay client's own say on its TTFT stamps: late (it could not keep up) or read-time."""
    out = []
    ok = _count(row, "requests_ok")
    late = _count(row, "requests_late")
    if late:
        out.append(
            _w(
                "cell",
                cid,
                grp,
                "client_late",
                f"{late} of {ok} ok requests read their first token together with a later one: the client "
                "could not keep up, and their TTFT may be too long by up to one inter-token gap "
                "(late_s in requests.jsonl); replay with fewer streams per client core",
            )
        )
    read = _count(row, "requests_read_stamped")
    if read:
        out.append(
            _w(
                "cell",
                cid,
                grp,
                "read_stamped",
                f"{read} of {ok} ok requests have TTFT stamped when the client read the token, not when "
                "the kernel received it (https, a proxy or no kernel stamps): the client's own lateness "
                "is in their TTFT",
            )
        )
    return out


def attribution_mismatch(row: pd.Series) -> str | None:
    """Why a cell's per-request token sources are not to be trusted (their sums and the counters differ
    beyond analysis/attribution.py's tolerance), or None."""
    names = row.get("attrib_mismatch")
    if not isinstance(names, str) or not names:
        return None
    parts = [f"{n} {float(row.get(f'attrib_{n}_diff') or 0.0):+.0f}" for n in names.split(",")]
    return (
        "the per-request token sources disagree with the counters beyond the tolerance (per-request sum "
        f"less counter: {', '.join(parts)}): the turn-by-turn attribution of this cell is not trustworthy"
    )


def _sum_of(rows: pd.DataFrame, column: str) -> float | None:
    """The sum of a column's known values; None when none is known (or the column is absent)."""
    if column not in rows:
        return None
    known = pd.to_numeric(rows[column], errors="coerce").dropna()
    return float(known.sum()) if len(known) else None


def _l1_pool_text(rows: pd.DataFrame) -> str:
    """ "the 0.125 GiB L1 pool" of a tier's cells, from what they record: cell.json config (null: the
    lmcache profile's size), else the server's own figure; "the L1 pool" when neither says."""
    gb = _sum_of(rows.head(1), "lmcache_l1_size_gb")
    if gb is not None:
        return f"the {gb:g} GiB L1 pool"
    server = _sum_of(rows.head(1), "lmcache_l1_capacity_bytes")
    if server is not None:
        return f"the {server / 2**30:.3g} GiB L1 pool (as lmcache-server reports it)"
    return "the L1 pool"


def l1_oom_warning(rows: pd.DataFrame) -> str | None:
    """Why the offload of some cells of one tier fell short for lack of room in L1, summed over them:
    L2 prefetches that failed with `reason="l1_oom"` (summary `lmcache_l2_prefetch_failed_l1_oom_chunks`)
    of the L2 loads tried (loaded + failed), and the fix; None when none failed or nothing says."""
    failed = _sum_of(rows, "lmcache_l2_prefetch_failed_l1_oom_chunks")
    if not failed:
        return None
    tier = str(rows["tier"].iloc[0])
    loaded = _sum_of(rows, "lmcache_l2_loaded_chunks")
    any_reason = _sum_of(rows, "lmcache_l2_prefetch_failed_chunks")
    tried = None if loaded is None or any_reason is None else loaded + any_reason
    of = f" of {tried:.0f} ({100 * failed / tried:.0f} %)" if tried else ""
    return (
        f"{failed:.0f}{of} L2 chunk loads failed for lack of room in {_l1_pool_text(rows)} (LMCache's "
        f'l2_prefetch_failure_chunks{{reason="{L1_OOM}"}}): they were not served from the cache, the '
        f"engine prefilled them again, so the {tier} tier was measured with an L1 too small to stage its L2 "
        f"loads; give it a larger L1 (the campaign's lmcache_l1_size_gb.{tier})"
    )


def cell_warnings(row: pd.Series) -> list[dict[str, Any]]:
    """Validity warnings of one summary row."""
    out = []
    cid, grp = str(row["cell_id"]), group_label(row)
    out.extend(_client_clock_warnings(row, cid, grp))
    users = row.get("virtual_users_available")
    if users is not None and not pd.isna(users):
        if int(users) == 0:
            out.append(
                _w(
                    "cell",
                    cid,
                    grp,
                    "no_virtual_users",
                    f"the dataset yields 0 virtual users at num_rounds={row['num_rounds']}: nothing was "
                    "replayed (the generic loader needs at least 5 rounds per chunk)",
                )
            )
        elif int(row["concurrency"]) > int(users):
            out.append(
                _w(
                    "cell",
                    cid,
                    grp,
                    "concurrency_above_ceiling",
                    f"concurrency {row['concurrency']} exceeds the {int(users)} virtual users available at "
                    f"num_rounds={row['num_rounds']}: at most {int(users)} sessions ran at once, the extra "
                    "slots added no load",
                )
            )
    else:
        msg = "sessions.json is missing: session counts unknown"
        out.append(_w("cell", cid, grp, "no_sessions_file", msg))
    if row["status"] != "done" or not bool(row["done"]):
        out.append(
            _w(
                "cell",
                cid,
                grp,
                "cell_not_done",
                f"cell status is {row['status']!r} (DONE {'present' if row['done'] else 'absent'}): "
                "its figures cover a partial run",
            )
        )
    if not _valid(row):
        reasons = row.get("invalid_reasons") or "no reason recorded"
        out.append(_w("cell", cid, grp, "cell_faulted", f"not valid: {reasons}"))
    failed = row.get("failed_requests")
    if failed is not None and not pd.isna(failed) and int(failed) > 0:
        msg = f"{int(failed)} requests failed (error or timeout)"
        out.append(_w("cell", cid, grp, "failed_requests", msg))
    if _positive(row, "requests_lost"):
        sent, lost = _count(row, "requests_sent"), _count(row, "requests_lost")
        out.append(
            _w(
                "cell",
                cid,
                grp,
                "requests_lost",
                f"not valid: cells/{cid}/requests.jsonl holds {sent - lost} request records where "
                f"cells/{cid}/sessions.json counts {sent} requests sent ({lost} lost: the file was cut or "
                "damaged): its client figures cover part of the run, and the cell enters no comparison",
            )
        )
    if int(row.get("scrape_failures") or 0) > 0:
        out.append(
            _w(
                "cell",
                cid,
                grp,
                "scrape_gaps",
                f"{int(row['scrape_failures'])} of {int(row['scrapes'])} scrapes failed "
                f"(targets: {row['scrape_failed_targets']}); figures use the samples that exist",
            )
        )
    if _positive(row, "caddy_upstream_flaps"):
        out.append(
            _w(
                "cell",
                cid,
                grp,
                "caddy_upstream_flaps",
                f"Caddy marked a replica unhealthy {int(row['caddy_upstream_flaps'])} time(s) during the "
                "replay "
                f"(upstreams {row.get('caddy_flapped_upstreams')}): requests went to fewer replicas",
            )
        )
    if _positive(row, "unit_restarts"):
        ours = _positive(row, "service_restarts")
        out.append(
            _w(
                "cell",
                cid,
                grp,
                "unit_restarted",
                f"systemd restarted units (NRestarts): {row.get('restarted_units')}"
                + (
                    ": the server restarted, its cache went cold"
                    if ours
                    else " (exporters only: figures from them may have gaps)"
                )
                + (
                    "; a replica that restarted may leave its old registration holding its KV pool in "
                    f"lmcache-server for up to {LMCACHE_REGISTRATION_GRACE_S} s (LMCache reaps a worker "
                    "that never pinged only after that grace), so offload capacity was smaller for the rest "
                    "of the cell"
                    if row.get("tier") in ("cpu", "nvme")
                    and "kvoffload-vllm@" in str(row.get("restarted_units"))
                    else ""
                ),
            )
        )
    l1_oom = l1_oom_warning(pd.DataFrame([row]))
    if l1_oom is not None:
        out.append(_w("cell", cid, grp, "l2_prefetch_l1_oom", l1_oom))
    mismatch = attribution_mismatch(row)
    if mismatch is not None:
        out.append(_w("cell", cid, grp, "attribution_mismatch", mismatch))
    if row.get("local_hit_rate_source") is None and row.get("kv_usage_source") is None:
        msg = "no vLLM metrics were sampled: hit rates and KV usage unknown"
        out.append(_w("cell", cid, grp, "no_engine_metrics", msg))
    for key in ("local_hit_rate_source", "external_hit_rate_source", "kv_usage_source"):
        if row.get(key) == "snapshots":
            out.append(
                _w(
                    "cell",
                    cid,
                    grp,
                    "fallback_before_after",
                    f"{key.removesuffix('_source')} comes from the before/after snapshots: "
                    + _fallback_cause(row),
                )
            )
    return out


def _fallback_cause(row: pd.Series) -> str:
    """Why a figure of this row fell back to the snapshots, from what the row measured: the summary
    keeps such a figure only for a replay shorter than two of its sampler's intervals (analysis/
    summary.py) and nulls it otherwise. Issue 43: the old text said "shorter than one sampling
    interval" of replays that lasted several."""
    run_s, interval = (as_float(row.get(k)) for k in ("run_s", "sample_interval_s"))
    if run_s is not None and interval is not None:
        return (
            f"the {run_s:.1f} s replay lasted less than two sampling intervals ({interval:.3g} s each), "
            "too few sampler rounds for a figure over them"
        )
    if interval is None:
        return "fewer than two sampler rounds" + ("" if run_s is None else f" over the {run_s:.1f} s replay")
    return "no request record gives the replay window, and the sampler rounds gave no figure"


def offload_exercised(row: pd.Series) -> bool | None:
    """True/False for an offload-tier cell; None when no metric could tell."""
    kv = row.get("kv_usage_max_pct")
    ev, ext = row.get("lmcache_evicted_chunks"), row.get("external_hit_tokens")
    known = [v for v in (kv, ev, ext) if v is not None and not pd.isna(v)]
    if not known:
        return None
    near_full = kv is not None and not pd.isna(kv) and float(kv) >= NEAR_FULL_PCT
    return bool(near_full or not _is_zero_or_none(ev) or not _is_zero_or_none(ext))


_OUTCOME_COLUMNS = {
    "achieved_sessions": "achieved",
    "sessions_complete": "complete",
    "sessions_error": "error",
    "sessions_incomplete": "incomplete",
}


def _outcome_text(row: pd.Series) -> str:
    """ "100 achieved, 98 complete, 2 error" of one cell (known counts only; "" when none is known)."""
    known = [(word, row.get(col)) for col, word in _OUTCOME_COLUMNS.items()]
    return ", ".join(f"{int(v)} {word}" for word, v in known if v is not None and not pd.isna(v))


def session_outcomes(group: pd.DataFrame) -> dict[str, str]:
    """tier -> "100 achieved, 98 complete, 2 error" for each cell of a group (known counts only)."""
    out: dict[str, str] = {}
    for i, (_, row) in enumerate(group.iterrows()):
        text = _outcome_text(row)
        if text:
            out[str(row["tier"]) if row["tier"] not in out else f"{row['tier']} #{i}"] = text
    return out


def _valid(row: pd.Series) -> bool:
    """False only for a cell that cell.json marks invalid (a fault); unknown counts as valid."""
    value = row.get("valid")
    return value is None or bool(pd.isna(value)) or bool(value)


def _positive(row: pd.Series, key: str) -> bool:
    value = row.get(key)
    return value is not None and not pd.isna(value) and int(value) > 0


def _clean(group: pd.DataFrame) -> list[bool]:
    """Per cell: valid (no fault), no failed request, no Caddy upstream flap, no restart of our units."""
    return [_valid(row) and not any(_positive(row, k) for k in CLEAN_COUNTS) for _, row in group.iterrows()]


def _unclean_text(row: pd.Series) -> str:
    """What made one cell not clean, e.g. "1 failed request(s), 2 Caddy upstream flap(s)"."""
    parts = [] if _valid(row) else [f"a fault ({row.get('invalid_reasons') or 'no reason recorded'})"]
    for key, what in zip(
        CLEAN_COUNTS,
        ("failed request(s)", "Caddy upstream flap(s)", "service restart(s)", "request record(s) lost"),
        strict=True,
    ):
        if _positive(row, key):
            parts.append(f"{int(row[key])} {what}")
    return ", ".join(parts)


# Counts of a summary row that make its cell not clean when positive (`requests_lost`: records of sent
# requests missing from requests.jsonl, analysis/summary.py).
CLEAN_COUNTS = ("failed_requests", "caddy_upstream_flaps", "service_restarts", "requests_lost")


# --- validity: missing session counts and routing (docs/metrics.md "Validity rules") ---
# The routing each tier requires with two or more replicas, as the findings name it.
ROUTING_RULES = {
    "gpu": "each user's rounds from one replica (sticky by X-User-Id)",
    "cpu": "traffic on more than one replica (least_conn)",
    "nvme": "traffic on more than one replica (least_conn)",
}


def sessions_missing(row: pd.Series) -> bool:
    """True for a cell without sessions.json: its session counts are unknown."""
    value = row.get("achieved_sessions")
    return value is None or bool(pd.isna(value))


def _known_int(row: pd.Series, key: str) -> int | None:
    value = row.get(key)
    return None if value is None or pd.isna(value) else int(value)


def replicas(row: pd.Series) -> int | None:
    """Replicas of one cell: those it sampled (cell.json targets), else those its records name."""
    configured = _known_int(row, "replicas_configured")
    return configured if configured is not None else _known_int(row, "replicas_answering")


def routing_breach(row: pd.Series) -> str | None:
    """Why one cell's request records breach its tier's routing rule (None: held or not checkable).

    gpu with 2+ replicas: a user whose records name more than one replica; cpu/nvme with 2+ replicas:
    records that name only one replica."""
    n = replicas(row)
    answering = _known_int(row, "replicas_answering")
    if n is None or n < 2 or not answering:
        return None
    tier = str(row["tier"])
    if tier == "gpu":
        split = _known_int(row, "users_on_several_replicas") or 0
        if split:
            return (
                f"routing breached in gpu {row['cell_id']}: {split} of {_known_int(row, 'routed_users')} "
                f"users' rounds came from more than one of its {n} replicas (the gpu tier needs "
                f"{ROUTING_RULES['gpu']}: a user's history sits in one replica's prefix cache)"
            )
    elif tier in OFFLOAD_TIERS and answering < 2:
        return (
            f"routing breached in {tier} {row['cell_id']}: every request went to one of its {n} replicas "
            f"(the {tier} tier needs {ROUTING_RULES[tier]})"
        )
    return None


def routing_unchecked(row: pd.Series) -> str | None:
    """Why routing could not be checked in a cell of 2+ replicas (its records name no replica)."""
    n = _known_int(row, "replicas_configured")
    if n is not None and n >= 2 and not _known_int(row, "replicas_answering"):
        return f"the request records name no replica: the routing of its {n} replicas could not be checked"
    return None


def routing_check_text(rows: pd.DataFrame) -> str | None:
    """What the records show of the routing of some cells of one tier, e.g. "held: each of 32 users'
    rounds came from one replica of 2"; None when no cell has 2+ replicas named in its records."""
    checked = [
        r for _, r in rows.iterrows() if (replicas(r) or 0) >= 2 and _known_int(r, "replicas_answering")
    ]
    if not checked:
        return None
    if any(routing_breach(r) for r in checked):
        return "breached (see why above)"
    tier = str(checked[0]["tier"])
    n = max(replicas(r) or 0 for r in checked)
    if tier == "gpu":
        users = sum(_known_int(r, "routed_users") or 0 for r in checked)
        return f"held: each of {users} users' rounds came from one replica of {n}"
    answering = min(_known_int(r, "replicas_answering") or 0 for r in checked)
    return f"held: traffic reached {answering} of {n} replicas"


def unclean_reason(row: pd.Series) -> str | None:
    """ "cpu c1 did not run clean (a fault (...), 3 failed request(s))", or None for a clean cell."""
    if _clean(pd.DataFrame([row]))[0]:
        return None
    return f"{row['tier']} {row['cell_id']} did not run clean ({_unclean_text(row)})"


def cell_invalid_reasons(row: pd.Series) -> list[str]:
    """Why one cell cannot enter any comparison: not clean, no session counts, routing breached."""
    unclean = unclean_reason(row)
    out = [] if unclean is None else [unclean]
    if sessions_missing(row):
        out.append(f"{row['tier']} {row['cell_id']} has no sessions.json: its session counts are unknown")
    breach = routing_breach(row)
    if breach:
        out.append(breach)
    return out


def _sessions_missing_warning(group: pd.DataFrame, grp: str) -> list[dict[str, Any]]:
    missing = [f"{r['tier']} {r['cell_id']}" for _, r in group.iterrows() if sessions_missing(r)]
    if not missing:
        return []
    text = (
        f"not comparable: sessions.json is missing for {', '.join(missing)}: session counts unknown, "
        "so whether the tiers replayed the same sessions cannot be told"
    )
    return [_w("group", None, grp, "sessions_missing", text)]


def _routing_warnings(group: pd.DataFrame, grp: str) -> list[dict[str, Any]]:
    out = []
    for _, row in group.iterrows():
        breach = routing_breach(row)
        if breach:
            out.append(_w("group", str(row["cell_id"]), grp, "routing_breach", f"not comparable: {breach}"))
        unchecked = routing_unchecked(row)
        if unchecked:
            out.append(_w("cell", str(row["cell_id"]), grp, "routing_unchecked", unchecked))
    return out


# --- end validity: missing session counts and routing ---


def group_warnings(group: pd.DataFrame) -> list[dict[str, Any]]:
    """Warnings about one comparison group (session counts, offload exercise)."""
    out = []
    grp = group_label(group.iloc[0])
    out.extend(_sessions_missing_warning(group, grp))
    out.extend(_routing_warnings(group, grp))
    outcomes = session_outcomes(group)
    if len(group) > 1 and len(set(outcomes.values())) > 1:
        detail = "; ".join(f"{t}: {o}" for t, o in outcomes.items())
        out.append(
            _w("group", None, grp, "sessions_differ", f"not comparable: session counts differ ({detail})")
        )
    faulty = [
        (str(r["tier"]), r) for (_, r), ok in zip(group.iterrows(), _clean(group), strict=True) if not ok
    ]
    if len(group) > 1 and faulty:
        detail = "; ".join(f"{tier} {row['cell_id']}: {_unclean_text(row)}" for tier, row in faulty)
        out.append(
            _w(
                "group",
                None,
                grp,
                "cells_not_clean",
                f"not comparable: the {', '.join(t for t, _ in faulty)} cell(s) did not run clean ({detail})",
            )
        )
    for _, row in group[group["tier"].isin(OFFLOAD_TIERS)].iterrows():
        exercised = offload_exercised(row)
        if exercised is False:
            kv = row.get("kv_usage_max_pct")
            kv_text = "unknown" if kv is None or pd.isna(kv) else f"{float(kv):.0f}%"
            out.append(
                _w(
                    "group",
                    str(row["cell_id"]),
                    grp,
                    "offload_not_exercised",
                    f"offload never exercised in tier {row['tier']}: KV usage peaked at {kv_text} "
                    f"(< {NEAR_FULL_PCT:.0f}%), no LMCache evictions, no external prefix-cache hits; "
                    "this comparison does not measure offloading",
                )
            )
        elif exercised is None:
            out.append(
                _w(
                    "group",
                    str(row["cell_id"]),
                    grp,
                    "offload_unknown",
                    f"tier {row['tier']}: no KV usage, eviction or external-hit metric was sampled, so "
                    "whether offload was exercised is unknown",
                )
            )
    return out


def software_warnings(software: pd.DataFrame) -> list[dict[str, Any]]:
    """One campaign warning per compared item whose version differs between cells on one role's hosts.

    `software` is `analysis.software.software_frame(cells)`.
    """
    splits = version_splits(software)
    out = []
    for (item, roles), split in splits.groupby(["item", "roles"], sort=True):
        detail = "; ".join(f"{v} in {c}" for v, c in zip(split["version"], split["cells"], strict=True))
        out.append(
            _w(
                "campaign",
                None,
                "",
                "software_differs",
                f"not comparable across these cells: {item} differs on the {str(roles).replace(',', ', ')} "
                f"hosts ({detail}); a difference between them may come from the software change",
            )
        )
    return out


def warnings_table(
    summary: pd.DataFrame,
    skipped: Sequence[dict[str, str]] = (),
    software: pd.DataFrame | None = None,
    cells: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Every validity warning of a campaign: skipped cells, software changes (when `software`, the
    `software_frame` of the cells, is given), nodes or client hosts whose hardware differs (when
    `cells`, the cells table, is given), cell warnings, group warnings."""
    rows: list[dict[str, Any]] = [
        _w("cell", s["cell_id"], "", "skipped_cell", f"not ingested: {s['reason']}") for s in skipped
    ]
    if software is not None:
        rows.extend(software_warnings(software))
    if cells is not None:
        text = node_warning_text(node_differences(cells))
        if text is not None:
            rows.append(_w("campaign", None, "", "nodes_differ", text))
        text = client_warning_text(client_differences(cells))
        if text is not None:
            rows.append(_w("campaign", None, "", "clients_differ", text))
    for _, row in summary.iterrows():
        rows.extend(cell_warnings(row))
    if not summary.empty:
        for _, group in summary.groupby(GROUP_KEYS, sort=False, dropna=False):
            rows.extend(group_warnings(group))
        # host CPU that differed widely between a group's cells, repeats pooled (analysis/noise.py)
        rows.extend(cpu_warnings(summary, [k for k in GROUP_KEYS if k != "repeat"], group_label))
    return pd.DataFrame(rows, columns=WARNING_COLUMNS)


# The change vs gpu of the comparison table: later-round (round >= 2) TTFT percentiles, the figures
# beside it and the ones the findings compare (analysis/findings.py, bootstrap.change_pct's estimate);
# an all-rounds change beside later-round values read as a contradiction (issue 43).
VS_GPU = {"p50": "ttft_later_p50_s", "p95": "ttft_later_p95_s"}


def vs_gpu_column(q: str) -> str:
    """The tier_comparison column of the later-round TTFT percentile `q` ("p50", "p95") vs gpu (%)."""
    return f"ttft_later_{q}_vs_gpu_pct"


def tier_comparison(summary: pd.DataFrame, software: pd.DataFrame | None = None) -> pd.DataFrame:
    """Summary rows with per-group later-round TTFT change vs the gpu cell of the group (%,
    `ttft_later_p50_vs_gpu_pct`, `ttft_later_p95_vs_gpu_pct`) and a `comparable` flag.

    A group is not comparable when its achieved session counts differ or are unknown for a cell (no
    sessions.json), when a cell breached its tier's routing (`routing_breach`), when a cell of a group
    of two or more did not run clean, or when `software` (the `software_frame` of the cells) shows a
    compared item at another version in some of its cells.
    """
    if summary.empty:
        return summary.assign(**{vs_gpu_column(q): [] for q in VS_GPU}, comparable=[])
    parts = []
    for _, group in summary.groupby(GROUP_KEYS, sort=False, dropna=False):
        g = group.copy()
        base = g[g["tier"] == "gpu"]
        for q, col in VS_GPU.items():
            ref = base[col].iloc[0] if len(base) and col in g else None
            if ref is None or pd.isna(ref) or float(ref) == 0:
                g[vs_gpu_column(q)] = float("nan")
            else:
                g[vs_gpu_column(q)] = 100.0 * (pd.to_numeric(g[col], errors="coerce") / float(ref) - 1.0)
        same_sessions = len(set(session_outcomes(g).values())) <= 1
        same_software = software is None or version_splits(software, g["cell_id"].astype(str)).empty
        counts_known = not any(sessions_missing(r) for _, r in g.iterrows())
        routed = not any(routing_breach(r) for _, r in g.iterrows())
        g["comparable"] = (
            same_sessions and counts_known and routed and same_software and (len(g) == 1 or all(_clean(g)))
        )
        parts.append(g)
    return pd.concat(parts, ignore_index=True)


def compare_campaigns(summaries: Sequence[tuple[str, pd.DataFrame]], figures: Sequence[str]) -> pd.DataFrame:
    """Match cells across campaigns on MATCH_KEYS; one row per match key and figure.

    Columns: the match keys, `figure`, one column per campaign label, `change_pct` of each later
    campaign vs the first (`change_pct_<label>`), then `comparable` and `not_comparable_reasons` (the
    validity rules of one campaign applied across them: every matched cell ran clean, has its session
    counts and kept its tier's routing; the matched cells' session counts are equal; a cell present in
    only some campaigns is not comparable). Cells present in only some campaigns keep NaN there.
    """
    if not summaries:
        return pd.DataFrame()
    long = []
    for label, s in summaries:
        if s.empty:
            continue
        melted = s[MATCH_KEYS + [f for f in figures if f in s.columns]].melt(
            id_vars=MATCH_KEYS, var_name="figure", value_name="value"
        )
        melted["campaign"] = label
        long.append(melted)
    if not long:
        return pd.DataFrame(columns=[*MATCH_KEYS, "figure"])
    table = pd.concat(long, ignore_index=True)
    table["value"] = pd.to_numeric(table["value"], errors="coerce")
    # Observed key combinations only (no cartesian product); figures NaN everywhere drop out.
    wide = table.pivot_table(
        index=[*MATCH_KEYS, "figure"], columns="campaign", values="value", aggfunc="mean"
    )
    labels = [label for label, _ in summaries]
    wide = wide.reindex(columns=labels)
    if len(labels) > 1:
        base = wide[labels[0]]
        for label in labels[1:]:
            wide[f"change_pct_{label}"] = 100.0 * (wide[label] / base.where(base != 0) - 1.0)
    wide.columns.name = None
    out = wide.reset_index()
    reasons = _campaign_reasons(summaries)
    keys = [tuple(k) for k in out[MATCH_KEYS].itertuples(index=False)]
    out["not_comparable_reasons"] = ["; ".join(reasons.get(k, [])) for k in keys]
    out["comparable"] = out["not_comparable_reasons"] == ""
    return out


def _campaign_reasons(summaries: Sequence[tuple[str, pd.DataFrame]]) -> dict[tuple[Any, ...], list[str]]:
    """Per match key: why its cells do not compare across the campaigns (empty list: they do)."""
    cells: dict[tuple[Any, ...], dict[str, pd.Series]] = {}
    for label, s in summaries:
        for _, row in s.iterrows():
            cells.setdefault(tuple(row[k] for k in MATCH_KEYS), {})[label] = row
    labels = [label for label, s in summaries if not s.empty]
    out: dict[tuple[Any, ...], list[str]] = {}
    for key, by_label in cells.items():
        reasons = [f"no matching cell in {label}" for label in labels if label not in by_label]
        for label, row in by_label.items():
            reasons.extend(f"{label}: {r}" for r in cell_invalid_reasons(row))
        outcomes = {label: _outcome_text(row) for label, row in by_label.items()}
        if len(set(outcomes.values())) > 1:
            detail = "; ".join(f"{label}: {text or 'unknown'}" for label, text in outcomes.items())
            reasons.append(f"session counts differ ({detail})")
        out[key] = reasons
    return out
