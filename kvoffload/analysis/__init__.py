"""Pure analysis: DataFrames in, DataFrames (or plain figures) out, exactly as docs/metrics.md says.

Inputs are the ingest tables (`kvoffload.ingest`): requests, sessions, samples, cells. Nothing here
reads or writes files, prints, or plots; `kvoffload.report` does IO and presentation. Depends on pandas
and numpy only.
"""
