"""The report's first answer: which tier, at what scale, at what cost (issue 42), in every format.

Reads the campaign's latency target and prices from campaign.json (the run's resolved prices when it
recorded them, `prices` / `prices_source`, else the campaign's own `prices`), runs the decision
analysis (kvoffload/analysis/decision.py) and renders it: per sweep one table (tier | sessions at the
target [95 % CI] | goodput per GPU | cost per 1M tokens | energy per 1M tokens | history retained |
verdict), the sentences against gpu, the conditions and the plot (report/decision_plot.py), as HTML
context, Markdown lines, terminal lines, the JSON `decision` section and the decision CSV. Only
formatting here; every figure and rule is the analysis's (docs/metrics.md "Decision").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from pydantic import ValidationError

from kvoffload.analysis import bootstrap
from kvoffload.analysis.capacity import Stated, TierCapacity, tokens_text
from kvoffload.analysis.decision import SweepDecision, TierDecision, csv_rows, decide
from kvoffload.analysis.findings import served_name
from kvoffload.config.slo import Prices, Slo
from kvoffload.report import decision_plot
from kvoffload.report.views import MISSING, Table

TITLE = "Which tier, at what scale, at what cost"
HEADERS = [
    "tier",
    "sessions at the target [95 % CI]",
    "goodput per GPU",
    "cost per 1M tokens",
    "energy per 1M tokens",
    "history retained",
    "verdict",
]
NO_TARGET = (
    "No latency target: add `slo: {ttft_p95_s: <seconds>}` to the campaign to get each tier's sessions "
    "at the target, its goodput and its cost per million tokens (the knee search then finds each tier's "
    "crossing)."
)


@dataclass(frozen=True)
class DecisionSection:
    """The decision of a campaign, or why there is none (`hint`)."""

    slo: Slo | None
    prices: Prices | None
    prices_source: str | None
    sweeps: list[SweepDecision] = field(default_factory=list)
    hint: str | None = None


@dataclass(frozen=True)
class DecisionView:
    """One sweep as the HTML first screen shows it."""

    table: Table
    statements: list[str]
    conditions: list[str]
    plot: str | None


def targets(campaign: Mapping[str, Any]) -> tuple[Slo | None, Prices | None, str | None, str | None]:
    """(slo, prices, where the prices come from, what is wrong) from campaign.json."""
    conf = campaign.get("campaign") if isinstance(campaign.get("campaign"), Mapping) else {}
    assert isinstance(conf, Mapping)
    if "prices" in campaign:  # the run's resolved prices (campaign or inventory), config/slo.py lab_prices
        raw_prices, source = campaign.get("prices"), campaign.get("prices_source")
    else:
        raw_prices, source = conf.get("prices"), "the campaign's prices"
    try:
        slo = None if conf.get("slo") is None else Slo.model_validate(conf["slo"])
        prices = None if raw_prices is None else Prices.model_validate(raw_prices)
    except ValidationError as exc:
        return None, None, None, f"campaign.json: the slo or prices do not validate: {exc.errors()[0]['msg']}"
    return slo, prices, None if prices is None else str(source or "campaign.json"), None


def section(
    campaign: Mapping[str, Any],
    summary: pd.DataFrame,
    requests: Mapping[str, pd.DataFrame],
    predictions: Sequence[TierCapacity] = (),
    profile_l1: Mapping[str, Stated] | None = None,
    l2: Mapping[str, Stated] | None = None,
    replicates: int = bootstrap.REPLICATES,
    software: pd.DataFrame | None = None,
) -> DecisionSection:
    """The campaign's decision (report/build.py `conclude` passes what it already has)."""
    slo, prices, source, problem = targets(campaign)
    if problem is not None:
        return DecisionSection(None, None, None, hint=problem)
    if slo is None:
        return DecisionSection(None, prices, source, hint=NO_TARGET)
    sweeps = decide(
        summary, requests, slo, prices, predictions, profile_l1, l2, replicates=replicates, software=software
    )
    hint = None if sweeps else "No cell has been measured yet."
    return DecisionSection(slo, prices, source, sweeps, hint)


# --- one table row ---------------------------------------------------------------------------------
def _goodput(d: TierDecision) -> str:
    g = d.goodput
    if g is None or g.tokens_per_s is None:
        return MISSING
    at = ">= " if g.bound == ">=" else ""
    if g.tokens_per_s_per_gpu is None or g.requests_per_s_per_gpu is None:
        return f"{at}{g.tokens_per_s:.3g} tok/s per node"
    return f"{at}{g.tokens_per_s_per_gpu:.3g} tok/s ({g.requests_per_s_per_gpu:.2g} req/s)"


