"""Verdicts and their noise (issue 43, defect 9): one repeat flagged, a verdict within noise with the
repeats that would separate it, host CPU that differed widely between a group's cells."""

from __future__ import annotations

import json
from statistics import NormalDist
from typing import Any

import pandas as pd
import pytest

from kvoffload.analysis.compare import tier_comparison, warnings_table
from kvoffload.analysis.findings import findings
from kvoffload.analysis.noise import (
    SEPARATE_POWER,
    WIDE_CPU_SPREAD_PCT,
    repeats_to_separate,
    within_noise,
)
from tests.unit.analysis.test_analysis_findings import _requests, _row


def _findings(
    rows: list[dict[str, Any]], requests: dict[str, pd.DataFrame], min_sessions: int = 1
) -> dict[str, Any]:
    """Findings by tier, with the session floor at 1 so that two sessions give a hand-worked interval."""
    summary = pd.DataFrame(rows)
    out = findings(tier_comparison(summary), warnings_table(summary), requests, min_sessions=min_sessions)
    return {f.tier: f for f in out}


def test_the_repeats_that_would_separate_a_change() -> None:
    """n the smallest integer > n0 x k x (w / |e|)^2, k = ((z(0.975) + z(0.80)) / z(0.975))^2
    = (2.80159 / 1.95996)^2 = 2.04320 (80 % power at two-sided alpha 0.05), w the half-width towards 0;
    null rules. The old count, ceil(n0 x (w / |e|)^2), was the 50 % power one, and at an exact square it
    stopped where the interval would only touch 0."""
    # issue 53's example: w = 40, e = -20 from one repeat: 1 x 2.0432 x 4 = 8.17 -> 9 (old: 4, whose
    # interval, narrowed by sqrt(4) to a half-width of 20, still touches 0)
    assert repeats_to_separate(-20.0, [-60.0, 20.0], 1) == 9
    assert repeats_to_separate(-20.0, [-60.0, 20.0], 2) == 17  # 16.35 -> 17 (old: 8)
    assert repeats_to_separate(10.0, [-1.0, 30.0], 1) == 3  # w = 11: 2.0432 x 1.21 = 2.47 -> 3 (old: 2)
    # on the bound (w = |e|) the least a change within noise can need: 3 x 2.0432 = 6.13 -> 7, more than
    # 2 n0 (the old count's floor n0 + 1 = 4 bound here; within noise it can no longer bind)
    assert repeats_to_separate(-20.0, [-30.0, 0.0], 3) == 7
    assert repeats_to_separate(20.0, [0.0, 50.0], 1) == 3  # a rise on the bound: 2.04 -> 3
    assert repeats_to_separate(-20.0, [-30.0, -10.0], 1) is None  # already separated
    assert repeats_to_separate(0.0, [-10.0, 10.0], 1) is None  # no count separates a change of 0
    assert repeats_to_separate(-20.0, None, 1) is None  # no interval
    assert within_noise([-1.0, 0.0]) is True and within_noise([-2.0, -1.0]) is False
    assert within_noise(None) is None


def test_the_count_is_strictly_above_an_exact_bound() -> None:
    """Where n0 x k x (w / |e|)^2 is an integer the count is one more: at that n the change would stand
    only z(0.975) + z(power) standard errors from 0, not beyond. At 50 % power (z(0.50) = 0, k = 1)
    w = 2|e| from one repeat is the exact square 4, and 4 repeats narrow w to 40 / sqrt(4) = 20 = |e|:
    the interval ends on 0, still within noise (bounds included), so the count is 5 (the old ceil gave
    4). k itself, from the exact quantiles, is checked."""
    assert repeats_to_separate(-20.0, [-60.0, 20.0], 1, power=0.5) == 5
    assert repeats_to_separate(-20.0, [-60.0, 20.0], 2, power=0.5) == 9  # 2 x 4 = 8, then one more
    assert repeats_to_separate(-20.0, [-40.0, 0.0], 1, power=0.5) == 2  # 1 x 1 = 1 -> 2
    z = NormalDist().inv_cdf
    assert ((z(0.975) + z(SEPARATE_POWER)) / z(0.975)) ** 2 == pytest.approx(2.0432029, abs=1e-7)


def test_a_comparison_on_one_repeat_is_flagged_and_two_repeats_are_not() -> None:
    """gpu 1.0 s both sessions, cpu 0.4 and 0.6 s: -50 % (CI -60 to -40), outside its noise, but on one
    repeat per cell the run-to-run noise is unknown; with two repeats pooled it is resampled."""
    f = _findings(
        [_row("g", "gpu"), _row("c", "cpu")],
        {"g": _requests({"a": 1.0, "b": 1.0}), "c": _requests({"a": 0.4, "b": 0.6})},
    )["cpu"]
    assert f.one_repeat is True and f.gpu_repeats == 1 and f.p50_verdict == "faster"
    assert f.p50_within_noise is False and f.repeats_to_separate is None
    assert (
        "(p95: cuts it by 41 % (95 % CI 40-60 %)); one repeat per cell: the interval holds this run's "
        "sessions, not the run-to-run noise (host load, cache state), which this campaign cannot judge; "
        "set `repeats` to 2 or more to measure it; offload was exercised"
    ) in f.statement
    assert "within noise" not in f.statement
    # below the session floor there is no interval, and the caveat says the noise is not measured
    bare = _findings(
        [_row("g", "gpu"), _row("c", "cpu")],
        {"g": _requests({"a": 1.0, "b": 1.0}), "c": _requests({"a": 0.4, "b": 0.6})},
        min_sessions=10,
    )["cpu"]
    assert bare.one_repeat is True and bare.p50_within_noise is None and bare.repeats_to_separate is None
    assert (
        "one repeat per cell: the run-to-run noise (host load, cache state) is not measured, and this "
        "campaign cannot judge it; set `repeats` to 2 or more"
    ) in bare.statement
    req = {"g": _requests({"a": 1.0, "b": 1.0}), "c": _requests({"a": 0.4, "b": 0.6})}
    two = _findings(
        [_row("g0", "gpu", 0), _row("c0", "cpu", 0), _row("g1", "gpu", 1), _row("c1", "cpu", 1)],
        {"g0": req["g"], "g1": req["g"], "c0": req["c"], "c1": req["c"]},
    )["cpu"]
    assert two.one_repeat is False and two.repeats == 2 and "one repeat" not in two.statement
    assert {"one_repeat", "p50_within_noise", "repeats_to_separate", "cpu_spread"} <= set(two.as_dict())


