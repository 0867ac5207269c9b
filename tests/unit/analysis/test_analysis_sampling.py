"""A short replay sampled fast (the demo: about 11 s, every 2 s): its figures come from the sampler
rounds, and no note says the run was shorter than one sampling interval (issue 43, defect 10)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvoffload.analysis.compare import cell_warnings
from kvoffload.analysis.summary import cell_summary
from tests.unit.analysis.analysis_frames import Row, counter, samples_frame

LAB = {"engine": "0", "model_name": "m"}
ROUNDS = [2.0 * i for i in range(8)]  # sampler rounds at 0 .. 14 s
QUERIES, HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"


def _samples() -> pd.DataFrame:
    # 10 query tokens/s; hits from t=6 on, 8 tokens/s; snapshots at -1 and 15 s.
    rows: list[Row] = counter(QUERIES, lambda t: 1000 + 10 * t, ROUNDS, **LAB)
    rows += counter(HITS, lambda t: 100 + 8 * max(0.0, t - 6), ROUNDS, **LAB)
    rows += [("run", t, "vllm-0", "vllm:kv_cache_usage_perc", LAB, 0.5) for t in ROUNDS]
    for phase, t, q, h in (("before", -1.0, 1000.0, 100.0), ("after", 15.0, 1150.0, 172.0)):
        rows += [(phase, t, "vllm-0", QUERIES, LAB, q), (phase, t, "vllm-0", HITS, LAB, h)]
    return samples_frame(rows)


def _requests() -> pd.DataFrame:
    """Two users of four rounds, sent from t=3.5 to t=12.5 and each 1 s long: an 11 s replay."""
    return pd.DataFrame(
        [
            {"cell_id": "c", "user_id": f"u{u}", "session_id": f"s{u}", "chunk": 0, "round": r,
             "request_id": f"u{u}-{r}", "t_start": 0.5 + 3 * r + u, "ttft_s": 0.1, "latency_s": 1.0,
             "tpot_s": 0.01, "prompt_tokens": 100, "completion_tokens": 8, "cached_tokens": 0,
             "status": "ok", "replica": "vllm-0"}
            for u in range(2)
            for r in range(1, 5)
        ]
    )  # fmt: skip


def _cell() -> pd.Series:
    return pd.Series(
        {"cell_id": "c", "tier": "cpu", "model": "m", "concurrency": 2, "num_rounds": 4, "isl": 1000,
         "osl": 8, "repeat": 0, "status": "done", "done": True, "valid": True, "invalid_reasons": "",
         "node": "n", "client": "cl", "cold_start": "reset", "l2_device": None, "units": None,
         "profiles": None, "config": None,
         "targets": json.dumps({"vllm-0": {"kind": "vllm", "host": "h", "url": "http://h:8000/metrics"}})}
    )  # fmt: skip


def test_a_short_replay_sampled_every_2_s_uses_its_rounds_and_says_nothing_false() -> None:
    row = cell_summary(_cell(), _requests(), None, _samples())
    # the rate over the 2 s rounds (final quarter: t=12 and 14, 300 s windows back to t=0), not the
    # snapshots' 72 / 150 = 0.48 with a note about a run "shorter than one sampling interval"
    assert row["local_hit_rate_source"] == "samples"
    assert row["local_hit_rate"] == pytest.approx((48 / 120 + 64 / 140) / 2)
    assert [w for w in cell_warnings(pd.Series(row)) if w["kind"] == "fallback_before_after"] == []
    assert row["run_s"] == pytest.approx(11.0) and row["sample_interval_s"] == pytest.approx(2.0)
