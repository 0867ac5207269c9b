"""The report's first answer: which tier, at what scale, at what cost (issue 42), in every format.

Reads the campaign's latency target and prices from campaign.json (the run's resolved prices when it
recorded them, `prices` / `prices_source`, else the campaign's own `prices`), runs the decision
analysis (kvoffload/analysis/decision.py) and renders it: per sweep a headline that names the pick (or
says why there is none), one table (tier | sessions at the target [95 % CI] | goodput per GPU | cost per
1M tokens | energy per 1M tokens | history retained | verdict; the HTML first screen shows tier, verdict,
sessions and cost so that it fits a 1400 px window, and the rest in a block below), the sentences
against gpu, the conditions and the plot (report/decision_plot.py), as HTML context, Markdown lines,
terminal lines, the JSON `decision` section and the decision CSV. Only formatting here; every figure
and rule is the analysis's (docs/metrics.md "Decision").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd
from pydantic import ValidationError

from kvoffload.analysis import bootstrap
from kvoffload.analysis.capacity import Stated, TierCapacity, tokens_text
from kvoffload.analysis.decision import SweepDecision, TierDecision, csv_rows, decide
from kvoffload.analysis.findings import served_name
from kvoffload.config.slo import Prices, Slo
from kvoffload.report import decision_plot
from kvoffload.report.views import MISSING, Table, markdown_rows

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

    @property
    def headline(self) -> str | None:
        """Why there is no pick at all (section_headline); the sweeps' own headlines say theirs."""
        return section_headline(self)


