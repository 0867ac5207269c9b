"""Where each request's prompt came from, per request: GPU prefix cache, LMCache L1 and L2, recomputed.

The inputs are the request records' schema-3 fields (the server's own answer, docs/contracts.md) and the
LMCache server's per-request L1/L2 lookup hits that ingest joins from its log (kvoffload/ingest/
lmcache_log.py). The rules (docs/metrics.md "Per-request attribution"):
- GPU: `vllm_cached_tokens`; in a cell without a KV connector (tier gpu) every cached token is the
  engine's own, so `cached_tokens` there (the only case where a source is read from another field).
- LMCache: `lmcache_loaded_tokens`, the tokens loaded beyond the engine's own hit. Its L2 part is the
  request's L2 lookup hits, at most the loaded tokens; the rest is L1. LMCache's lookup covers the whole
  prefix, the GPU part included; the chunks the engine already held were used last, so under LRU they are
  the ones still in L1, and the chunks read back from L2 fall in the part that had to be loaded.
- Recomputed: prompt tokens less GPU less LMCache.
A request whose server did not say a source has null there, and every derived value of it is null.
Reconciliation compares the per-request sums with the counters' increases over the run. The per-tier
answer is given per comparison group as the findings pool it (model, concurrency, num_rounds, ISL, OSL,
the repeats together) and per node, over the cells the validity rules let into a comparison
(kvoffload/analysis/compare.py), never pooled across them. Costs are a non-negative least-squares fit of
TTFT on the tokens of each source with a session bootstrap (kvoffload/analysis/costfit.py), and each
cost says what the data support: a cost, nothing told from zero, below zero (no cost), or not
estimable with the reason. Retention shows in the hit share against the turn's age: the seconds since
the same user's previous turn ended, in AGE_BUCKETS. Pure: DataFrames in, DataFrames or dicts out; no IO.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import pandas as pd

from kvoffload.analysis import costfit
from kvoffload.analysis import names as N
from kvoffload.analysis.bootstrap import MIN_SESSIONS, REPLICATES
from kvoffload.analysis.compare import OFFLOAD_TIERS, attribution_mismatch, cell_invalid_reasons
from kvoffload.analysis.engine import increase
from kvoffload.analysis.findings import FINDING_KEYS, served_name
from kvoffload.tiers import TIERS

SOURCES = ("gpu", "l1", "l2", "recomputed")
# Where the server does not split the GPU prefix cache from LMCache per request (vLLM 0.32 streams no
# cached_token_stats), the coarser split every tier says: cached tokens other than LMCache L2 hits (GPU
# prefix cache or LMCache L1), LMCache L2 hits, and recomputed tokens.
COARSE = ("cached_other", "l2_hit", "missed")
# Beyond this share of the counter (or one LMCache chunk of 256 tokens, whichever is more) the
# per-request sums and the counters disagree (docs/metrics.md says why).
RECONCILE_TOLERANCE = 0.05
RECONCILE_FLOOR_TOKENS = 256
# A fit needs at least this many requests per coefficient (intercept included).
MIN_PER_COEFFICIENT = 3
# A source's cost needs tokens of it in at least this many requests: with fewer, a handful of requests
# set the coefficient (a tier whose later rounds show "0 %" of L2 hits printed an L2 cost from two). The
# same floor as the sessions an interval needs (bootstrap.MIN_SESSIONS).
MIN_SUPPORT = MIN_SESSIONS


def _num(frame: pd.DataFrame, column: str) -> pd.Series:
    if column not in frame:
        return pd.Series(np.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[column], errors="coerce").astype(float)


def chunk_size(samples: pd.DataFrame) -> float | None:
    """Tokens per LMCache chunk as the server counts its lookup hits: hit tokens over hit keys over the
    run, for each tier whose two counters are there (LMCache creates them at their first hit); None
    without a hit."""
    tokens = keys = 0.0
    for tok, key in (
        (N.LMC_LOOKUP_HIT_L1, N.LMC_LOOKUP_HIT_L1_KEYS),
        (N.LMC_LOOKUP_HIT_L2, N.LMC_LOOKUP_HIT_L2_KEYS),
    ):
        t, k = increase(samples, tok), increase(samples, key)
        if t is not None and k is not None:
            tokens, keys = tokens + t, keys + k
    return tokens / keys if keys > 0 else None


def turn_age(requests: pd.DataFrame) -> pd.Series:
    """Per request: seconds from the end of the same user's previous round (its send time plus its
    latency) to this request's send; NaN for a first round, or where that end is unknown (the previous
    round failed, or is missing). The user's think time and any queueing at the client are in it: it is
    how long the user's history had to survive in the caches."""
    needed = {"user_id", "round", "t_start", "latency_s"}
    if not needed <= set(requests.columns) or requests.empty:
        return pd.Series(np.nan, index=requests.index, dtype=float)
    rounds = _num(requests, "round")
    ends = _num(requests, "t_start") + _num(requests, "latency_s")
    ok = requests["status"] == "ok" if "status" in requests else pd.Series(True, index=requests.index)
    # the end of each user's round, from its successful attempt (a retried round has several records)
    done = pd.DataFrame({"user": requests["user_id"], "round": rounds, "end": ends})[ok & ends.notna()]
    last_end = done.groupby(["user", "round"])["end"].max()
    previous = pd.MultiIndex.from_arrays([requests["user_id"], rounds - 1])
    before = pd.Series(last_end.reindex(previous).to_numpy(), index=requests.index)
    return _num(requests, "t_start") - before