def money(v: float) -> str:
    """12,345 / 123 / 1.23 / 0.0123: whole units from 100 up, cents below, 3 digits under 1."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}" if v >= 1 else f"{v:.3g}"


def _cost(d: TierDecision, priced: bool) -> str:
    c = d.cost
    if c.per_million_tokens is None:
        return "not priced" if not priced else MISSING
    at = "<= " if c.bound == "<=" else ""
    out = f"{at}{money(c.per_million_tokens)}"
    if c.per_million_completion_tokens is not None:
        out += f" ({money(c.per_million_completion_tokens)} output)"
    return out


def _energy(d: TierDecision) -> str:
    e = d.cost.energy_kwh_per_million_tokens
    return MISSING if e is None else f"{e:.3g} kWh"


def _history(d: TierDecision) -> str:
    if d.history_tokens is None:
        return MISSING
    sessions = "" if d.history_sessions is None else f" ({d.history_sessions:.3g} sessions)"
    return f"{tokens_text(d.history_tokens)} tokens{sessions}"


def title(s: SweepDecision) -> str:
    return f"{served_name(s.model)} rounds={s.num_rounds} isl={s.isl} osl={s.osl}: sessions at {s.target}"


def table(s: SweepDecision) -> Table:
    """The sweep's decision table, its cells already text."""
    priced = s.currency is not None
    rows = [
        [
            d.tier,
            d.sessions_text,
            _goodput(d),
            _cost(d, priced),
            _energy(d),
            _history(d),
            d.verdict,
        ]
        for d in s.tiers
    ]
    note = "EXAMPLE prices, not a quote." if s.example_prices else ""
    headers = [f"{h} ({s.currency})" if h == "cost per 1M tokens" and s.currency else h for h in HEADERS]
    return Table(title(s), headers, rows, note)


def _conditions(s: SweepDecision) -> list[str]:
    out = list(s.conditions)
    if all(d.cost.energy_kwh_per_million_tokens is None for d in s.tiers):
        out.append("energy: no GPU power telemetry was sampled (the simulator has none)")
    return out


# --- the formats ------------------------------------------------------------------------------------
def views(sec: DecisionSection) -> list[DecisionView]:
    """The HTML first screen's entries, one per sweep, with its plot."""
    target = sec.slo.ttft_p95_s if sec.slo is not None else None
    out = []
    for s in sec.sweeps:
        plot = None if target is None else decision_plot.sessions_at_target(s, target)
        out.append(DecisionView(table(s), s.statements, _conditions(s), plot))
    return out


def markdown(sec: DecisionSection) -> list[str]:
    """The section as Markdown lines (report.md puts it above the findings)."""
    out = [f"## {TITLE}", ""]
    if sec.hint:
        out += [sec.hint, ""]
    for s in sec.sweeps:
        t = table(s)
        out += [f"### {t.title}", ""] + ([t.note, ""] if t.note else [])
        out.append("| " + " | ".join(t.headers) + " |")
        out.append("|" + "|".join("---" for _ in t.headers) + "|")
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in t.rows]
        out.append("")
        out += [f"- {line}" for line in s.statements] + ([""] if s.statements else [])
        out += ["Conditions:", ""] + [f"- {c}" for c in _conditions(s)] + [""]
        out += ["Plot (p95 TTFT against sessions at once, the target, the crossings): see index.html.", ""]
    return out


def terminal_lines(sec: DecisionSection) -> list[str]:
    """The tables and sentences as plain text, for a terminal (`run`, `demo`)."""
    if not sec.sweeps:
        return [f"{TITLE}: {sec.hint}"] if sec.hint else []
    lines = [f"{TITLE}:"]
    for s in sec.sweeps:
        t = table(s)
        widths = [max(len(h), *(len(r[i]) for r in t.rows)) for i, h in enumerate(t.headers)]
        lines += ["", f"  {t.title}" + (f" ({t.note})" if t.note else "")]
        for row in [t.headers, *t.rows]:
            lines.append(("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))).rstrip())
        lines += [f"  - {line}" for line in s.statements]
    return lines


def json_section(sec: DecisionSection) -> dict[str, Any]:
    """`report --format json`'s `decision`: the target, the prices and where they came from, why there
    is no table (`note`), and per sweep every figure (docs/metrics.md "Decision")."""
    return {
        "target": None if sec.slo is None else sec.slo.model_dump(mode="json"),
        "prices": None if sec.prices is None else sec.prices.model_dump(mode="json"),
        "prices_source": sec.prices_source,
        "note": sec.hint,
        "sweeps": [s.as_dict() for s in sec.sweeps],
    }


def empty_section() -> DecisionSection:
    """A section with nothing in it (a report built without conclusions)."""
    return DecisionSection(None, None, None, hint=NO_TARGET)


def csv_frame(sec: DecisionSection) -> pd.DataFrame:
    """`report --format csv --table decision`: one row per sweep and tier (analysis/decision.py
    CSV_COLUMNS)."""
    return csv_rows(sec.sweeps)
