"""The raw sample record and the Prometheus text parser (lab-host side, base deps only).

A sample is one line of `metrics/<target>.jsonl`: `{"ts", "target", "name", "labels", "value"}`. Every
scrape also writes one `up` sample (1 when the target answered, 0 with an `error` label when it did
not), so gaps are data, not crashes. Non-finite values (NaN, +Inf) are written as `null`, because JSON
has no spelling for them. `*_created` series (scrape-time timestamps that prometheus-client adds to every
counter and histogram) are dropped: they carry no measurement and would double the file size.

This module must not do network IO or interpret metric meaning.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

UP_METRIC = "up"


@dataclass(frozen=True)
class Sample:
    """One scraped value at one time from one target."""

    ts: float
    target: str
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    value: float | None = None

    def to_json(self) -> str:
        """One JSONL line (no trailing newline); non-finite values become null."""
        value = self.value if self.value is not None and math.isfinite(self.value) else None
        return json.dumps(
            {"ts": self.ts, "target": self.target, "name": self.name, "labels": self.labels, "value": value},
            separators=(",", ":"),
            sort_keys=False,
        )


def parse_exposition(text: str, target: str, ts: float) -> list[Sample]:
    """Parse a Prometheus text exposition into samples, dropping `*_created` series.

    Raises ValueError (from prometheus-client) when the text is not valid exposition format.
    """
    out: list[Sample] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            out.append(Sample(ts=ts, target=target, name=s.name, labels=dict(s.labels), value=float(s.value)))
    return out


def up_sample(target: str, ts: float, error: str | None) -> Sample:
    """The per-scrape health sample: 1 when the scrape worked, 0 (with the error text) when not."""
    if error is None:
        return Sample(ts=ts, target=target, name=UP_METRIC, labels={}, value=1.0)
    return Sample(ts=ts, target=target, name=UP_METRIC, labels={"error": error[:300]}, value=0.0)


def to_jsonl(samples: Iterable[Sample]) -> Iterator[str]:
    """Lines (with newline) for a JSONL file."""
    for s in samples:
        yield s.to_json() + "\n"