def token_sources(requests: pd.DataFrame, connector: bool, chunk: float | None = None) -> pd.DataFrame:
    """Per ok request: gpu, lmcache, l1, l2, recomputed tokens (NaN where the server did not say).

    `connector`: the cell's replicas have a KV connector (tiers cpu and nvme); without one (gpu), the
    engine's own cache is every cached token. `chunk`: tokens per LMCache chunk (`chunk_size`), which
    turns the L2 hit chunks of the server's log into tokens (None: the L1/L2 split is unknown).
    """
    ok = requests[requests["status"] == "ok"] if "status" in requests else requests
    prompt = _num(ok, "prompt_tokens")
    if connector:
        gpu = _num(ok, "vllm_cached_tokens")
        loaded = _num(ok, "lmcache_loaded_tokens")
    else:
        gpu = _num(ok, "cached_tokens")
        loaded = pd.Series(np.where(gpu.notna(), 0.0, np.nan), index=ok.index)
    l1_chunks, l2_chunks = _num(ok, "lmcache_l1_hit_chunks"), _num(ok, "lmcache_l2_hit_chunks")
    unknown = pd.Series(np.nan, index=ok.index)
    l1_hits = l1_chunks * chunk if chunk is not None else unknown
    l2_hits = l2_chunks * chunk if chunk is not None else unknown
    l2 = np.minimum(l2_hits, loaded) if connector else loaded
    out = pd.DataFrame(
        {
            # the bootstrap's unit: a session (user) within its cell; a record without a user is its own
            "cell": ok["cell_id"].astype(str) if "cell_id" in ok else "",
            "user": ok["user_id"].astype(str) if "user_id" in ok else pd.Series(ok.index, index=ok.index),
            "round": _num(ok, "round"),
            "age_s": turn_age(requests).reindex(ok.index),
            "cached": _num(ok, "cached_tokens"),
            "ttft_s": _num(ok, "ttft_s"),
            "server_ttft_s": _num(ok, "server_ttft_s"),
            "prompt": prompt,
            "gpu": gpu,
            "lmcache": loaded,
            "l1": loaded - l2,
            "l2": l2,
            "recomputed": prompt - gpu - loaded,
            "l1_chunks": l1_chunks,
            "l2_chunks": l2_chunks,
            # LMCache's lookup hits in tokens: its lookup covers the whole prefix, so they include tokens
            # the engine served from its own GPU prefix cache
            "l1_lookup": l1_hits,
            "l2_lookup": l2_hits,
        },
        index=ok.index,
    )
    # The coarse split (COARSE), from what every tier says: the engine's cached tokens (GPU prefix cache
    # and LMCache loads together) with LMCache's L2 hits among them, and the rest recomputed.
    cached = out["cached"]
    l2_hit = (
        np.minimum(l2_hits, cached) if connector else pd.Series(0.0, index=ok.index).where(cached.notna())
    )
    out["l2_hit"] = l2_hit
    out["cached_other"] = cached - l2_hit
    out["missed"] = prompt - cached
    return out


def _sum(values: pd.Series) -> float | None:
    """Sum over requests; None when any is unknown (a partial sum would not reconcile)."""
    return None if values.empty or values.isna().any() else float(values.sum())


