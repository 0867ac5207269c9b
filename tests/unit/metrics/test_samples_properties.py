"""Property tests of reading metrics on lab hosts: the Prometheus text parser and the GPU tool parsers
take any text and either return samples or raise ValueError, the one error the sampler catches (so
that a strange scrape becomes an `up == 0` sample, never a dead sampler); what prometheus-client writes
parses back to the same samples; a sample's JSON line reads back equal. Deterministic and bounded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kvoffload.metrics.gpu import parse_amd_smi_monitor, parse_nvidia_smi_csv
from kvoffload.metrics.samples import Sample, parse_exposition
from tests.support.properties import repeatable

PROPERTIES = repeatable(150)

metric_names = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True).filter(
    lambda n: not n.endswith(("_created", "_total", "_count", "_sum", "_bucket", "_info"))
)
label_names = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True).filter(lambda n: not n.startswith("__"))
label_values = st.text(max_size=10)
values = st.floats(allow_nan=True, allow_infinity=True)
# Lines that look like exposition (comments, samples with odd labels and values) and plain noise.
exposition_lines = st.one_of(
    st.text(max_size=40),
    st.builds(
        lambda n, t: f"# TYPE {n} {t}",
        metric_names,
        st.sampled_from(["counter", "gauge", "histogram", "summary", "untyped", "bogus"]),
    ),
    st.builds(lambda n, h: f"# HELP {n} {h}", metric_names, st.text(max_size=10)),
    st.builds(lambda n, lbl, v: f"{n}{{{lbl}}} {v}", metric_names, st.text(max_size=15), st.text(max_size=8)),
    st.builds(lambda n, v, ts: f"{n} {v} {ts}", metric_names, st.text(max_size=8), st.text(max_size=8)),
)


@PROPERTIES
@given(st.lists(exposition_lines, max_size=8).map("\n".join) | st.text(max_size=200))
def test_any_text_parses_or_raises_value_error(text: str) -> None:
    try:
        samples = parse_exposition(text, "t", 1.0)
    except ValueError:
        return
    assert all(isinstance(s, Sample) and s.target == "t" and s.ts == 1.0 for s in samples)
    assert not any(s.name.endswith("_created") for s in samples)


@st.composite
def families(draw: Any) -> list[tuple[str, str, list[tuple[dict[str, str], float]]]]:
    """(name, kind, [(labels, value)]) of a few gauge and counter families with distinct label sets."""
    out = []
    for name in draw(st.lists(metric_names, min_size=1, max_size=4, unique=True)):
        kind = draw(st.sampled_from(["gauge", "counter"]))
        keys = draw(st.lists(label_names, max_size=3, unique=True))
        rows = draw(
            st.lists(
                st.tuples(st.fixed_dictionaries({k: label_values for k in keys}), values),
                max_size=3,
                unique_by=lambda row: tuple(sorted(row[0].items())),
            )
        )
        if kind == "counter":  # counters only go up from 0
            rows = [(labels, abs(v) if not math.isnan(v) else v) for labels, v in rows]
        out.append((name, kind, rows))
    return out


class _Collector:
    def __init__(self, fams: list[tuple[str, str, list[tuple[dict[str, str], float]]]]) -> None:
        self.fams = fams

    def collect(self) -> list[Any]:
        out: list[Any] = []
        for name, kind, rows in self.fams:
            keys = sorted(rows[0][0]) if rows else []
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, "help", labels=keys
            )
            for labels, value in rows:
                family.add_metric([labels[k] for k in keys], value)
            out.append(family)
        return out


def _same(a: float | None, b: float | None) -> bool:
    return (a is not None and b is not None and math.isnan(a) and math.isnan(b)) or a == b


@PROPERTIES
@given(families())
def test_what_prometheus_client_writes_parses_back(fams: list[tuple[str, str, list[Any]]]) -> None:
    registry = CollectorRegistry()
    registry.register(_Collector(fams))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    samples = parse_exposition(text, "vllm-0", 42.0)
    expected = [
        (f"{name}_total" if kind == "counter" else name, labels, value)
        for name, kind, rows in fams
        for labels, value in rows
    ]
    assert len(samples) == len(expected)
    for sample, (name, labels, value) in zip(samples, expected, strict=True):
        assert (sample.name, sample.labels, sample.target, sample.ts) == (name, labels, "vllm-0", 42.0)
        assert _same(sample.value, value)


@PROPERTIES
@given(
    st.builds(
        Sample,
        ts=st.floats(allow_nan=False, allow_infinity=False),
        target=st.text(max_size=10),
        name=st.text(max_size=10),
        labels=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
        value=st.none() | values,
    )
)
def test_a_sample_line_reads_back_equal(sample: Sample) -> None:
    row = json.loads(sample.to_json())
    assert row == {
        "ts": sample.ts,
        "target": sample.target,
        "name": sample.name,
        "labels": sample.labels,
        "value": sample.value if sample.value is not None and math.isfinite(sample.value) else None,
    }


csv_cells = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=8) | st.sampled_from(
    ["[N/A]", "0", "81559", "nan", "inf", "-1", "GPU-1", '"', ",", "\x00", "1e400"]
)


@PROPERTIES
@given(
    st.lists(st.lists(csv_cells, max_size=9).map(", ".join), max_size=4).map("\n".join)
    | st.text(max_size=200)
)
def test_nvidia_smi_text_parses_or_raises_value_error(text: str) -> None:
    _parses_or_raises_value_error(parse_nvidia_smi_csv, text, "nvidia")


def _parses_or_raises_value_error(
    parse: Callable[[str, str, float], list[Sample]], text: str, vendor: str
) -> None:
    """A GPU tool's output either parses into samples of `vendor`, each with a value, or raises
    ValueError: nothing else escapes the parser."""
    try:
        samples = parse(text, "gpu", 1.0)
    except ValueError:
        return
    assert all(s.labels["vendor"] == vendor and s.value is not None for s in samples)


amd_lines = st.one_of(
    st.just("GPU  POWER  GFX_UTIL  VRAM_USED  VRAM_TOTAL"),
    st.just("GPU"),
    st.lists(csv_cells | st.sampled_from(["W", "mW", "%", "MB", "GB", "N/A"]), max_size=7).map("  ".join),
    st.text(max_size=30),
)


@PROPERTIES
@given(st.lists(amd_lines, max_size=5).map("\n".join))
def test_amd_smi_text_parses_or_raises_value_error(text: str) -> None:
    _parses_or_raises_value_error(parse_amd_smi_monitor, text, "amd")
