"""`kvoffload-lab compare DIR_A DIR_B ...`: the same cells across campaigns, side by side.

Cells match on tier, model, concurrency, num_rounds, ISL, OSL and repeat; each figure is printed for
every campaign plus its change against the first campaign (%). The validity rules of one campaign's
report apply across campaigns (docs/metrics.md "Validity rules"): a match whose cells did not run clean,
lack sessions.json, breached their tier's routing, differ in session counts or exist in only some
campaigns is marked not comparable (`comparable`, `not_comparable_reasons` in json/csv; the `valid`
column and the lines under the table). Under the table, the software the lab hosts ran where it differs
between the campaigns (cell.json `software`): a change of figures may come from it. Thin CLI over
kvoffload.analysis.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvoffload.cli.args import add_command
from kvoffload.errors import UserError

DEFAULT_FIGURES = (
    "ttft_p50_s",
    "ttft_p95_s",
    "ttft_mean_s",
    "tpot_mean_s",
    "output_tokens_per_s",
    "ttft_degradation_p50_pct",
    "local_hit_rate",
    "external_hit_rate",
    "kv_usage_mean_pct",
    "achieved_sessions",
)


def register(sub: Any) -> None:
    c = add_command(sub, "compare", _compare)
    c.add_argument("results_dirs", type=Path, nargs="+", metavar="RESULTS_DIR", help="two or more folders")
    c.add_argument(
        "--figure",
        action="append",
        help=f"summary column to compare (repeatable; default: {', '.join(DEFAULT_FIGURES)})",
    )
    c.add_argument("--format", choices=("table", "json", "csv"), default="table", help="output format")
    c.add_argument(
        "--decision",
        action="store_true",
        help="compare the campaigns' decision tables instead of their cells (issue 42): per model, "
        "ISL/OSL, num_rounds and tier, each campaign's sessions at its latency target, cost per 1M tokens, "
        "goodput per GPU and verdict; comparable only with the same dataset (by digest) and target",
    )


def _printed(table: Any, fmt: str) -> bool:
    """Print `table` as JSON or CSV, its figures rounded (report/rounding.py), when `fmt` asks for one."""
    if fmt not in ("json", "csv"):
        return False
    from kvoffload.report.rounding import round_figure

    floats = table.select_dtypes("float").columns
    table[floats] = table[floats].map(round_figure)
    print(
        table.to_json(orient="records", indent=1) if fmt == "json" else table.to_csv(index=False),
        end="\n" if fmt == "json" else "",
    )
    return True


def _decisions(args: argparse.Namespace, labels: list[str]) -> int:
    """`compare --decision`: the decision tables side by side (kvoffload/analysis/decision_compare.py),
    each cost with its currency. Campaigns whose prices are in different currencies, or examples beside
    real ones, are refused (UserError, exit status 2) before anything is printed (issue 53)."""
    from rich.console import Console
    from rich.table import Table

    from kvoffload.analysis.decision_compare import MATCH, CampaignDecision, price_conflicts, side_by_side
    from kvoffload.report.build import analyse, conclude
    from kvoffload.report.decision_view import csv_frame, empty_section

    campaigns = []
    for label, d in zip(labels, args.results_dirs, strict=True):
        analysis = analyse(d)
        dataset = analysis.tables.campaign.get("dataset")
        digest = dataset.get("digest") if isinstance(dataset, dict) else None
        rows = csv_frame(conclude(analysis).decision or empty_section())
        campaigns.append(CampaignDecision(label, rows, digest))
    conflicts = price_conflicts(campaigns)
    if conflicts:
        files = ", ".join(str(d / "campaign.json") for d in args.results_dirs)
        raise UserError(
            f"compare --decision: the campaigns' costs cannot be compared: {'; '.join(conflicts)}. Fix: "
            "give every campaign one price list in one currency, all real or all examples: the "
            "campaign's `prices:` or the inventory's `kvoffload_prices` before a run; for a finished "
            f"campaign, `prices` in its campaign.json ({files}), which the report reads; then run compare "
            "again (a campaign without prices may stay as it is)"
        )
    table = side_by_side(campaigns)
    if _printed(table, args.format):
        return 0
    if table.empty:
        print('no decision in these campaigns (a campaign needs `slo:`: docs/metrics.md "Decision")')
        return 0
    out = Table(title="kvoffload-lab compare --decision")
    out.add_column(" ".join(MATCH))
    for c in campaigns:
        out.add_column(c.label)
    out.add_column("valid")
    for _, row in table.iterrows():
        cells = []
        for c in campaigns:
            sessions, bound = row[f"sessions@{c.label}"], row[f"sessions_bound@{c.label}"]
            if sessions is None or sessions != sessions:
                cells.append("–")
                continue
            prefix = "" if bound in ("=", None) else f"{bound} "
            cost = row[f"cost_per_million_tokens@{c.label}"]
            cost_bound = row[f"cost_bound@{c.label}"]
            currency = row[f"currency@{c.label}"]
            unit = "" if currency is None or currency != currency else f" {currency}"
            flag = row[f"example_prices@{c.label}"]
            example = " (example prices)" if flag == flag and flag else ""
            priced = (
                "" if cost is None or cost != cost else f", {cost_bound} {float(cost):.3g}{unit}/1M{example}"
            )
            cells.append(f"{prefix}{float(sessions):.3g} sessions{priced}; {row[f'verdict@{c.label}']}")
        out.add_row(" ".join(str(row[k]) for k in MATCH), *cells, "yes" if row["comparable"] else "NO")
    Console(width=max(120, 40 + 64 * len(campaigns))).print(out)
    for _, row in table[~table["comparable"]].iterrows():
        print(f"not comparable: {' '.join(str(row[k]) for k in MATCH)}: {row['not_comparable_reasons']}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    """compare matching cells across campaign results folders"""
    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from kvoffload.analysis.compare import MATCH_KEYS, compare_campaigns
    from kvoffload.analysis.software import campaign_differences
    from kvoffload.report.build import analyse
    from kvoffload.report.views import fmt

    if len(args.results_dirs) < 2:
        raise UserError("compare: give at least two RESULTS_DIR folders")
    labels: list[str] = []
    summaries: list[tuple[str, pd.DataFrame]] = []
    software: list[tuple[str, pd.DataFrame]] = []
    for d in args.results_dirs:
        if not d.is_dir():
            raise UserError(f"RESULTS_DIR {d}: not a folder; give results/<campaign>")
    for d in args.results_dirs:
        label = d.resolve().name
        while label in labels:
            label += "'"
        labels.append(label)
    if args.decision:
        return _decisions(args, labels)
    for d in args.results_dirs:
        label = labels[len(summaries)]
        analysis = analyse(d)
        summaries.append((label, analysis.summary))
        software.append((label, analysis.software))
    figures = tuple(args.figure or DEFAULT_FIGURES)
    known = set().union(*(set(s.columns) for _, s in summaries))
    unknown = [f for f in figures if f not in known]
    if unknown:
        raise UserError(f"--figure {', '.join(unknown)}: not a summary column (see `report --format csv`)")
    table = compare_campaigns(summaries, figures)
    if _printed(table, args.format):
        return 0
    out = Table(title="kvoffload-lab compare")
    out.add_column("cell (tier model c rounds isl osl repeat)")
    out.add_column("figure")
    validity = ("comparable", "not_comparable_reasons")
    value_columns = [c for c in table.columns if c not in (*MATCH_KEYS, "figure", *validity)]
    for col in value_columns:
        out.add_column(str(col), justify="right")
    checked = "comparable" in table.columns
    if checked:
        out.add_column("valid")
    invalid: dict[str, str] = {}
    for _, row in table.iterrows():
        key = " ".join(str(row[k]) for k in MATCH_KEYS)
        values = ["–" if pd.isna(row[c]) else fmt(row[c], 4) for c in value_columns]
        if checked:
            values.append("yes" if row["comparable"] else "NO")
            if not row["comparable"]:
                invalid[key] = str(row["not_comparable_reasons"])
        out.add_row(key, str(row["figure"]), *values)
    console = Console(width=max(120, 40 + 16 * len(value_columns)))
    console.print(out)
    if table.empty:
        print("no matching cells")
    if invalid:
        print('not comparable (same rules as a campaign\'s report, docs/metrics.md "Validity rules"):')
        for key, reasons in invalid.items():
            print(f"  {key}: {reasons}")
    differences = campaign_differences(software)
    if not differences.empty:
        print("software that differs between the campaigns (a change of figures may come from it):")
        diff = Table()
        for col in differences.columns:
            diff.add_column(str(col))
        for _, row in differences.iterrows():
            diff.add_row(*("–" if v is None or pd.isna(v) else str(v) for v in row))
        console.print(diff)
    return 0