def _check(
    per_request: float | None, counter: float | None, floor: float = RECONCILE_FLOOR_TOKENS
) -> dict[str, Any]:
    """`floor`: the absolute tolerance in the counter's unit (one chunk: 256 tokens, or 1 chunk)."""
    if per_request is None or counter is None:
        return {"requests": per_request, "counter": counter, "diff": None, "within": None}
    diff = per_request - counter
    limit = max(RECONCILE_TOLERANCE * abs(counter), floor)
    return {"requests": per_request, "counter": counter, "diff": diff, "within": abs(diff) <= limit}


def reconcile(sources: pd.DataFrame, samples: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per source: the per-request sum, the counter's increase over the run, their difference and
    whether it is within the tolerance (None where either side is unknown)."""
    return {
        "gpu": _check(_sum(sources["gpu"]), increase(samples, N.VLLM_PREFIX_HITS)),
        "lmcache": _check(_sum(sources["lmcache"]), increase(samples, N.VLLM_EXT_HITS)),
        "l1_chunks": _check(_sum(sources["l1_chunks"]), increase(samples, N.LMC_LOOKUP_HIT_L1_KEYS), 1),
        "l2_chunks": _check(_sum(sources["l2_chunks"]), increase(samples, N.LMC_LOOKUP_HIT_L2_KEYS), 1),
    }


def reconcile_figures(sources: pd.DataFrame, samples: pd.DataFrame) -> dict[str, Any]:
    """The cell summary's flat columns: `attrib_<source>_diff` (per-request sum less counter) and
    `attrib_mismatch` (the sources beyond tolerance, comma-separated; "" when all agree, None when
    none could be checked)."""
    checks = reconcile(sources, samples)
    out: dict[str, Any] = {f"attrib_{k}_diff": v["diff"] for k, v in checks.items()}
    checked = {k: v for k, v in checks.items() if v["within"] is not None}
    out["attrib_mismatch"] = (
        None if not checked else ",".join(k for k, v in checked.items() if not v["within"])
    )
    out.update({f"attrib_{s}_share": v for s, v in _shares(sources).items()})
    return out


def cell_attribution(tier: str, requests: pd.DataFrame, samples: pd.DataFrame) -> dict[str, Any]:
    """The summary's `attrib_*` figures of one cell (`reconcile_figures` on its own sources)."""
    return reconcile_figures(token_sources(requests, tier in OFFLOAD_TIERS, chunk_size(samples)), samples)


def rounds(sources: pd.DataFrame) -> pd.DataFrame:
    """Per round: requests, TTFT p50/p95, and tokens summed over the round's requests that say them.
    The fine split (`<source>_tokens` for SOURCES) over the requests whose sources are all known (their
    count is `attributed`); what every tier says, over the requests that say it: `cached_tokens` and
    `missed_tokens` (prompt less cached: recomputed) over the `said_cached` requests that report
    `cached_tokens`, and LMCache's lookup hits in tokens (`l1_lookup_tokens`, `l2_lookup_tokens`) over
    the `looked_up` requests with a lookup line (and a chunk size). None where no request says it."""
    rows = []
    for rnd, part in sources.dropna(subset=["round"]).groupby(sources["round"].dropna().astype(int)):
        ttft = part["ttft_s"].dropna()
        known = part.dropna(subset=list(SOURCES))
        said = part.dropna(subset=["cached", "prompt"])
        looked = part.dropna(subset=["l1_lookup", "l2_lookup"])
        row: dict[str, Any] = {
            "round": rnd,
            "requests": len(part),
            "attributed": len(known),
            "ttft_p50_s": float(ttft.quantile(0.5)) if not ttft.empty else None,
            "ttft_p95_s": float(ttft.quantile(0.95)) if not ttft.empty else None,
        }
        for s in SOURCES:
            row[f"{s}_tokens"] = float(known[s].sum()) if not known.empty else None
        row["said_cached"] = len(said)
        row["cached_tokens"] = float(said["cached"].sum()) if not said.empty else None
        row["missed_tokens"] = float(said["missed"].sum()) if not said.empty else None
        row["looked_up"] = len(looked)
        for s in ("l1_lookup", "l2_lookup"):
            row[f"{s}_tokens"] = float(looked[s].sum()) if not looked.empty else None
        rows.append(row)
    return pd.DataFrame(rows)


# Turn ages (seconds since the user's previous turn ended), as [low, high) bounds with their labels.
AGE_BUCKETS: tuple[tuple[float, float, str], ...] = (
    (0.0, 2.0, "< 2 s"),
    (2.0, 10.0, "2-10 s"),
    (10.0, 30.0, "10-30 s"),
    (30.0, 120.0, "30-120 s"),
    (120.0, float("inf"), ">= 120 s"),
)


def by_age(sources: pd.DataFrame) -> pd.DataFrame:
    """Per turn-age bucket with requests: requests, their median age, and the hit share (cached prompt
    tokens over prompt tokens, summed over the bucket's requests that say both; `cached_tokens` counts
    the GPU prefix cache and LMCache together, so this is known on every tier), with the LMCache share
    where the server split it (None otherwise)."""
    aged = sources.dropna(subset=["age_s"])
    rows = []
    for low, high, label in AGE_BUCKETS:
        part = aged[(aged["age_s"] >= low) & (aged["age_s"] < high)]
        if part.empty:
            continue
        said = part.dropna(subset=["cached", "prompt"])
        prompt = float(said["prompt"].sum())
        split = part.dropna(subset=["lmcache", "prompt"])
        split_prompt = float(split["prompt"].sum())
        rows.append(
            {
                "age": label,
                "requests": len(part),
                "median_age_s": float(part["age_s"].median()),
                "hit_share": float(said["cached"].sum()) / prompt if prompt > 0 else None,
                "lmcache_share": float(split["lmcache"].sum()) / split_prompt if split_prompt > 0 else None,
            }
        )
    return pd.DataFrame(rows, columns=["age", "requests", "median_age_s", "hit_share", "lmcache_share"])


class Verdict(StrEnum):
    """What the data say about one source's cost (docs/metrics.md "Cost of a hit and of a miss")."""

    COST = "cost"  # above zero, its whole 95 % interval too
    ZERO = "zero"  # not told from zero: the interval reaches it
    NO_INTERVAL = "no_interval"  # too few sessions for an interval, so not told from zero either
    BELOW_ZERO = "below_zero"  # the unconstrained fit is below zero beyond its noise: no cost given
    NOT_ESTIMABLE = "not_estimable"  # the requests do not carry it (`why` says how)


@dataclass(frozen=True)
class Cost:
    """Seconds of TTFT per 1K prompt tokens from one source: the non-negative least-squares estimate
    with its 95 % bootstrap interval, and the verdict. `s_per_1k` is None where no cost is given
    (BELOW_ZERO, NOT_ESTIMABLE); `why` says why, in words."""

    verdict: Verdict
    s_per_1k: float | None = None
    low: float | None = None
    high: float | None = None
    why: str | None = None

    def as_dict(self) -> dict[str, Any]:
        ci = None if self.low is None or self.high is None else [self.low, self.high]
        return {"verdict": str(self.verdict), "s_per_1k": self.s_per_1k, "ci_s_per_1k": ci, "why": self.why}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3g}"


