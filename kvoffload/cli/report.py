"""`kvoffload-lab ingest RESULTS_DIR` and `kvoffload-lab report RESULTS_DIR [--format ...]`.

Thin CLI over `kvoffload.ingest` and `kvoffload.report` (controller extra). `report` ingests first when
the tables are missing or older than the raw files. md/html write files under RESULTS_DIR/report/;
json prints {"summary": one object per cell, "findings", "capacity", "decision"} (docs/metrics.md "report
--format json"), csv the summary table (one row per cell; `--table decision`: the decision's rows), to
stdout or to --output.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kvoffload.atomic import write_text_atomic
from kvoffload.cli.args import add_command
from kvoffload.errors import UserError

FORMATS = ("md", "html", "json", "csv")


def register(sub: Any) -> None:
    i = add_command(sub, "ingest", _ingest)
    _results_dir(i)
    r = add_command(sub, "report", _report)
    _results_dir(r)
    r.add_argument(
        "--format",
        action="append",
        choices=FORMATS,
        help="md and/or html (files under RESULTS_DIR/report; default both), or json (summary, findings "
        "and capacity) / csv (the summary table) on stdout (or --output)",
    )
    r.add_argument("--output", type=Path, help="file for --format json|csv (default: stdout)")
    r.add_argument(
        "--table",
        choices=("summary", "decision"),
        default="summary",
        help="for --format csv: summary (one row per cell, the default) or decision (one row per model, "
        "num_rounds, ISL, OSL and tier: sessions at the campaign's slo, goodput, cost; docs/metrics.md)",
    )


def _results_dir(p: argparse.ArgumentParser) -> None:
    """RESULTS_DIR, the one campaign's folder that `ingest` and `report` read (checked by `_check_dir`)."""
    p.add_argument("results_dir", type=Path, metavar="RESULTS_DIR", help="results/<campaign> folder")


def _check_dir(path: Path) -> None:
    if not path.is_dir():
        raise UserError(f"RESULTS_DIR {path}: not a folder; give results/<campaign>")


def _ingest(args: argparse.Namespace) -> int:
    """turn a campaign's raw files into parquet tables (tables/)

    Read every cell's raw files under RESULTS_DIR (requests.jsonl, sessions.json, metric samples, cell.json)
    into parquet tables under RESULTS_DIR/tables, and the derived tables the report uses; print the tables
    written and every warning (invalid cells, missing files). Raw files are never changed, so ingesting again
    gives the same tables.
    """
    from kvoffload.ingest import ingest_campaign, load_tables
    from kvoffload.report.build import analyse, write_derived_tables

    _check_dir(args.results_dir)
    out = ingest_campaign(args.results_dir)
    # `ingest` is the command that checks raw files: one it could not read is an error here (exit 2,
    # naming file and line), while `report` goes on without it and says so (docs/metrics.md "Null rules").
    unreadable = load_tables(args.results_dir).unreadable
    if unreadable:
        reasons = "\n".join(u["reason"] for u in unreadable)
        raise UserError(f"{reasons}\n(tables written without these files; `report` leaves them out)")
    analysis = analyse(args.results_dir)
    write_derived_tables(analysis, args.results_dir)
    names = sorted(p.stem for p in out.glob("*.parquet"))
    print(f"ingest: {', '.join(names)} written to {out}")
    for w in analysis.warnings.itertuples():
        print(f"warning: {w.kind} [{w.cell_id}]: {w.message}")
    return 0


def _report(args: argparse.Namespace) -> int:
    """write the campaign report (report/index.html and report.md)

    Answer whether KV offload helps for a campaign: findings with bootstrap CIs, capacity, knee,
    recommendation and settings. Ingests first when the tables are missing or older than the raw files. md and
    html write files under RESULTS_DIR/report; json and csv print to stdout (or --output), their figures
    rounded.
    """
    from kvoffload.report.build import analyse, build_report, conclude, report_json, summary_csv
    from kvoffload.report.rounding import round_figure

    _check_dir(args.results_dir)
    formats = tuple(args.format or ("md", "html"))
    data_formats = [f for f in formats if f in ("json", "csv")]
    file_formats = tuple(f for f in formats if f in ("md", "html"))
    if len(data_formats) > 1:
        raise UserError("--format: give at most one of json, csv per run")
    if args.output and not data_formats:
        raise UserError("--output is only for --format json or csv")
    if args.table != "summary" and data_formats != ["csv"]:
        raise UserError("--table is only for --format csv")
    if args.output and (args.output.is_dir() or not args.output.parent.is_dir()):
        raise UserError(f"--output {args.output}: give a file in an existing folder")
    if file_formats:
        index = build_report(args.results_dir, file_formats)
        report_dir = index.parent
        for f in file_formats:
            print(f"report: {report_dir / ('index.html' if f == 'html' else 'report.md')}")
    if data_formats:
        analysis = analyse(args.results_dir)
        if data_formats[0] == "json":
            doc = round_figure(json.loads(report_json(analysis, conclude(analysis))))
            text = json.dumps(doc, indent=1) + "\n"
        else:
            summary = analysis.summary.copy()
            if args.table == "decision":  # issue 42: the decision's rows (report/decision_view.py)
                from kvoffload.report.decision_view import csv_frame, empty_section

                summary = csv_frame(conclude(analysis).decision or empty_section())
            floats = summary.select_dtypes("float").columns
            summary[floats] = summary[floats].map(round_figure)
            text = summary_csv(summary)
        if args.output:
            write_text_atomic(args.output, text)
        else:
            print(text, end="")
    return 0
