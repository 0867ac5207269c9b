"""Plots of the report as inline SVG text (matplotlib, Agg backend; no files, no network).

Each function takes DataFrames already computed by `kvoffload.analysis` and returns an `<svg>` string,
or None when there is nothing to draw. Colours are fixed per tier so every plot reads the same way.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

TIER_COLOURS = {"gpu": "#1f77b4", "cpu": "#2ca02c", "nvme": "#d62728"}
plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "kvoffload", "font.size": 9})


def svg_text(fig: Figure) -> str:
    """The figure as `<svg>` text (no XML prolog, no date: the same plot gives the same bytes); closes
    the figure. Also decision_plot.py's."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _finished(fig: Figure, ax: Axes, title: str, xlabel: str, ylabel: str, legend_columns: int = 1) -> str:
    """A one-axes plot in the report's look (title, axis labels, a light grid, a small legend), as SVG."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=legend_columns)
    return svg_text(fig)


def tier_colour(tier: str) -> str:
    """A tier's fixed colour (grey for a tier without one)."""
    return TIER_COLOURS.get(tier, "#7f7f7f")


def ttft_by_round(curves: Mapping[str, pd.DataFrame]) -> str | None:
    """TTFT p50 (solid) and p95 (dashed) per round, one colour per tier."""
    curves = {t: c for t, c in curves.items() if not c.empty}
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    for tier, c in curves.items():
        ax.plot(c["round"], c["ttft_p50_s"], "-o", color=tier_colour(tier), label=f"{tier} p50", ms=3)
        ax.plot(c["round"], c["ttft_p95_s"], "--", color=tier_colour(tier), label=f"{tier} p95")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _finished(fig, ax, "TTFT by round", "round", "TTFT (s)", legend_columns=3)


def ttft_cdf(cdfs: Mapping[str, pd.DataFrame]) -> str | None:
    """Empirical CDF of TTFT per tier."""
    cdfs = {t: c for t, c in cdfs.items() if not c.empty}
    if not cdfs:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    for tier, c in cdfs.items():
        ax.step(c["ttft_s"], c["fraction"], where="post", color=tier_colour(tier), label=tier)
    ax.set_ylim(0, 1.02)
    return _finished(fig, ax, "TTFT CDF", "TTFT (s)", "fraction of requests")


def cache_over_time(series: Mapping[str, pd.DataFrame]) -> str | None:
    """Hit rates (local solid, external dashed) and KV usage over time, per tier, as the tables define
    them (analysis/engine.py `engine_series`): the windowed hit-rate series whose last quarter's mean
    is the table's hit rate, and the fullest replica's KV usage at each sampler round of the replay,
    whose peak is the table's "KV cache usage max". Every point has a marker: a line alone draws nothing
    for a point between gaps (a short replay's series can be one point)."""
    series = {t: s for t, s in series.items() if not s.empty}
    if not series:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.6, 3.0))
    for tier, s in series.items():
        colour = tier_colour(tier)
        if s["local_hit_rate"].notna().any():
            ax1.plot(s["t_s"], 100 * s["local_hit_rate"], "-o", color=colour, label=f"{tier} local", ms=2)
        if s["external_hit_rate"].notna().any():
            ax1.plot(
                s["t_s"], 100 * s["external_hit_rate"], "--o", color=colour, label=f"{tier} external", ms=2
            )
        kv = s.dropna(subset=["kv_usage_max_pct"])
        if not kv.empty:
            ax2.plot(kv["t_s"], kv["kv_usage_max_pct"], "-o", color=colour, label=tier, ms=2)
    ax1.set_title("prefix-cache hit rate (300 s window)")
    ax1.set_ylabel("hit rate (%): table = mean of the last quarter")
    ax2.set_title("KV cache usage, fullest replica")
    ax2.set_ylabel("KV usage (%): table max = peak")
    for ax in (ax1, ax2):
        ax.set_xlabel("seconds since start")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return svg_text(fig)


def disk_throughput(series: Mapping[str, pd.DataFrame]) -> str | None:
    """L2 device read (solid) and write (dashed) GB/s over time, per cell label."""
    series = {
        k: s for k, s in series.items() if not s.empty and s[["read_gbps", "write_gbps"]].notna().any().any()
    }
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    for label, s in series.items():
        ax.plot(s["t_s"], s["read_gbps"], "-", label=f"{label} read")
        ax.plot(s["t_s"], s["write_gbps"], "--", label=f"{label} write")
    return _finished(fig, ax, "L2 disk throughput", "seconds since start", "GB/s")


def later_ttft_ci(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """Later-round p50 TTFT per tier with its 95 % CI (bar and whisker) and p95 (diamond), for one group.

    `rows`: dicts with tier, later_p50_s, later_p50_ci_s ([low, high] or None), later_p95_s.
    """
    rows = [r for r in rows if r.get("later_p50_s") is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(4.2, 0.5 + 0.45 * len(rows)))
    for i, r in enumerate(rows):
        colour = tier_colour(str(r["tier"]))
        p50 = float(r["later_p50_s"])
        ax.barh(i, p50, color=colour, alpha=0.6, height=0.6)
        ci = r.get("later_p50_ci_s")
        if ci:
            ax.errorbar(p50, i, xerr=[[p50 - ci[0]], [ci[1] - p50]], fmt="none", ecolor="#222", capsize=3)
        if r.get("later_p95_s") is not None:
            ax.plot(float(r["later_p95_s"]), i, "D", color=colour, ms=5, mec="#222")
    ax.set_yticks(range(len(rows)), [str(r["tier"]) for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("later-round TTFT (s): bar p50 with 95 % CI, diamond p95")
    ax.set_xlim(left=0)
    ax.grid(axis="x", alpha=0.3)
    return svg_text(fig)


def tradeoff(points: Mapping[str, pd.DataFrame], capacities: Mapping[str, float]) -> str | None:
    """Later-round p50 (solid) and p95 (dashed) TTFT per tier against live history (tokens), with each
    tier's predicted capacity as a dotted vertical line.

    `points`: tier -> frame with live_history_tokens, ttft_later_p50_s, ttft_later_p95_s.
    """
    points = {t: p.dropna(subset=["live_history_tokens"]) for t, p in points.items()}
    points = {t: p.sort_values("live_history_tokens") for t, p in points.items() if not p.empty}
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for tier, p in points.items():
        colour = tier_colour(tier)
        ax.plot(
            p["live_history_tokens"], p["ttft_later_p50_s"], "-o", color=colour, ms=4, label=f"{tier} p50"
        )
        ax.plot(p["live_history_tokens"], p["ttft_later_p95_s"], "--", color=colour, label=f"{tier} p95")
    for tier, tokens in capacities.items():
        ax.axvline(tokens, color=tier_colour(tier), ls=":", lw=1.5, label=f"{tier} predicted capacity")
    ax.set_xscale("log")
    return _finished(
        fig,
        ax,
        "latency against live history",
        "live history (concurrency x mean context, tokens)",
        "later-round TTFT (s)",
        legend_columns=2,
    )