def _verdict(fit: costfit.Fit, j: int) -> Cost:
    """The verdict on coefficient j of a fit (docs/metrics.md says why each)."""
    est = float(fit.estimate[j])
    if fit.low is None or fit.high is None or fit.free_low is None or fit.free_high is None:
        why = f"{fit.sessions} sessions are too few for an interval (at least {MIN_SESSIONS})"
        return Cost(Verdict.NO_INTERVAL, est, why=why)
    low, high = float(fit.low[j]), float(fit.high[j])
    if float(fit.free_high[j]) < 0:
        # The figure itself is left out of the words: it is no cost, and a reader would take it for one.
        why = (
            "unconstrained least squares puts it below zero, its whole 95 % interval too; no cost can be "
            "negative, so TTFT is not linear in these tokens here (something the fit leaves out, such as "
            "the load a request met, moves with them)"
        )
        return Cost(Verdict.BELOW_ZERO, None, low, high, why)
    if low <= 0.0:
        return Cost(Verdict.ZERO, est, low, high, "its 95 % interval reaches zero")
    return Cost(Verdict.COST, est, low, high)


def _not_estimable(names: tuple[str, ...], why: str) -> dict[str, Cost]:
    return {s: Cost(Verdict.NOT_ESTIMABLE, why=why) for s in names}


