"""Warnings about missing or damaged inputs, and which warnings are information rather than validity.

The summary's `data_notes` column (analysis/summary.py) holds, per cell, each figure that fell back to
other data or is null because its input is missing or damaged (analysis/series.py, client.py,
lmcache.py); ingest lists the raw files it could not read (`Tables.unreadable`). Both become rows of
the warnings table (analysis/compare.py WARNING_COLUMNS). Warnings of INFO_KINDS say a figure came
from a fallback that gives the same figure (a run shorter than one sample, a target whose before
snapshot is missing but whose sampler rounds exist): the report groups them by kind, so the validity
warnings stand out. docs/metrics.md "Null rules" lists every rule. Pure: DataFrames in, DataFrames out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pandas as pd

from kvoffload.analysis.compare import WARNING_COLUMNS, group_label

# Kinds that say where a figure came from, not that it is wrong or missing.
INFO_KINDS = frozenset(
    {
        "fallback_before_after",
        "before_snapshot_missing",
        "after_snapshot_missing",
        "snapshot_incomplete",
        "counter_reset",
        "prefix_reuse_unknown",
        "file_cut_off",
    }
)


def note_warnings(
    summary: pd.DataFrame,
    unreadable: Sequence[dict[str, str]] = (),
    cut_off: Sequence[dict[str, str]] = (),
) -> pd.DataFrame:
    """One warning row per data note of each summary row, plus one per unreadable raw file and per
    metrics file whose last line was cut off (ingest's `unreadable` and `cut_off`)."""
    rows: list[dict[str, Any]] = [
        {
            "scope": "cell",
            "cell_id": u["cell_id"],
            "group": "",
            "kind": "file_unreadable",
            "message": f"{u['file']} not read: {u['reason']}; the figures from it are null",
        }
        for u in unreadable
    ]
    rows += [
        {
            "scope": "cell",
            "cell_id": c["cell_id"],
            "group": "",
            "kind": "file_cut_off",
            "message": f"{c['file']}: last line cut off (the writer stopped mid-line); read up to it",
        }
        for c in cut_off
    ]
    if "data_notes" in summary.columns:
        for _, row in summary.iterrows():
            text = row["data_notes"]
            if not isinstance(text, str) or not text:
                continue
            for n in json.loads(text):
                rows.append(
                    {
                        "scope": "cell",
                        "cell_id": str(row["cell_id"]),
                        "group": group_label(row),
                        "kind": str(n["kind"]),
                        "message": str(n["message"]),
                    }
                )
    return pd.DataFrame(rows, columns=WARNING_COLUMNS)


def is_info(kind: str) -> bool:
    """Whether a warning kind is information (INFO_KINDS), not validity."""
    return kind in INFO_KINDS


def grouped_info(warnings: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The informational warnings grouped by kind: {kind, count, cells (sorted), messages (distinct,
    in order)}, kinds in order of first appearance."""
    out: dict[str, dict[str, Any]] = {}
    for w in warnings:
        if not is_info(str(w["kind"])):
            continue
        g = out.setdefault(str(w["kind"]), {"kind": w["kind"], "count": 0, "cells": set(), "messages": []})
        g["count"] += 1
        if w.get("cell_id"):
            g["cells"].add(str(w["cell_id"]))
        if w["message"] not in g["messages"]:
            g["messages"].append(w["message"])
    return [{**g, "cells": sorted(g["cells"])} for g in out.values()]
