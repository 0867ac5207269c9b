"""The first error line of an engine's log, for a doctor check's detail (pure: text in, a line out).

A check that failed because a process died names its own words instead of "see the journal": the
first line logged at ERROR (or CRITICAL/FATAL) level, else the first Python exception line
(`RuntimeError: ...`). Read from `journalctl --output short-iso` or `--output cat` text, or from a
process's own stdout and stderr; LMCache colours its level names (ANSI escapes), which are dropped.
"""

from __future__ import annotations

import re

MAX_CHARS = 300
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# journalctl short-iso: `2026-12-05T08:00:00+0000 host python3[1234]: message`
_JOURNAL_PREFIX = re.compile(r"^\d{4}-\d\d-\d\dT\S+ \S+ [^\s:]+(\[\d+\])?: ")
# vLLM: `ERROR 12-05 10:00:00 [core.py:123] ...`, also behind a `(EngineCore_DP0 pid=7)` prefix;
# LMCache: `[2026-12-05 07:54:48,496] LMCache ERROR: ...`; the Python logging default `ERROR:name:...`
_LEVEL = re.compile(r"(^|[\s\]\)])(ERROR|CRITICAL|FATAL)([\s:]|$)")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)(: |$)")


def clean(line: str) -> str:
    """A log line without colour escapes and without journalctl's time/host/process prefix."""
    return _JOURNAL_PREFIX.sub("", _ANSI.sub("", line)).strip()


def first_error_line(text: str) -> str | None:
    """The first ERROR-level line, else the first exception line, of `text` (None: neither)."""
    lines = [clean(line) for line in text.splitlines()]
    found = next((line for line in lines if _LEVEL.search(line)), None)
    if found is None:
        found = next((line for line in lines if _EXCEPTION.match(line)), None)
    if found is None:
        return None
    return found if len(found) <= MAX_CHARS else found[: MAX_CHARS - 3] + "..."


def last_words(text: str, unit: str) -> str | None:
    """The last line a process wrote before it died, systemd's own lines about `unit` left out (for a
    process that aborts without logging an error, such as a failed C++ assertion)."""
    own = (f"{unit}:", f"{unit.removesuffix('.service')}.service:")
    lines = [clean(line) for line in text.splitlines()]
    found = next((line for line in reversed(lines) if line and not line.startswith(own)), None)
    if found is None:
        return None
    return found if len(found) <= MAX_CHARS else found[: MAX_CHARS - 3] + "..."
