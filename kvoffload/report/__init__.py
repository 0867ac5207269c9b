"""Report: Markdown + self-contained HTML (inline SVG plots) of a campaign, plus json/csv summaries.

Controller side (matplotlib, jinja2, pandas from the `controller` extra). IO and presentation only:
every figure comes from `kvoffload.analysis`. Entry point for the orchestrator: `build_report`.
"""

from kvoffload.report.build import build_report

__all__ = ["build_report"]