def test_a_verdict_within_noise_says_so_and_how_many_repeats_would_separate_it() -> None:
    """cpu sessions 0.4 and 1.2 s against gpu 1.0 s: p50 0.8 s, -20 %. Resampling two sessions gives
    0.4 (1/4), 0.8 (1/2) or 1.2 s (1/4): -60, -20, +20 %, so the 95 % CI is -60 to +20 %, which includes
    0. Towards 0 the half-width is 40: at 80 % power n > 1 x 2.0432 x (40 / 20)^2 = 8.17, 9 repeats per
    cell (the old 50 % count was 4). Two repeats of the same cells give the same interval (each of the 4
    sessions drawn is 0.4 s with probability 1/2: the p50 is 0.4 s with probability 5/16, 1.2 s with
    5/16), so n > 2 x 8.17 = 16.35: 17."""
    req = {"g": _requests({"a": 1.0, "b": 1.0}), "c": _requests({"a": 0.4, "b": 1.2})}
    f = _findings([_row("g", "gpu"), _row("c", "cpu")], req)["cpu"]
    assert f.p50_change_vs_gpu_pct == pytest.approx(-20.0)
    assert f.p50_change_ci_pct == [pytest.approx(-60.0), pytest.approx(20.0)]
    assert f.p50_verdict == "indistinguishable" and f.p50_within_noise is True
    assert f.repeats_to_separate == 9
    assert "does not change later-round p50 TTFT measurably: -20 % (95 % CI -60 to +20 %)" in f.statement
    assert (
        "within noise: about 9 repeats per cell (campaign `repeats: 9`, now 1) would separate it with 80 % "
        "power if the change holds; one repeat per cell: the interval holds this run's sessions, not the "
        "run-to-run noise (host load, cache state), which this campaign cannot judge, so that count is a "
        "lower bound"
    ) in f.statement
    two = _findings(
        [_row("g0", "gpu", 0), _row("c0", "cpu", 0), _row("g1", "gpu", 1), _row("c1", "cpu", 1)],
        {"g0": req["g"], "g1": req["g"], "c0": req["c"], "c1": req["c"]},
    )["cpu"]
    assert two.p50_change_ci_pct == [pytest.approx(-60.0), pytest.approx(20.0)]
    assert two.repeats_to_separate == 17
    assert "about 17 repeats per cell (campaign `repeats: 17`, now 2)" in two.statement
    assert "lower bound" not in two.statement


def _cpu(client: float, node: float) -> dict[str, Any]:
    return {
        "client": "client1",
        "node": "node1",
        "cpu_util_pct_by_host": json.dumps({"client1": client, "node1": node}),
    }


def test_client_cpu_spanning_27_to_91_percent_between_a_groups_cells_warns() -> None:
    """The issue's group: the client host at 91 % in the gpu cell and 27 % in the cpu cell, 64 points,
    above the 25-point threshold; the node at 60 and 50 %, 10 points, below it."""
    assert WIDE_CPU_SPREAD_PCT == 25.0
    rows = [_row("g", "gpu", **_cpu(91.0, 60.0)), _row("c", "cpu", **_cpu(27.0, 50.0))]
    w = warnings_table(pd.DataFrame(rows))
    wide = w[w["kind"] == "cpu_differs"]
    assert list(wide["group"]) == ["m c=8 rounds=10 isl=32768 osl=recorded on node1"]  # no repeat=
    message = (
        "the client host's CPU utilization ranged 27-91 % between this group's cells (c 27 %, g 91 %; "
        "25 points or more is wide): a TTFT difference between them may be the host's load, not the tier's"
    )
    assert list(wide["message"]) == [message]
    f = _findings(rows, {"g": _requests({"a": 1.0, "b": 1.0}), "c": _requests({"a": 0.4, "b": 0.6})})
    assert f"warning: {message}" in f["cpu"].statement
    assert message in f["cpu"].caveats and message in f["gpu"].caveats
    spread = {s["role"]: s for s in f["cpu"].cpu_spread}
    assert spread["client"]["spread_pct"] == pytest.approx(64.0) and spread["client"]["wide"] is True
    assert spread["node"]["spread_pct"] == pytest.approx(10.0) and spread["node"]["wide"] is False
    # 24 points apart is not wide; 25 is
    near = [_row("g", "gpu", **_cpu(50.0, 60.0)), _row("c", "cpu", **_cpu(74.0, 85.0))]
    kinds = warnings_table(pd.DataFrame(near))
    assert list(kinds.loc[kinds["kind"] == "cpu_differs", "message"].str[:12]) == ["the node hos"]