def source_costs(
    sources: pd.DataFrame,
    names: tuple[str, ...] = SOURCES,
    replicates: int = REPLICATES,
    min_sessions: int = MIN_SESSIONS,
) -> dict[str, Any]:
    """TTFT = base + sum over sources of cost x tokens/1000, by non-negative least squares over the
    requests whose sources and TTFT are known, with a 95 % interval from resampling their sessions
    (kvoffload/analysis/costfit.py). The TTFT is the server's own (scheduling to first token: loads and
    prefill, no queue, no network; `basis` "server") when every one of those requests has it, else the
    client's (`basis` "client"). Every source of `names` (SOURCES, or COARSE where the server does not
    split the caches) gets a Cost with its verdict: NOT_ESTIMABLE where fewer than MIN_SUPPORT requests
    have tokens from it, where the requests are fewer than MIN_PER_COEFFICIENT per coefficient, or where
    the sources always come in the same proportion. `requests` and `sessions`: what the fit used."""
    known = sources.dropna(subset=[*names, "ttft_s"])
    server = not known.empty and bool(known["server_ttft_s"].notna().all())
    sessions = len(known[["cell", "user"]].drop_duplicates()) if not known.empty else 0
    out: dict[str, Any] = {
        "requests": len(known),
        "sessions": sessions,
        "basis": "server" if server else "client",
        "method": "non-negative least squares",
        "base_s": None,
        "base_ci_s": None,
    }
    if known.empty:
        return {**out, **_not_estimable(names, "no request said every source and its TTFT")}
    costs: dict[str, Cost] = {}
    for s in names:
        carrying = int((known[s] > 0).sum())
        tokens = "recomputed tokens" if s in ("recomputed", "missed") else f"tokens from {SOURCE_WORDS[s]}"
        if not carrying:
            costs[s] = Cost(Verdict.NOT_ESTIMABLE, why=f"no request had {tokens}")
        elif carrying < MIN_SUPPORT:
            why = f"only {carrying} request(s) had {tokens} (a cost needs {MIN_SUPPORT})"
            costs[s] = Cost(Verdict.NOT_ESTIMABLE, why=why)
    used = [s for s in names if s not in costs]
    n, k = len(known), len(used) + 1
    if used and n < MIN_PER_COEFFICIENT * k:
        why = f"{n} requests are too few for {k} coefficients ({MIN_PER_COEFFICIENT} per coefficient)"
        costs.update(_not_estimable(tuple(used), why))
        used = []
    x = np.column_stack([np.ones(n), *(known[s].to_numpy() / 1000.0 for s in used)])
    if used and np.linalg.matrix_rank(x) < k:
        why = "its tokens came in fixed proportion with another source's: the fit cannot tell them apart"
        costs.update(_not_estimable(tuple(used), why))
        used = []
    if used:
        y = known["server_ttft_s" if server else "ttft_s"].to_numpy(dtype=float)
        fit = costfit.fit(
            x, y, known["user"].to_numpy(), known["cell"].to_numpy(), replicates, min_sessions=min_sessions
        )
        out["base_s"] = float(fit.estimate[0])
        if fit.low is not None and fit.high is not None:
            out["base_ci_s"] = [float(fit.low[0]), float(fit.high[0])]
        for i, s in enumerate(used, start=1):
            costs[s] = _verdict(fit, i)
    return {**out, **{s: costs[s] for s in names}}


LATER_ROUND = 2  # "later rounds", as the client figures count them (analysis/client.py)
SOURCE_WORDS = {
    "gpu": "the GPU prefix cache",
    "l1": "LMCache L1",
    "l2": "LMCache L2",
    "recomputed": "recomputed",
    # The coarse split: LMCache's lookup covers the whole prefix, so a chunk it found in L2 may have been
    # served from the engine's own GPU prefix cache; the words say lookup hits, not loads.
    "cached_other": "the GPU prefix cache or LMCache L1",
    "l2_hit": "LMCache L2 lookup hits",
    "missed": "recomputed",
}


