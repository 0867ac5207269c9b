"""Issue 53, item 5: the decision's first screen names the pick (or says why there is none) above a
table narrow enough for a 1400 px window, its verdict beside the tier (report/decision_view.py)."""

from __future__ import annotations

from typing import Any

from kvoffload.analysis import costing
from kvoffload.analysis.crossing import Level
from kvoffload.analysis.decision import SweepDecision, TierDecision
from kvoffload.report import decision_view
from kvoffload.report.decision_view import DecisionSection, empty_section, headline, section_headline

TARGET = "p95 TTFT <= 0.5 s"


def _level(at: int, cells: list[str]) -> Level:
    return Level(at, [at], cells, 32, 0.3, 0.1, None, None, True)


def _tier(
    tier: str, verdict: str, sessions_text: str, cost: float | None, cells: int = 2, **kw: Any
) -> TierDecision:
    """A tier's decision with what the first screen reads; each of its two levels pools `cells` cells."""
    levels = [_level(at, [f"{tier}{at}-{i}" for i in range(cells)]) for at in (8, 16)]
    base: dict[str, Any] = {
        "model": "m", "num_rounds": 5, "isl": 12000, "osl": "32", "tier": tier, "status": "at_least",
        "sessions": 32.0, "sessions_bound": ">=", "sessions_ci": None, "sessions_ci_censored": None,
        "interval_note": None, "last_meeting": None, "first_missing": None, "binding_limit": None,
        "ceiling": 32, "non_monotone": [], "levels": levels, "goodput": None,
        "resources": costing.Resources(1, 0.0, 0.0),
        "cost": costing.Cost(1.0, {}, cost, None, None, "<=" if tier != "gpu" else "="),
        "history_tokens": None, "history_sessions": None, "verdict": verdict, "sessions_text": sessions_text,
    }  # fmt: skip
    return TierDecision(**{**base, **kw})


def _sweep(pick: str | None, tiers: list[TierDecision], **kw: Any) -> SweepDecision:
    return SweepDecision(
        model="m", num_rounds=5, isl=12000, osl="32", target=TARGET, tiers=tiers,
        statements=[f"{d.tier} sustains more" for d in tiers if d.tier != "gpu"], conditions=[], pick=pick,
        missing_prices=[], currency="USD", example_prices=False, **kw,
    )  # fmt: skip


GPU = _tier("gpu", "baseline", "17.9 [<17-19.5]", 0.0182, sessions=17.9, status="crossing")


def test_the_headline_names_the_pick_and_the_verdict_sits_beside_the_tier() -> None:
    """The demo's case: cpu and nvme never missed up to 32 sessions, gpu crossed at 17.9."""
    cpu = _tier("cpu", "pick: more sessions than gpu", ">= 32 (the most this dataset can replay)", 0.0144)
    nvme = _tier("nvme", "more sessions than gpu", ">= 32 (the most this dataset can replay)", 0.0136)
    sweep = _sweep("cpu", [GPU, cpu, nvme])
    assert headline(sweep) == (
        "pick: cpu — more sessions than gpu at p95 TTFT <= 0.5 s (>= 32 against 17.9), cost per 1M tokens "
        "<= 0.0144 against 0.0182 USD"
    )
    sec = DecisionSection(None, None, None, [sweep])
    assert sec.headline is None  # the sweep's own headline says it
    (view,) = decision_view.views(sec)
    assert (view.headline, view.caveat) == (headline(sweep), "")
    # the first screen: four columns, the verdict second; the rest opens below it
    assert view.table.headers == [
        "tier",
        "verdict",
        "sessions at the target [95 % CI]",
        "cost per 1M tokens (USD)",
    ]
    assert view.table.rows[1][:2] == ["cpu", "pick: more sessions than gpu"]
    assert view.details.headers == ["tier", "goodput per GPU", "energy per 1M tokens", "history retained"]
    # Markdown and the terminal say it above the full table
    md = decision_view.markdown(sec)
    full = (
        "| tier | sessions at the target [95 % CI] | goodput per GPU | cost per 1M tokens (USD) | "
        "energy per 1M tokens | history retained | verdict |"
    )
    assert md.index(f"**{headline(sweep)}**") < md.index(full)
    assert f"  {headline(sweep)}" in decision_view.terminal_lines(sec)


def test_a_pick_that_rests_on_one_run_says_so() -> None:
    cpu = _tier("cpu", "pick: more sessions than gpu", ">= 32 (the highest level measured)", 0.0144, cells=1)
    gpu = _tier("gpu", "baseline", "17.9 [<17-19.5]", 0.0182, cells=1, sessions=17.9, status="crossing")
    (view,) = decision_view.views(DecisionSection(None, None, None, [_sweep("cpu", [gpu, cpu])]))
    assert view.headline.startswith("pick: cpu — more sessions than gpu")
    assert view.caveat == "each level rests on one run, so run-to-run noise is not in its interval"


def test_without_a_pick_the_headline_says_why() -> None:
    # no offload tier separates from gpu: the analysis picks gpu, the headline names the others' verdicts
    same = _tier("cpu", "not distinguishable from gpu", "30.1 [25-35]", None, status="crossing")
    assert headline(_sweep("gpu", [GPU, same])) == (
        "pick: gpu — no offload tier separates from gpu at p95 TTFT <= 0.5 s (cpu: not distinguishable from "
        "gpu)"
    )
    # gpu judged at no level: nothing to compare with
    blind = _tier("gpu", "not judged: no valid cell", "–", None, status="no_data")
    assert headline(_sweep(None, [blind, same])) == (
        "no pick — gpu: not judged: no valid cell; no offload tier separates from gpu at p95 TTFT <= 0.5 s "
        "(cpu: not distinguishable from gpu)"
    )
    # the analysis's own reason (analysis/decision.py `_pick`), when it gives one, is the headline
    why = "cpu rests on one run: the run-to-run noise is not measured, so no pick (set `repeats: 2` or more)"
    assert headline(_sweep(None, [GPU, same], no_pick=why)) == f"no pick — {why}"
    # no slo: the section says it before any table
    assert section_headline(empty_section()) == (
        "no pick — the campaign sets no latency target (`slo`), so no tier can be judged at one"
    )
    assert decision_view.markdown(empty_section())[2] == f"**{section_headline(empty_section())}**"
