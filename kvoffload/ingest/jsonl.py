"""Fast JSONL readers for request records and metric samples (DuckDB's multithreaded JSON reader).

Both readers declare the column types up front (derived from `contracts.records.RequestRecord` for
requests; `{ts, target, name, labels, value}` for samples), so absent optional fields read as null (or
as the model's default, for fields added after older files were written) and ids written as JSON
numbers read as text. Sample `labels` are read as raw JSON text and made canonical (sorted keys, compact, e.g.
`{"engine":"0","le":"0.5"}`) once per distinct label set, so label sets compare as strings and analysis
parses only the rows it filters. Output is pyarrow tables; no pandas and no per-row Python here.
Measured against row-by-row json.loads in bench/ingest_speed.py (pyarrow.json was 2-6x there, this
is >= 10x).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from kvoffload.contracts.arrow import arrow_schema, column_defaults
from kvoffload.contracts.records import READABLE_SCHEMAS, REQUEST_FIELDS, RequestRecord
from kvoffload.errors import UserError

# Derived from the record model: a field added there is a column here, with its default for older files.
REQUEST_SCHEMA = arrow_schema(RequestRecord, REQUEST_FIELDS)
_REQUEST_DEFAULTS = {k: v for k, v in column_defaults(RequestRecord).items() if k != "schema"}

SAMPLE_SCHEMA = pa.schema(
    [
        ("ts", pa.float64()),
        ("target", pa.string()),
        ("name", pa.string()),
        ("labels", pa.string()),
        ("value", pa.float64()),
    ]
)

log = logging.getLogger(__name__)

_DUCK_TYPES = {pa.int64(): "BIGINT", pa.float64(): "DOUBLE", pa.string(): "VARCHAR"}


def _columns_sql(schema: pa.Schema, overrides: dict[str, str] | None = None) -> str:
    cols = {f.name: (overrides or {}).get(f.name, _DUCK_TYPES[f.type]) for f in schema}
    return "{" + ", ".join(f"{json.dumps(name)}: '{typ}'" for name, typ in cols.items()) + "}"


def ends_mid_line(path: Path) -> bool:
    """Whether a non-empty file's last byte is not a newline (a writer stopped mid-line)."""
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1) != b"\n"


def _first_bad_line(path: Path) -> tuple[int, int, str] | None:
    """(line number, line count, problem) of the first line that is not a JSON object, or None.

    Only on the error path: DuckDB's own message is off by one line for malformed JSON.
    """
    bad: tuple[int, str] | None = None
    lineno = 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if bad is not None or not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                bad = (lineno, "not UTF-8 text")
            except (json.JSONDecodeError, RecursionError) as exc:
                bad = (lineno, f"invalid JSON: {getattr(exc, 'msg', 'nested too deeply')}")
            else:
                if not isinstance(row, dict):
                    bad = (lineno, f"a JSON {type(row).__name__}, not an object")
    return None if bad is None else (bad[0], lineno, bad[1])


def _read(path: Path, select: str, columns: str, what: str) -> pa.Table:
    query = f"SELECT {select} FROM read_json(?, format='newline_delimited', columns={columns}@OPTIONS@)"
    con = duckdb.connect()
    try:
        try:
            table: pa.Table = con.sql(query.replace("@OPTIONS@", ""), params=[str(path)]).to_arrow_table()
        except duckdb.Error as exc:
            bad = _first_bad_line(path)
            cut_off = ends_mid_line(path)
            if bad is not None and not (cut_off and bad[0] == bad[1]):
                line, _, problem = bad
                msg = f"{path}: line {line}: not a {what} ({problem}); fix or remove the broken line"
                raise UserError(msg) from exc
            if not cut_off:
                first = str(exc).splitlines()[0][:400]
                msg = f"{path}: not valid {what} lines ({first}); fix or remove the broken line"
                raise UserError(msg) from exc
            # A writer killed mid-line (the sampler is flushed per round): keep every whole line.
            log.warning(
                "%s: last line is cut off (writer stopped mid-line); reading the lines before it", path
            )
            lenient = query.replace("@OPTIONS@", ", ignore_errors=true")
            table = con.sql(lenient, params=[str(path)]).to_arrow_table()
            # The skipped line comes back as a row of nulls: drop it.
            all_null = pc.is_null(table.column(0))
            for column in table.columns[1:]:
                all_null = pc.and_(all_null, pc.is_null(column))
            table = table.filter(pc.invert(all_null))
    finally:
        con.close()
    return table


def read_requests(path: Path) -> pa.Table:
    """requests.jsonl -> table with exactly REQUEST_SCHEMA's columns (absent optional fields are null).

    Raises UserError naming the file when a line is not JSON or its schema version is not supported.
    """
    if path.stat().st_size == 0:
        return REQUEST_SCHEMA.empty_table()
    names = ", ".join(json.dumps(f.name) for f in REQUEST_SCHEMA)
    table = _read(path, names, _columns_sql(REQUEST_SCHEMA), "request record").cast(REQUEST_SCHEMA)
    versions = set(pc.unique(table["schema"]).to_pylist()) - {None}
    if versions - READABLE_SCHEMAS:
        raise UserError(
            f"{path}: request record schema {sorted(versions - READABLE_SCHEMAS)} is not supported "
            f"(this version reads schemas {sorted(READABLE_SCHEMAS)}); "
            "ingest it with a kvoffload-lab that writes that schema"
        )
    for name, default in _REQUEST_DEFAULTS.items():
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, pc.fill_null(table[name], default))
    return table


def canonical_labels(raw: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Raw JSON object texts -> canonical texts (sorted keys, compact); null or absent -> '{}'."""
    encoded = pc.dictionary_encode(pc.fill_null(raw, "{}"))
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    texts = encoded.dictionary.to_pylist()
    canonical = pa.array(
        [json.dumps(json.loads(t), sort_keys=True, separators=(",", ":")) for t in texts], pa.string()
    )
    return pc.take(canonical, encoded.indices)


def read_samples(path: Path) -> pa.Table:
    """A metrics JSONL file (`{ts, target, name, labels, value}` lines) -> SAMPLE_SCHEMA table."""
    if path.stat().st_size == 0:
        return SAMPLE_SCHEMA.empty_table()
    columns = _columns_sql(SAMPLE_SCHEMA, {"labels": "JSON"})
    select = "ts, target, name, CAST(labels AS VARCHAR) AS labels, value"
    raw = _read(path, select, columns, "metric sample")
    return pa.Table.from_arrays(
        [raw["ts"], raw["target"], raw["name"], canonical_labels(raw["labels"]), raw["value"]],
        schema=SAMPLE_SCHEMA,
    )