@dataclass(frozen=True)
class DecisionView:
    """One sweep as the HTML first screen shows it: the headline that names the pick, the narrow table
    (`table`, FIRST_SCREEN), the other columns (`details`, DETAILS) in a block that opens on a click."""

    title: str
    headline: str
    caveat: str
    table: Table
    details: Table
    levels: Table
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
    cells: pd.DataFrame | None = None,
) -> DecisionSection:
    """The campaign's decision (report/build.py `conclude` passes what it already has; `cells`: the
    ingest cells table, whose host facts say whether a tier's nodes may share one curve)."""
    slo, prices, source, problem = targets(campaign)
    if problem is not None:
        return DecisionSection(None, None, None, hint=problem)
    if slo is None:
        return DecisionSection(None, prices, source, hint=NO_TARGET)
    sweeps = decide(
        summary,
        requests,
        slo,
        prices,
        predictions,
        profile_l1,
        l2,
        replicates=replicates,
        software=software,
        cells=cells,
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


# Every column of the decision table by its header: the full table (Markdown, terminal) shows HEADERS,
# the HTML first screen FIRST_SCREEN (narrow enough for a 1400 px window, the verdict beside the tier)
# and the rest in DETAILS below it. A new figure is one entry here and a place in those lists.
Cell = Callable[[SweepDecision, TierDecision], str]
COLUMNS: dict[str, Cell] = {
    "tier": lambda s, d: d.tier,
    "sessions at the target [95 % CI]": lambda s, d: d.sessions_text,
    "goodput per GPU": lambda s, d: _goodput(d),
    "cost per 1M tokens": lambda s, d: _cost(d, s.currency is not None),
    "energy per 1M tokens": lambda s, d: _energy(d),
    "history retained": lambda s, d: _history(d),
    "verdict": lambda s, d: d.verdict,
}
FIRST_SCREEN = ["tier", "verdict", "sessions at the target [95 % CI]", "cost per 1M tokens"]
DETAILS = ["tier", "goodput per GPU", "energy per 1M tokens", "history retained"]


def table(s: SweepDecision, headers: Sequence[str] = HEADERS, name: str | None = None) -> Table:
    """The sweep's decision table, its cells already text: the columns `headers` (COLUMNS' keys)."""
    rows = [[COLUMNS[h](s, d) for h in headers] for d in s.tiers]
    note = "EXAMPLE prices, not a quote." if s.example_prices else ""
    shown = [f"{h} ({s.currency})" if h == "cost per 1M tokens" and s.currency else h for h in headers]
    return Table(title(s) if name is None else name, shown, rows, note)


LEVEL_HEADERS = [
    "tier",
    "level (sessions asked)",
    "load held",
    "steady window",
    "runs",
    "later p95 TTFT [95 % CI]",
    "judged",
]


def _judged(lv: Any) -> str:
    """ "meets", "missed: p95 TTFT 0.61 s > 0.5 s", "not judged: ..." (config/slo.py `judge`)."""
    if lv.meets is True:
        return "meets"
    if lv.meets is False:
        return "missed: " + "; ".join(lv.missed)
    return "not judged: missing " + "; ".join(lv.unknown)


def _p95(lv: Any) -> str:
    if lv.ttft_p95_s is None:
        return MISSING
    ci = lv.ttft_p95_ci_s
    return f"{lv.ttft_p95_s:.3g} s" + ("" if not ci else f" [{ci[0]:.3g}-{ci[1]:.3g}]")


def levels_table(s: SweepDecision) -> Table:
    """Per tier and level: the load its cells held over their steady windows (docs/metrics.md "Steady
    window"), the window's length, the runs pooled, the later-round p95 and the judgement; a level no
    cell held says why."""
    rows = []
    for d in s.tiers:
        for lv in d.levels:
            held = MISSING if lv.held_sessions is None else f"{lv.held_sessions:.3g} sessions"
            window = MISSING if lv.window_s is None else f"{lv.window_s:.3g} s (mean)"
            rows.append([d.tier, str(lv.sessions_at_once), held, window, str(lv.runs), _p95(lv), _judged(lv)])
    return Table("levels: the load each held, and its judgement", LEVEL_HEADERS, rows)


def _one_run(s: SweepDecision) -> bool:
    """The decision rests on one run: the sweep's `runs` where the analysis counts them, else every
    measured level of every tier has a single cell (one repeat, one concurrency)."""
    runs = getattr(s, "runs", 0)  # the fewest runs behind a tier's decisive levels, where counted
    if runs:
        return bool(runs == 1)
    sizes = [len(lv.cells) for d in s.tiers for lv in d.levels]
    return bool(sizes) and max(sizes) == 1


ONE_RUN = "each level rests on one run, so run-to-run noise is not in its interval"


def _bare(sessions_text: str) -> str:
    """ ">= 32" of ">= 32 (the most this dataset can replay)", "17.9" of "17.9 [<17-19.5]": the figure
    without its words and interval (the table beside the headline has them)."""
    return sessions_text.split(" (", 1)[0].split(" [", 1)[0]


def _cost_against(d: TierDecision, gpu: TierDecision, currency: str | None) -> str:
    """ ", cost per 1M tokens <= 0.0144 against 0.0182 USD", or "" when a side has no cost."""
    a, b = d.cost.per_million_tokens, gpu.cost.per_million_tokens
    if a is None or b is None:
        return ""
    at = {"<=": "<= ", ">=": ">= "}
    return (
        f", cost per 1M tokens {at.get(d.cost.bound, '')}{money(a)} against "
        f"{at.get(gpu.cost.bound, '')}{money(b)}{f' {currency}' if currency else ''}"
    )


def headline(s: SweepDecision) -> str:
    """One line that names the sweep's pick and what it rests on, or why there is none."""
    said, caveat = headline_parts(s)
    return f"{said}; {caveat}" if caveat else said


def headline_parts(s: SweepDecision) -> tuple[str, str]:
    """The headline ("pick: cpu — ...", "no pick — ...") and its caveat ("" when none). The pick, why
    there is none and the verdicts are the analysis's (analysis/decision.py `_pick`)."""
    why_not = getattr(s, "no_pick", None)  # the analysis's own reason, where it gives one
    if s.pick is None and why_not:
        return f"no pick — {why_not}", ""
    return _said(s), ONE_RUN if _one_run(s) else ""


def _said(s: SweepDecision) -> str:
    """The headline without its caveat (headline_parts)."""
    gpu = next((d for d in s.tiers if d.tier == "gpu"), None)
    offload = [d for d in s.tiers if d.tier != "gpu"]
    picked = next((d for d in offload if d.tier == s.pick), None)
    if picked is not None and gpu is None:
        return f"pick: {s.pick} — {picked.verdict.removeprefix('pick: ')}"
    if picked is not None and gpu is not None:
        sessions = f"{_bare(picked.sessions_text)} against {_bare(gpu.sessions_text)}"
        cost = _cost_against(picked, gpu, s.currency)
        return f"pick: {s.pick} — more sessions than gpu at {s.target} ({sessions}){cost}"
    apart = "; ".join(f"{d.tier}: {d.verdict}" for d in offload)
    none_apart = f"no offload tier separates from gpu at {s.target}" + (f" ({apart})" if apart else "")
    if s.pick == "gpu":
        return f"pick: gpu — {none_apart if offload else 'the only tier measured'}"
    reasons = ["no gpu cell to compare against" if gpu is None else f"gpu: {gpu.verdict}"]
    if not any(d.more_than_gpu for d in offload):
        reasons.append(none_apart)
    return "no pick — " + "; ".join(reasons)


def section_headline(sec: DecisionSection) -> str | None:
    """Why the section has no pick at all (no target, nothing measured), or None when it has sweeps."""
    if sec.sweeps:
        return None
    if sec.slo is None and sec.hint == NO_TARGET:
        return "no pick — the campaign sets no latency target (`slo`), so no tier can be judged at one"
    return f"no pick — {sec.hint}" if sec.hint else None


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
        # the details carry no cost, so not the note on the prices either
        first, more = table(s, FIRST_SCREEN, name=""), replace(table(s, DETAILS, name=""), note="")
        said, caveat = headline_parts(s)
        out.append(
            DecisionView(
                title(s), said, caveat, first, more, levels_table(s), s.statements, _conditions(s), plot
            )
        )
    return out


def markdown(sec: DecisionSection) -> list[str]:
    """The section as Markdown lines (report.md puts it above the findings)."""
    out = [f"## {TITLE}", ""]
    top = section_headline(sec)
    out += [f"**{top}**", ""] if top else []
    if sec.hint:
        out += [sec.hint, ""]
    for s in sec.sweeps:
        t = table(s)
        out += [f"### {t.title}", "", f"**{headline(s)}**", ""] + ([t.note, ""] if t.note else [])
        out += [*markdown_rows(t), ""]
        out += [f"- {line}" for line in s.statements] + ([""] if s.statements else [])
        lv = levels_table(s)
        if lv.rows:
            out += ["Levels (the load each held over its steady window, and its judgement):", ""]
            out += [*markdown_rows(lv), ""]
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
        lines += ["", f"  {t.title}" + (f" ({t.note})" if t.note else ""), f"  {headline(s)}"]
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
