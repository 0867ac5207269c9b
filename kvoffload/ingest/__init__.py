"""Controller-side ingestion: a campaign's raw files -> typed parquet tables with a schema version.

Reads `results/<campaign>/cells/*/{cell.json, requests.jsonl, sessions.json, metrics/*.jsonl}` (layout in
docs/architecture.md section 9 and docs/metrics.md "## Files") and writes `tables/{cells,requests,sessions,
samples}.parquet` plus `tables/manifest.json`. Needs the `controller` extra (pyarrow, pandas). Computes
no figures: derived tables (rounds, summary) come from `kvoffload.analysis` via `kvoffload.report`.
"""

from kvoffload.ingest.tables import (
    TABLES_SCHEMA_VERSION,
    Tables,
    ensure_tables,
    ingest_campaign,
    ingest_needed,
    load_tables,
)

__all__ = [
    "TABLES_SCHEMA_VERSION",
    "Tables",
    "ensure_tables",
    "ingest_campaign",
    "ingest_needed",
    "load_tables",
]
