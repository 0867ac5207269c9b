"""Property tests of the controller's JSONL readers: metric samples written by the sampler read back
equal (labels made canonical), and any file, whole or damaged, either reads into a table of the
declared schema or raises `UserError` naming the file, never another exception. Deterministic and
bounded in examples (each one is a DuckDB query).
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kvoffload.errors import UserError
from kvoffload.ingest.jsonl import REQUEST_SCHEMA, SAMPLE_SCHEMA, read_requests, read_samples
from kvoffload.metrics.samples import Sample, to_jsonl
from tests.support.properties import repeatable

PROPERTIES = repeatable(100)

text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=10)
samples = st.builds(
    Sample,
    ts=st.floats(allow_nan=False, allow_infinity=False, width=64),
    target=text,
    name=text,
    labels=st.dictionaries(text, text, max_size=3),
    value=st.none() | st.floats(allow_nan=True, allow_infinity=True),
)


def _read(reader: Any, data: bytes) -> Any:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x.jsonl"
        path.write_bytes(data)
        try:
            return reader(path)
        except UserError as exc:
            assert str(exc).startswith(str(path)), exc
            return None


@PROPERTIES
@given(st.lists(samples, min_size=1, max_size=20))
def test_written_samples_read_back_equal(written: list[Sample]) -> None:
    table = _read(read_samples, "".join(to_jsonl(written)).encode())
    assert table is not None and table.schema == SAMPLE_SCHEMA
    for row, sample in zip(table.to_pylist(), written, strict=True):
        value = sample.value if sample.value is not None and math.isfinite(sample.value) else None
        assert row == {
            "ts": sample.ts,
            "target": sample.target,
            "name": sample.name,
            "labels": json.dumps(sample.labels, sort_keys=True, separators=(",", ":")),
            "value": value,
        }


def _lines(written: list[Sample]) -> bytes:
    return "".join(to_jsonl(written)).encode()


@st.composite
def damaged(draw: Any) -> bytes:
    """A sample file with a line replaced, cut or garbled, or bytes that are not JSON at all."""
    lines = _lines(draw(st.lists(samples, min_size=1, max_size=6))).split(b"\n")
    at = draw(st.integers(0, len(lines) - 1))
    kind = draw(st.sampled_from(["replace", "cut", "garble", "truncate"]))
    if kind == "replace":
        lines[at] = json.dumps(
            draw(st.recursive(st.none() | st.integers() | text, st.lists, max_leaves=4))
        ).encode()
    elif kind == "cut":
        lines[at] = lines[at][: draw(st.integers(0, max(0, len(lines[at]) - 1)))]
    elif kind == "garble":
        lines[at] = draw(st.binary(max_size=12))
    else:
        return b"\n".join(lines)[: draw(st.integers(0, sum(map(len, lines))))]
    return b"\n".join(lines)


@PROPERTIES
@given(damaged() | st.binary(max_size=200))
def test_any_sample_file_reads_or_is_refused(data: bytes) -> None:
    table = _read(read_samples, data)
    if table is not None:
        assert table.schema == SAMPLE_SCHEMA
        assert all(isinstance(labels, str) for labels in table.column("labels").to_pylist())


request_values = st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | text
request_rows = st.fixed_dictionaries(
    {"schema": st.just(1)},
    optional={f.name: request_values for f in REQUEST_SCHEMA if f.name != "schema"},
)


@PROPERTIES
@given(st.lists(request_rows | st.recursive(request_values, st.lists, max_leaves=3), min_size=1, max_size=6))
def test_any_request_file_reads_or_is_refused(rows: list[Any]) -> None:
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    table = _read(read_requests, data)
    if table is not None:
        assert table.schema == REQUEST_SCHEMA and table.num_rows == len(rows)


def test_a_broken_line_is_named_exactly() -> None:
    """DuckDB's own message is a line late for malformed JSON; the reader names the right one."""
    good = _lines([Sample(ts=1.0, target="t", name="n", value=1.0)])
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x.jsonl"
        path.write_bytes(good + b'{"ts": 2.0, "target"\n' + good)
        try:
            read_samples(path)
        except UserError as exc:
            assert re.match(re.escape(f"{path}: line 2: not a metric sample (invalid JSON"), str(exc))
        else:
            raise AssertionError("a broken middle line was read")
