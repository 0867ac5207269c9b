"""The decision table's plot: later-round p95 TTFT against the sessions live at once, per tier.

Inline SVG (matplotlib, Agg, the colours of kvoffload/report/plots.py), drawn from a
kvoffload.analysis.decision.SweepDecision only: each tier's measured levels with their 95 % intervals,
marked as the one judge (config/slo.py `judge`, each level's `meets`) found them: filled where the level
meets the target, hollow where it missed, a cross on the axis where it was not judged (its load not
held, a figure unknown); the target as a horizontal line, and where each tier meets it: its crossing
with the crossing's interval as a horizontal bar, or a triangle at the bound when the tier never missed
(pointing right: "at least") or always missed (pointing left: "fewer than"). No analysis here, no files.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from kvoffload.analysis.decision import SweepDecision, TierDecision
from kvoffload.report.plots import svg_text, tier_colour


def _levels(ax: Axes, d: TierDecision, colour: str) -> None:
    x, y, low, high = [], [], [], []
    for lv in d.levels:
        if lv.ttft_p95_s is None:
            continue
        ci = lv.ttft_p95_ci_s or [lv.ttft_p95_s, lv.ttft_p95_s]
        x.append(lv.sessions_at_once)
        y.append(lv.ttft_p95_s)
        low.append(max(0.0, lv.ttft_p95_s - ci[0]))
        high.append(max(0.0, ci[1] - lv.ttft_p95_s))
    if x:
        ax.errorbar(x, y, yerr=[low, high], fmt="-", capsize=2, color=colour, label=f"{d.tier} p95")
    for lv in d.levels:
        if lv.meets is None or lv.ttft_p95_s is None:
            # not judged: on the axis, where its figure (if any) cannot be read as a verdict
            ax.plot([lv.sessions_at_once], [0.0], marker="x", ms=6, color=colour, clip_on=False)
        else:
            face = colour if lv.meets else "white"
            ax.plot([lv.sessions_at_once], [lv.ttft_p95_s], marker="o", ms=5, color=colour,
                    markerfacecolor=face)  # fmt: skip


def _where(ax: Axes, d: TierDecision, target: float, colour: str) -> None:
    if d.sessions is None:
        return
    if d.status == "crossing":
        lo, hi = (d.sessions_ci or [d.sessions, d.sessions])[:2]
        ax.errorbar([d.sessions], [target], xerr=[[d.sessions - lo], [hi - d.sessions]], fmt="D", ms=6,
                    capsize=4, color=colour, markeredgecolor="black")  # fmt: skip
        ax.annotate(f"{d.sessions:.3g}", (d.sessions, target), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=7, color=colour)  # fmt: skip
    elif d.status in ("at_least", "fewer_than"):
        marker, word = (">", ">=") if d.status == "at_least" else ("<", "<")
        ax.plot([d.sessions], [target], marker=marker, ms=8, color=colour, markeredgecolor="black")
        ax.annotate(f"{word} {d.sessions:g}", (d.sessions, target), textcoords="offset points",
                    xytext=(0, -12), ha="center", fontsize=7, color=colour)  # fmt: skip


def sessions_at_target(sweep: SweepDecision, target_s: float) -> str | None:
    """p95 TTFT against sessions at once, per tier, with the target (`target_s`) and the crossings;
    None when no tier has a measured level."""
    tiers = [d for d in sweep.tiers if any(lv.ttft_p95_s is not None for lv in d.levels)]
    if not tiers:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for d in tiers:
        colour = tier_colour(d.tier)
        _levels(ax, d, colour)
        _where(ax, d, target_s, colour)
    ax.axhline(target_s, color="black", ls="--", lw=1, label=f"target p95 TTFT {target_s:g} s")
    ax.set_xlabel("sessions at once (concurrency, at most the users replayed)")
    ax.set_ylabel("later-round p95 TTFT (s)")
    ax.set_ylim(bottom=0)
    ax.set_title("Sessions at the target (diamond: crossing with its 95 % CI; triangle: a bound)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return svg_text(fig)