@dataclass(frozen=True)
class TierAttribution:
    """The turn-by-turn answer of one tier in one comparison group (FINDING_KEYS, the repeats pooled)
    on one node, over its valid cells: per round TTFT and token sources, the cost of each source per 1K
    tokens, and one sentence that uses them. `excluded`: the group's cells of this tier left out, with
    why. `split`: "fine" (GPU, L1, L2, recomputed per request) or "coarse" (COARSE)."""

    tier: str
    cells: list[str]
    rounds: pd.DataFrame
    ages: pd.DataFrame
    costs: dict[str, Any]
    shares_later: dict[str, float | None]
    statement: str | None
    group: str = ""
    where: dict[str, Any] = field(default_factory=dict)
    excluded: list[dict[str, str]] = field(default_factory=list)
    split: str = "fine"

    def as_dict(self) -> dict[str, Any]:
        costs = {k: (v.as_dict() if isinstance(v, Cost) else v) for k, v in self.costs.items()}
        return {
            "group": self.group,
            **self.where,
            "tier": self.tier,
            "cells": self.cells,
            "excluded": self.excluded,
            "split": self.split,
            "rounds": self.rounds.to_dict("records"),
            "by_age": self.ages.to_dict("records"),
            "costs": costs,
            "shares_later": self.shares_later,
            "statement": self.statement,
        }


def _shares(sources: pd.DataFrame, names: tuple[str, ...] = SOURCES) -> dict[str, float | None]:
    known = sources.dropna(subset=list(names))
    total = float(known["prompt"].sum()) if not known.empty else 0.0
    return {s: (float(known[s].sum()) / total if total > 0 else None) for s in names}


def cost_words(cost: Any) -> str | None:
    """A cost as the sentence and the table say it; None for no Cost or a NOT_ESTIMABLE one."""
    if not isinstance(cost, Cost) or cost.verdict is Verdict.NOT_ESTIMABLE:
        return None
    if cost.verdict is Verdict.COST and cost.s_per_1k is not None and cost.low is not None:
        return f"{_ms(cost.s_per_1k)} ms (95 % CI {_ms(cost.low)}-{_ms(cost.high or 0.0)})"
    if cost.verdict is Verdict.ZERO:
        return f"not told from zero (at most {_ms(cost.high or 0.0)} ms)"
    if cost.verdict is Verdict.NO_INTERVAL and cost.s_per_1k:
        return f"{_ms(cost.s_per_1k)} ms (too few sessions for an interval: not told from zero)"
    if cost.verdict is Verdict.NO_INTERVAL:
        return "not told from zero (too few sessions for an interval)"
    return "no cost: the data put it below zero, which no cost can be"


def statement(
    tier: str, shares: dict[str, float | None], costs: dict[str, Any], where: str = ""
) -> str | None:
    """One findings sentence: where later rounds' prompt tokens came from, and what a miss and each hit
    cost; None when no later-round request has all its sources known. `shares` has the keys of SOURCES
    or of COARSE, and `costs` the same. `where` follows the tier ("at concurrency 16, num_rounds 5")."""
    if not shares or any(v is None for v in shares.values()):
        return None
    names = tuple(shares)
    top = max(names, key=lambda s: shares[s] or 0.0)
    rest = ", ".join(
        f"{SOURCE_WORDS[s]} {100 * (shares[s] or 0.0):.0f} %" for s in names if s != top and shares[s]
    )
    came = "were recomputed" if top in ("recomputed", "missed") else f"came from {SOURCE_WORDS[top]}"
    head = f"{tier} {where}".strip()
    text = (
        f"{head}: from round {LATER_ROUND} on, {100 * (shares[top] or 0.0):.0f} % of prompt tokens {came}"
        + (f" ({rest})" if rest else "")
    )
    hits, missed = (
        (("cached_other", "l2_hit"), "missed") if "missed" in names else (("gpu", "l1", "l2"), "recomputed")
    )
    said = [
        f"{'recomputed' if s == missed else 'from ' + SOURCE_WORDS[s]} {w}"
        for s, w in ((s, cost_words(costs.get(s))) for s in (missed, *hits))
        if w is not None
    ]
    if not said:
        return text + "; these requests do not give the cost of any source (the cost table says why)."
    clock = "the server's own TTFT" if costs.get("basis") == "server" else "TTFT as the client saw it"
    fitted = f"non-negative least squares over {costs.get('requests', 0)} requests, {clock}"
    return text + f"; TTFT per 1K prompt tokens: {', '.join(said)} ({fitted})."


# --- per comparison group and valid cell (issue 43) ---
# The findings' group (the repeats pooled) and the node: a cost is a property of the hardware it ran on.
ATTRIBUTION_KEYS = [*FINDING_KEYS, *(["node"] if "node" not in FINDING_KEYS else [])]


