"""Client-side figures from request records of one cell (docs/metrics.md, "Client side").

Latency figures use requests with status `ok` only; percentiles interpolate linearly between order
statistics (numpy's default). The run's wall time is from the first `t_start` to the last
`t_start + latency_s` of any request, and throughput figures divide ok tokens/requests by it; a token
throughput is None (with a note) when any ok request lacks that usage field, since a sum without them
would be too low.
The cached-token share is sum(cached_tokens) / sum(prompt_tokens) over ok requests that report
cached_tokens (the server's `usage.prompt_tokens_details`; local and connector hits together).
TTFT degradation = 100 * (stat(TTFT of rounds >= 2) - stat(TTFT of round 1)) / stat(TTFT of round 1),
for stat = median and p95; None when either side has no ok request. The later-round hit rate is the
cached-token share of the ok requests of rounds >= 2 only (round 1 of a virtual user can hit only a
prefix shared with other users). A session's live context is the most tokens (prompt + completion) any
of its requests held, i.e. the KV history it needs kept to be served without recompute; the mean over
the cell's sessions (virtual users) feeds the capacity figures.
`requests_late` counts ok requests whose first-token stamp may be late (the record's `late_s` is set:
the client read the first token together with a later one, so it could not keep up) and
`requests_read_stamped` those whose TTFT was stamped at read time (`ttft_clock` "read"); records
written before those fields existed count as neither.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kvoffload.analysis.series import note

PERCENTILES = (50, 90, 95, 99)


def _pct(values: pd.Series, q: float) -> float | None:
    v = values.dropna().to_numpy(dtype=float)
    return float(np.percentile(v, q)) if len(v) else None


def _mean(values: pd.Series) -> float | None:
    v = values.dropna()
    return float(v.mean()) if len(v) else None


def _change_pct(new: float | None, base: float | None) -> float | None:
    if new is None or base is None or base == 0:
        return None
    return 100.0 * (new - base) / base


def replay_window(requests: pd.DataFrame) -> tuple[float, float] | None:
    """(first t_start, last t_start + latency_s) of the records; None without records."""
    if requests.empty:
        return None
    start = float(requests["t_start"].min())
    end = float((requests["t_start"] + requests["latency_s"].fillna(0.0)).max())
    return start, end


def run_seconds(requests: pd.DataFrame) -> float | None:
    """Wall time of the replay from its request records; None when it cannot be known."""
    window = replay_window(requests)
    if window is None:
        return None
    span = window[1] - window[0]
    return span if span > 0 else None


def request_figures(requests: pd.DataFrame) -> dict[str, Any]:
    """TTFT stats, TPOT, throughput, status counts and TTFT degradation of one cell's requests."""
    ok = requests[requests["status"] == "ok"]
    ttft = ok["ttft_s"]
    out: dict[str, Any] = {
        "requests": len(requests),
        "requests_ok": len(ok),
        "requests_error": int((requests["status"] == "error").sum()),
        "requests_timeout": int((requests["status"] == "timeout").sum()),
        "ttft_mean_s": _mean(ttft),
        "requests_late": int(ok["late_s"].notna().sum()) if "late_s" in ok else 0,
        "requests_read_stamped": int((ok["ttft_clock"] == "read").sum()) if "ttft_clock" in ok else 0,
    }
    for q in PERCENTILES:
        out[f"ttft_p{q}_s"] = _pct(ttft, q)
    out["tpot_mean_s"] = _mean(ok["tpot_s"])
    known = (
        ok[ok["cached_tokens"].notna() & ok["prompt_tokens"].notna()]
        if "cached_tokens" in ok
        else ok.iloc[0:0]
    )
    prompt = float(known["prompt_tokens"].sum()) if len(known) else 0.0
    out["cached_token_share"] = float(known["cached_tokens"].sum()) / prompt if prompt > 0 else None
    seconds = run_seconds(requests)
    out["run_s"] = seconds
    if seconds:
        out["input_tokens_per_s"] = _tokens_per_s(ok, "prompt_tokens", seconds)
        out["output_tokens_per_s"] = _tokens_per_s(ok, "completion_tokens", seconds)
        out["requests_per_s"] = len(ok) / seconds
    else:
        out["input_tokens_per_s"] = out["output_tokens_per_s"] = out["requests_per_s"] = None
    first = ok[ok["round"] == 1]["ttft_s"]
    later = ok[ok["round"] >= 2]["ttft_s"]
    out["ttft_round1_p50_s"] = _pct(first, 50)
    out["ttft_later_p50_s"] = _pct(later, 50)
    out["ttft_later_p95_s"] = _pct(later, 95)
    # the slo's TPOT limit judges later rounds too (issue 42: analysis/decision.py, the knee search)
    out["tpot_later_p95_s"] = _pct(ok[ok["round"] >= 2]["tpot_s"], 95)
    later_known = known[known["round"] >= 2]
    later_prompt = float(later_known["prompt_tokens"].sum()) if len(later_known) else 0.0
    out["later_round_cached_share"] = (
        float(later_known["cached_tokens"].sum()) / later_prompt if later_prompt > 0 else None
    )
    out.update(live_context(requests))
    out["ttft_degradation_p50_pct"] = _change_pct(_pct(later, 50), _pct(first, 50))
    out["ttft_degradation_p95_pct"] = _change_pct(_pct(later, 95), _pct(first, 95))
    return out


