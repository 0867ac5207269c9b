"""Report: Markdown + self-contained HTML (inline SVG plots) of a campaign, plus json/csv summaries.

Controller side (matplotlib, jinja2, pandas from the `controller` extra). IO and presentation only:
every figure comes from `kvoffload.analysis`. Entry points for the orchestrator: `build_report`,
and `write_report` with `findings_text` for a terminal that shows the findings.
"""

from kvoffload.report.build import build_report, findings_text, write_report

__all__ = ["build_report", "findings_text", "write_report"]