def excluded_reason(row: pd.Series) -> str | None:
    """Why one summary row's cell is left out of the attribution, or None: a cell that did not finish
    (status other than done, or no DONE), one the validity rules keep out of every comparison
    (compare.cell_invalid_reasons: not clean, no session counts, routing breached), or one whose
    per-request sources disagree with the counters (compare.attribution_mismatch)."""
    status, done = row.get("status"), row.get("done")
    finished = done is not None and not pd.isna(done) and bool(done)
    if status != "done" or not finished:
        return f"status {status!r}{'' if finished else ' without DONE'}: a partial run"
    invalid = cell_invalid_reasons(row)
    if invalid:
        return "; ".join(invalid)
    return attribution_mismatch(row)


def _where(first: pd.Series) -> tuple[str, str, dict[str, Any]]:
    """(the group's label, the words after the tier, its keys) of one group's first row."""
    keys = {k: first.get(k) for k in ATTRIBUTION_KEYS}
    keys = {k: (None if v is None or (isinstance(v, float) and pd.isna(v)) else v) for k, v in keys.items()}
    node = f" on {keys['node']}" if keys.get("node") else ""
    label = (
        f"{served_name(str(first['model']))} c={first['concurrency']} rounds={first['num_rounds']} "
        f"isl={first['isl']} osl={first['osl']}{node}"
    )
    words = f"at concurrency {first['concurrency']}, num_rounds {first['num_rounds']}{node}"
    plain = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in keys.items()}
    return label, words, plain


def _tier_view(
    tier: str,
    rows: pd.DataFrame,
    by_cell: dict[str, pd.DataFrame],
    smp: dict[str, pd.DataFrame],
    empty_samples: pd.DataFrame,
) -> TierAttribution:
    """One tier of one group: its valid cells' sources pooled, the others listed as excluded."""
    label, words, keys = _where(rows.iloc[0])
    ids, excluded = [], []
    for _, row in rows.iterrows():
        why = excluded_reason(row)
        if why is None:
            ids.append(str(row["cell_id"]))
        else:
            excluded.append({"cell_id": str(row["cell_id"]), "reason": why})
    connector = tier in OFFLOAD_TIERS
    parts = [
        token_sources(by_cell[cid], connector, chunk_size(smp.get(cid, empty_samples)))
        for cid in ids
        if cid in by_cell
    ]
    sources = pd.concat(parts) if parts else token_sources(pd.DataFrame({"status": []}), False)
    later = sources[sources["round"] >= LATER_ROUND]
    fine = not sources.dropna(subset=list(SOURCES)).empty
    split = "coarse" if connector and not fine else "fine"
    if split == "coarse":
        # the server did not split the caches per request: the coarse split, which it does say
        costs, shares = {**source_costs(sources, COARSE), "split": "coarse"}, _shares(later, COARSE)
    else:
        costs, shares = source_costs(sources), _shares(later)
    said = statement(tier, shares, costs, words) if ids else None
    return TierAttribution(
        tier, ids, rounds(sources), by_age(sources), costs, shares, said, label, keys, excluded, split
    )


def tier_attribution(
    summary: pd.DataFrame, requests: pd.DataFrame, samples: pd.DataFrame
) -> list[TierAttribution]:
    """Per comparison group (ATTRIBUTION_KEYS, groups in summary order) and tier present in it (in TIERS
    order): the turn-by-turn answer over the group's valid cells of that tier (`excluded_reason`).
    `summary`: the summary rows (analysis/summary.py: config, status, validity and attribution columns);
    `requests` and `samples` carry `cell_id`."""
    if summary.empty or "tier" not in summary:
        return []
    by_cell = {str(k): g for k, g in requests.groupby("cell_id", sort=False)} if "cell_id" in requests else {}
    smp = {str(k): g for k, g in samples.groupby("cell_id", sort=False)} if "cell_id" in samples else {}
    frame = summary.assign(**{k: None for k in ATTRIBUTION_KEYS if k not in summary})
    out = []
    for _, group in frame.groupby(ATTRIBUTION_KEYS, sort=False, dropna=False):
        for tier in [t for t in TIERS if (group["tier"] == t).any()]:
            rows = group[group["tier"] == tier]
            out.append(_tier_view(tier, rows, by_cell, smp, samples.iloc[0:0]))
    return out
