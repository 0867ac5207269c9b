"""Metrics sampling on lab hosts: scrape Prometheus targets and GPU tools into raw JSONL samples.

Runs on the client host (and on `vllm` hosts for GPU telemetry) during a replay, so it may import only
the base dependencies (httpx, prometheus-client, pydantic, pyyaml, rich): never pandas, pyarrow or
matplotlib. It writes raw samples `{ts, target, name, labels, value}` and interprets nothing; the
controller-side `kvoffload.ingest` and `kvoffload.analysis` turn them into figures.
"""
