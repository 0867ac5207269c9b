"""The live page of `kvoffload-lab watch`: one self-contained HTML document (templates/watch.html:
inline CSS, script and SVG; nothing fetched but its own `state.json`), which polls that endpoint every
few seconds and draws what `kvoffload.report.live` computed. Presentation only: every figure comes in
the JSON."""

from __future__ import annotations

import html
from importlib import resources

POLL_S = 3


def page(title: str) -> str:
    """The page (templates/watch.html), titled with the results folder's name."""
    source = resources.files("kvoffload.report").joinpath("templates/watch.html").read_text("utf-8")
    return source.replace("__TITLE__", html.escape(title)).replace("__POLL_MS__", str(POLL_S * 1000))
