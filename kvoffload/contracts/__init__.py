"""The results contracts: one pydantic model per output file, and the one module that spells its paths.

`records` (requests.jsonl lines and sessions.json), `cell` (cell.json) and `layout` (where each file
lies) are used by the writers (replay, orchestrate) and by the readers (ingest) alike; `arrow` derives
the ingest column schema from a model. Models and path arithmetic only: no file IO here.
"""