def _tokens_per_s(ok: pd.DataFrame, column: str, seconds: float) -> float | None:
    """Sum of `column` over ok requests per second; None (with a note) when some lack the field."""
    missing = int(ok[column].isna().sum())
    if missing:
        note(
            "usage_missing",
            f"{missing} of {len(ok)} ok requests carry no usage.{column}: "
            f"{column.split('_')[0]} tokens per second is null",
        )
        return None
    return float(ok[column].sum()) / seconds


def live_context(requests: pd.DataFrame) -> dict[str, Any]:
    """Sessions replayed and their mean live context in tokens (see the module docstring)."""
    rows = requests[requests["prompt_tokens"].notna()]
    if rows.empty:
        return {"sessions_replayed": 0, "live_context_mean_tokens": None}
    held = rows["prompt_tokens"].astype(float) + rows["completion_tokens"].fillna(0).astype(float)
    per_session = held.groupby(rows["user_id"]).max()
    return {"sessions_replayed": len(per_session), "live_context_mean_tokens": float(per_session.mean())}


def ttft_by_round(requests: pd.DataFrame) -> pd.DataFrame:
    """Per-round curve: round, ok requests, TTFT mean/p50/p95 (seconds), change of p50 vs round 1 (%)."""
    ok = requests[(requests["status"] == "ok") & requests["ttft_s"].notna()]
    rows = []
    for _, g in ok.groupby("round", sort=True):
        rows.append(
            {
                "round": int(g["round"].iloc[0]),
                "requests": len(g),
                "ttft_mean_s": float(g["ttft_s"].mean()),
                "ttft_p50_s": float(np.percentile(g["ttft_s"], 50)),
                "ttft_p95_s": float(np.percentile(g["ttft_s"], 95)),
            }
        )
    curve = pd.DataFrame(rows, columns=["round", "requests", "ttft_mean_s", "ttft_p50_s", "ttft_p95_s"])
    base = curve.loc[curve["round"] == 1, "ttft_p50_s"]
    if len(base) and float(base.iloc[0]) > 0:
        curve["p50_change_vs_round1_pct"] = 100.0 * (curve["ttft_p50_s"] / float(base.iloc[0]) - 1.0)
    else:
        curve["p50_change_vs_round1_pct"] = np.nan
    return curve


def ttft_cdf(requests: pd.DataFrame) -> pd.DataFrame:
    """Empirical CDF of ok TTFTs: columns ttft_s (sorted) and fraction (i / n, i = 1..n)."""
    v = np.sort(requests.loc[requests["status"] == "ok", "ttft_s"].dropna().to_numpy(dtype=float))
    return pd.DataFrame({"ttft_s": v, "fraction": np.arange(1, len(v) + 1) / max(len(v), 1)})


def reuse_from_records(requests: pd.DataFrame) -> float | None:
    """Share of prompt tokens that repeat the same virtual user's previous prompt (lower bound).

    Replayed inputs are teacher-forced and append-only, so each request's prompt starts with the
    previous prompt of the same user: its reusable part is min(previous prompt, this prompt). Prefixes
    shared between users (a common system prompt) are invisible here; `reuse.prefix_reuse` counts
    them from token ids. None when no prompt token counts are known.
    """
    rows = requests[requests["prompt_tokens"].notna()].sort_values(["user_id", "t_start"], kind="stable")
    total = float(rows["prompt_tokens"].sum())
    if total <= 0:
        return None
    prev = rows.groupby("user_id", sort=False)["prompt_tokens"].shift(1)
    reusable = np.minimum(prev.fillna(0).to_numpy(dtype=float), rows["prompt_tokens"].to_numpy(dtype=float))
    return float(reusable.sum()) / total
