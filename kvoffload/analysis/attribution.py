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
Reconciliation compares the per-request sums with the counters' increases over the run; costs are an
ordinary least-squares fit of TTFT on the tokens of each source. Retention shows in the hit share against
the turn's age: the seconds since the same user's previous turn ended, in AGE_BUCKETS. Pure: DataFrames
in, DataFrames or dicts out; no IO.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kvoffload.analysis import names as N
from kvoffload.analysis.compare import OFFLOAD_TIERS
from kvoffload.analysis.engine import increase
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
    l2_hits = l2_chunks * chunk if chunk is not None else pd.Series(np.nan, index=ok.index)
    l2 = np.minimum(l2_hits, loaded) if connector else loaded
    out = pd.DataFrame(
        {
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
    """Per round: requests, TTFT p50/p95, and the tokens of each source summed over the round's requests
    whose sources are all known (their count is `attributed`)."""
    rows = []
    for rnd, part in sources.dropna(subset=["round"]).groupby(sources["round"].dropna().astype(int)):
        ttft = part["ttft_s"].dropna()
        known = part.dropna(subset=list(SOURCES))
        row: dict[str, Any] = {
            "round": rnd,
            "requests": len(part),
            "attributed": len(known),
            "ttft_p50_s": float(ttft.quantile(0.5)) if not ttft.empty else None,
            "ttft_p95_s": float(ttft.quantile(0.95)) if not ttft.empty else None,
        }
        for s in SOURCES:
            row[f"{s}_tokens"] = float(known[s].sum()) if not known.empty else None
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


@dataclass(frozen=True)
class Cost:
    """Seconds of TTFT per 1K prompt tokens from one source, with its standard error (the fit's spread)."""

    s_per_1k: float
    stderr: float | None


def source_costs(sources: pd.DataFrame, names: tuple[str, ...] = SOURCES) -> dict[str, Any]:
    """TTFT = base + sum over sources of cost x tokens/1000, by ordinary least squares over the requests
    whose sources and TTFT are known. The TTFT is the server's own (scheduling to first token: loads
    and prefill, no queue, no network; `basis` "server") when every one of those requests has it, else
    the client's (`basis` "client"). A source with no tokens in any request has no cost (None). The
    standard errors are the usual OLS ones (residual variance times the diagonal of (X'X)^-1); None
    when the fit has no spare degree of freedom. `requests`: how many the fit used. `names`: the
    source columns (SOURCES, or COARSE where the server does not split the caches)."""
    known = sources.dropna(subset=[*names, "ttft_s"])
    server = not known.empty and bool(known["server_ttft_s"].notna().all())
    out: dict[str, Any] = {
        "requests": len(known),
        "basis": "server" if server else "client",
        "base_s": None,
        **dict.fromkeys(names),
    }
    used = [s for s in names if not known.empty and (known[s] > 0).any()]
    n, k = len(known), len(used) + 1
    if not used or n < MIN_PER_COEFFICIENT * k:
        return out
    x = np.column_stack([np.ones(n), *(known[s].to_numpy() / 1000.0 for s in used)])
    y = known["server_ttft_s" if server else "ttft_s"].to_numpy()
    coef, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    if rank < k:
        return out  # sources always in the same proportion: no separate cost for each
    resid = y - x @ coef
    stderr: list[float | None] = [None] * k
    if n > k:
        var = float(resid @ resid) / (n - k)
        stderr = [float(v) for v in np.sqrt(np.maximum(np.diag(var * np.linalg.inv(x.T @ x)), 0.0))]
    out["base_s"] = float(coef[0])
    for i, s in enumerate(used, start=1):
        out[s] = Cost(float(coef[i]), stderr[i])
    return out


LATER_ROUND = 2  # "later rounds", as the client figures count them (analysis/client.py)
SOURCE_WORDS = {
    "gpu": "the GPU prefix cache",
    "l1": "LMCache L1",
    "l2": "LMCache L2",
    "recomputed": "recomputed",
    "cached_other": "the GPU prefix cache or LMCache L1",
    "l2_hit": "LMCache L2",
    "missed": "recomputed",
}


@dataclass(frozen=True)
class TierAttribution:
    """The turn-by-turn answer of one tier, pooled over its cells: per round TTFT and token sources,
    the cost of each source per 1K tokens, and one sentence that uses them."""

    tier: str
    cells: list[str]
    rounds: pd.DataFrame
    ages: pd.DataFrame
    costs: dict[str, Any]
    shares_later: dict[str, float | None]
    statement: str | None

    def as_dict(self) -> dict[str, Any]:
        costs = {
            k: ({"s_per_1k": v.s_per_1k, "stderr": v.stderr} if isinstance(v, Cost) else v)
            for k, v in self.costs.items()
        }
        return {
            "tier": self.tier,
            "cells": self.cells,
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


def _ms(cost: Any) -> str | None:
    if not isinstance(cost, Cost):
        return None
    spread = f" ± {cost.stderr * 1000:.2g}" if cost.stderr is not None else ""
    return f"{cost.s_per_1k * 1000:.3g}{spread} ms per 1K tokens"


def statement(tier: str, shares: dict[str, float | None], costs: dict[str, Any]) -> str | None:
    """One findings sentence: where later rounds' prompt tokens came from, and what a hit and a miss
    cost; None when no later-round request has all its sources known. `shares` has the keys of SOURCES
    or of COARSE, and `costs` the same."""
    if not shares or any(v is None for v in shares.values()):
        return None
    names = tuple(shares)
    top = max(names, key=lambda s: shares[s] or 0.0)
    rest = ", ".join(
        f"{SOURCE_WORDS[s]} {100 * (shares[s] or 0.0):.0f} %" for s in names if s != top and shares[s]
    )
    where = "were recomputed" if top in ("recomputed", "missed") else f"came from {SOURCE_WORDS[top]}"
    text = (
        f"{tier}: from round {LATER_ROUND} on, {100 * (shares[top] or 0.0):.0f} % of prompt tokens {where}"
        + (f" ({rest})" if rest else "")
    )
    hits, missed = (
        (("cached_other", "l2_hit"), "missed") if "missed" in names else (("gpu", "l1", "l2"), "recomputed")
    )
    loads = [(s, _ms(costs.get(s))) for s in hits]
    said = [f"from {SOURCE_WORDS[s]} {m}" for s, m in loads if m is not None]
    miss = _ms(costs.get(missed))
    if said and miss is not None:
        text += f"; a hit cost {' and '.join(said)} of TTFT, against {miss} recomputed"
    elif miss is not None:
        text += f"; recomputing cost {miss} of TTFT"
    else:
        return (
            text
            + "; these requests do not tell the costs of the sources apart (too few, or in fixed proportion)."
        )
    clock = "the server's own TTFT" if costs.get("basis") == "server" else "TTFT as the client saw it"
    return text + f" (least squares over {costs.get('requests', 0)} requests, {clock})."


def tier_attribution(
    cells: pd.DataFrame, requests: pd.DataFrame, samples: pd.DataFrame
) -> list[TierAttribution]:
    """Per tier present in `cells` (in TIERS order): the turn-by-turn answer pooled over its cells.
    `requests` and `samples` carry `cell_id`."""
    out = []
    present = set(cells["tier"]) if "tier" in cells else set()
    by_cell = {str(k): g for k, g in requests.groupby("cell_id", sort=False)} if "cell_id" in requests else {}
    smp = {str(k): g for k, g in samples.groupby("cell_id", sort=False)} if "cell_id" in samples else {}
    for tier in [t for t in TIERS if t in present]:
        ids = [str(c) for c in cells.loc[cells["tier"] == tier, "cell_id"]]
        parts = [
            token_sources(by_cell[cid], tier in OFFLOAD_TIERS, chunk_size(smp.get(cid, samples.iloc[0:0])))
            for cid in ids
            if cid in by_cell
        ]
        sources = pd.concat(parts) if parts else token_sources(requests.iloc[0:0], False)
        costs = source_costs(sources)
        later = sources[sources["round"] >= LATER_ROUND]
        shares = _shares(later)
        if tier in OFFLOAD_TIERS and not costs["requests"]:
            # the server did not split the caches per request: the coarse split, which it does say
            costs, shares = {**source_costs(sources, COARSE), "split": "coarse"}, _shares(later, COARSE)
        view = TierAttribution(
            tier, ids, rounds(sources), by_age(sources), costs, shares, statement(tier, shares, costs)
        )
        out.append(view)
    return out
