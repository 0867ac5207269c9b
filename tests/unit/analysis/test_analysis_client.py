"""Client-side figures from hand-made request records, expected values worked out below."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from kvoffload.analysis.client import request_figures, reuse_from_records, ttft_by_round, ttft_cdf
from kvoffload.analysis.reuse import prefix_reuse
from kvoffload.analysis.series import collect_notes


def _req(
    user: str, rnd: int, t: float, ttft: float | None, prompt: int, status: str = "ok"
) -> dict[str, Any]:
    return {
        "cell_id": "c",
        "user_id": user,
        "round": rnd,
        "t_start": t,
        "ttft_s": ttft,
        "latency_s": 2.0,
        "tpot_s": 0.05 if status == "ok" else None,
        "prompt_tokens": prompt,
        "completion_tokens": 10 if status == "ok" else 0,
        "status": status,
    }


REQUESTS = pd.DataFrame(
    [
        _req("a", 1, 100.0, 1.0, 100),
        _req("a", 2, 102.0, 2.0, 200),
        _req("a", 3, 104.0, 3.0, 300),
        _req("b", 1, 100.0, 1.2, 100),
        _req("b", 2, 103.0, 2.2, 200),
        _req("b", 3, 106.0, 3.4, 300),
        _req("c", 1, 107.0, None, 50, status="error"),  # ends at 109: last request
    ]
)


def test_ttft_statistics_of_ok_requests() -> None:
    f = request_figures(REQUESTS)
    # ok TTFTs sorted: 1.0 1.2 2.0 2.2 3.0 3.4 (n = 6, linear interpolation at q * (n - 1)).
    assert (f["requests"], f["requests_ok"], f["requests_error"], f["requests_timeout"]) == (7, 6, 1, 0)
    assert f["ttft_mean_s"] == pytest.approx(12.8 / 6)
    assert f["ttft_p50_s"] == pytest.approx(2.1)  # position 2.5: (2.0 + 2.2) / 2
    assert f["ttft_p90_s"] == pytest.approx(3.2)  # position 4.5: 3.0 + 0.5 * 0.4
    assert f["ttft_p95_s"] == pytest.approx(3.3)  # position 4.75
    assert f["ttft_p99_s"] == pytest.approx(3.38)  # position 4.95
    assert f["tpot_mean_s"] == pytest.approx(0.05)


def test_throughput_over_the_run_wall_time() -> None:
    f = request_figures(REQUESTS)
    # First start 100, last end 107 + 2 = 109: 9 s. ok prompt tokens 1200, ok output 60, 6 ok requests.
    assert f["run_s"] == pytest.approx(9.0)
    assert f["input_tokens_per_s"] == pytest.approx(1200 / 9)
    assert f["output_tokens_per_s"] == pytest.approx(60 / 9)
    assert f["requests_per_s"] == pytest.approx(6 / 9)


def test_ttft_degradation_rounds_2_plus_vs_round_1() -> None:
    f = request_figures(REQUESTS)
    # Round 1: 1.0, 1.2 -> median 1.1, p95 1.0 + 0.95 * 0.2 = 1.19.
    # Rounds >= 2: 2.0 2.2 3.0 3.4 -> median 2.6, p95 at position 2.85: 3.0 + 0.85 * 0.4 = 3.34.
    assert f["ttft_degradation_p50_pct"] == pytest.approx(100 * (2.6 - 1.1) / 1.1)
    assert f["ttft_degradation_p95_pct"] == pytest.approx(100 * (3.34 - 1.19) / 1.19)


def test_later_round_tpot_p95_for_the_slo() -> None:
    # Rounds >= 2 of ok requests: TPOTs 0.05, 0.05, 0.05, 0.07 (b's round 3 is slower): position 2.85
    # of the sorted four, 0.05 + 0.85 x 0.02 = 0.067; round 1 and the failed request do not count.
    slow = REQUESTS.copy()
    slow.loc[5, "tpot_s"] = 0.07
    slow.loc[0, "tpot_s"] = 0.5
    assert request_figures(slow)["tpot_later_p95_s"] == pytest.approx(0.067)


def test_per_round_curve() -> None:
    curve = ttft_by_round(REQUESTS).set_index("round")
    assert curve["requests"].tolist() == [2, 2, 2]
    assert curve.loc[2, "ttft_p50_s"] == pytest.approx(2.1)
    assert curve.loc[3, "ttft_mean_s"] == pytest.approx(3.2)
    assert curve.loc[2, "p50_change_vs_round1_pct"] == pytest.approx(100 * (2.1 / 1.1 - 1))


def test_ttft_cdf_steps() -> None:
    cdf = ttft_cdf(REQUESTS)
    assert cdf["ttft_s"].tolist() == [1.0, 1.2, 2.0, 2.2, 3.0, 3.4]
    assert cdf["fraction"].tolist() == pytest.approx([1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0])


def test_empty_cell_gives_none_not_zero() -> None:
    f = request_figures(REQUESTS.iloc[0:0])
    assert f["requests"] == 0 and f["ttft_p50_s"] is None and f["requests_per_s"] is None
    assert f["ttft_degradation_p50_pct"] is None


def test_reuse_from_records_same_user_history() -> None:
    # a and b: 0 + min(100, 200) + min(200, 300) = 300 reusable each; c: 0. Total prompt tokens 1250.
    assert reuse_from_records(REQUESTS) == pytest.approx(600 / 1250)


def test_prefix_reuse_from_token_ids() -> None:
    prompts = [[1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [9, 9], [1, 2, 3, 7]]
    # Token blocks: prompt 2 reuses 4, prompt 3 none, prompt 4 reuses [1, 2, 3]: 7 of 16.
    assert prefix_reuse(prompts, block_size=1) == pytest.approx(7 / 16)
    # Blocks of 2: prompt 4 matches [1, 2] but not [3, 7]: 6 of 16.
    assert prefix_reuse(prompts, block_size=2) == pytest.approx(6 / 16)
    assert prefix_reuse([]) is None
    with pytest.raises(ValueError, match="block_size"):
        prefix_reuse(prompts, block_size=0)


def test_cached_token_share_counts_only_requests_that_report_it() -> None:
    assert request_figures(REQUESTS)["cached_token_share"] is None  # no cached_tokens column at all
    with_cached = REQUESTS.assign(cached_tokens=[0, 100, 150, None, 100, 200, 0])
    # ok rows reporting cached_tokens: a1 (0/100), a2 (100/200), a3 (150/300), b2 (100/200), b3 (200/300).
    assert request_figures(with_cached)["cached_token_share"] == pytest.approx(550 / 1100)


def test_late_and_read_stamped_requests_are_counted_among_ok_ones() -> None:
    frame = REQUESTS.assign(
        late_s=[None, 0.21, None, None, 0.3, None, 0.5],  # the last is an error: not counted
        ttft_clock=["kernel", "kernel", "read", "kernel", "kernel", "read", "read"],
    )
    f = request_figures(frame)
    assert (f["requests_late"], f["requests_read_stamped"]) == (2, 2)
    # Records from before these fields count as neither.
    old = request_figures(REQUESTS)
    assert (old["requests_late"], old["requests_read_stamped"]) == (0, 0)


def test_tokens_per_second_is_null_when_a_request_has_no_usage() -> None:
    # One ok request without usage (a server that does not send it): summing the others as if it had
    # 0 tokens would print a throughput too low; the figure is null and a note says why.
    no_usage = REQUESTS.copy()
    no_usage.loc[0, "prompt_tokens"] = None
    with collect_notes() as notes:
        f = request_figures(no_usage)
    assert f["input_tokens_per_s"] is None
    assert f["output_tokens_per_s"] == pytest.approx(60 / 9)  # completion tokens are all there
    assert [n.kind for n in notes] == ["usage_missing"] and "1 of 6" in notes[0].message
