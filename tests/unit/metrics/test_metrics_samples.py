"""Prometheus exposition parsing and the sample record, on real vLLM 0.32 /metrics captures."""

from __future__ import annotations

import json
import math

import pytest

from kvoffload.metrics.samples import Sample, parse_exposition, to_jsonl, up_sample
from tests.unit.metrics.recorded import FIXTURES


def _by_name(samples: list[Sample]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for s in samples:
        out.setdefault(s.name, []).append(s)
    return out


def test_parse_vllm_after_has_counters_and_no_created_series() -> None:
    text = (FIXTURES / "vllm-0.32-metrics-after.txt").read_text()
    samples = parse_exposition(text, "vllm-0", 1000.0)
    names = _by_name(samples)
    # 386 non-comment lines in the capture minus the 0 `_created` ones among them, see README of the
    # capture: every counter/histogram also has a `_created` gauge, which we drop.
    assert not [n for n in names if n.endswith("_created")]
    [hits] = names["vllm:prefix_cache_hits_total"]
    [queries] = names["vllm:prefix_cache_queries_total"]
    assert (hits.value, queries.value) == (2176.0, 3069.0)  # sum of cached_tokens / prompt tokens
    assert hits.labels == {"engine": "0", "model_name": "tiny"}
    assert hits.target == "vllm-0" and hits.ts == 1000.0
    [prefill_count] = names["vllm:request_prefill_time_seconds_count"]
    assert prefill_count.value == 12.0
    buckets = names["vllm:request_prefill_time_seconds_bucket"]
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == 12.0


def test_parse_exampleconnector_external_counters() -> None:
    text = (FIXTURES / "vllm-0.32-metrics-exampleconnector-after.txt").read_text()
    names = _by_name(parse_exposition(text, "vllm-0", 0.0))
    assert names["vllm:external_prefix_cache_hits_total"][0].value == 1888.0
    # With a connector: external queries = queries - local hits (28287 - 5984).
    assert names["vllm:external_prefix_cache_queries_total"][0].value == 28287.0 - 5984.0
    stages = {s.labels["stage"] for s in names["vllm:num_requests_kv_fetch_by_stage"]}
    assert stages == {"waiting_to_start", "in_progress", "completed_waiting"}


def test_sample_json_turns_non_finite_values_into_null() -> None:
    lines = list(to_jsonl([Sample(1.5, "t", "g", {"a": "x"}, math.nan), Sample(2.0, "t", "g", {}, 3.0)]))
    first, second = (json.loads(line) for line in lines)
    assert first == {"ts": 1.5, "target": "t", "name": "g", "labels": {"a": "x"}, "value": None}
    assert second["value"] == 3.0
    assert all(line.endswith("\n") for line in lines)


def test_up_sample_records_the_error() -> None:
    assert up_sample("t", 1.0, None).value == 1.0
    down = up_sample("t", 1.0, "ConnectError: refused")
    assert (down.value, down.labels) == (0.0, {"error": "ConnectError: refused"})


def test_invalid_exposition_raises_value_error() -> None:
    with pytest.raises(ValueError):
        parse_exposition("metric{unclosed 1\n", "t", 0.0)
