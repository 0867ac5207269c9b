"""Sessions at a latency target, goodput, cost and energy per tier, worked out by hand on tiny cells."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from kvoffload.analysis import costing, crossing, steady
from kvoffload.analysis.capacity import GIB
from kvoffload.analysis.decision import csv_rows, decide
from kvoffload.config.slo import Prices, Slo

SLO = Slo(ttft_p95_s=0.5)


def _cell(later: dict[str, list[float]], seconds: float = 10.0, **extra: Any) -> pd.DataFrame:
    """Request records of sessions that run at once: per user one round-1 request (TTFT 9 s, never
    judged) and the later rounds' TTFTs given, back to back over 0..`seconds` (every user starts at 0
    and ends at `seconds`, so the steady window is the whole run); 100 prompt and 10 completion tokens,
    50 cached."""
    rows = []
    for user, ttfts in later.items():
        rounds = [9.0, *ttfts]
        step = seconds / len(rounds)
        for k, ttft in enumerate(rounds, start=1):
            rows.append(
                {
                    "user_id": user,
                    "round": k,
                    "status": "ok",
                    "ttft_s": ttft,
                    "tpot_s": 0.01,
                    "prompt_tokens": 100,
                    "completion_tokens": 10,
                    "cached_tokens": 50,
                    "t_start": (k - 1) * step,
                    "latency_s": step,
                    **extra,
                }
            )
    return pd.DataFrame(rows)


def _filled(rows: list[dict[str, Any]], cells: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Each cell padded to its level with users of one round-1 request over its whole run (they hold
    the level, and have no later round to judge): the sessions live at once are then the level."""
    out = dict(cells)
    for row in rows:
        req = cells.get(row["cell_id"])
        if req is None or req.empty:
            continue
        short = min(row["concurrency"], row["achieved_sessions"]) - req["user_id"].nunique()
        end = float((req["t_start"] + req["latency_s"]).max())
        pad = [
            {**req.iloc[0].to_dict(), "user_id": f"fill{i}", "round": 1, "ttft_s": 9.0, "t_start": 0.0,
             "latency_s": end}
            for i in range(max(0, short))
        ]  # fmt: skip
        out[row["cell_id"]] = pd.concat([req, pd.DataFrame(pad)], ignore_index=True) if pad else req
    return out


def _twice(
    rows: list[dict[str, Any]], cells: dict[str, pd.DataFrame]
) -> tuple[list[dict[str, Any]], dict[str, pd.DataFrame]]:
    """Every cell run twice (repeat 2 under its id + "r2", the same records): two runs per level."""
    again = [{**r, "cell_id": r["cell_id"] + "r2", "repeat": 2} for r in rows]
    return rows + again, cells | {k + "r2": v for k, v in cells.items()}


def _row(cell_id: str, tier: str, concurrency: int, users: int = 20, **extra: Any) -> dict[str, Any]:
    """A clean summary row of one done cell of the sweep (m, 5 rounds, isl 1000, osl 32)."""
    return {
        "cell_id": cell_id,
        "tier": tier,
        "model": "m",
        "concurrency": concurrency,
        "num_rounds": 5,
        "isl": 1000,
        "osl": "32",
        "repeat": 1,
        "status": "done",
        "done": True,
        "valid": True,
        "achieved_sessions": users,
        "sessions_complete": users,
        "sessions_error": 0,
        "sessions_incomplete": 0,
        "virtual_users_available": users,
        "sessions_dropped_by_isl": 0,
        "failed_requests": 0,
        "replicas_configured": 1,
        "vllm_tensor_parallel_size": 1,
        **extra,
    }


def _same(n: int, ttft: float) -> dict[str, list[float]]:
    """n sessions whose later rounds all take `ttft`: every resample gives the same percentiles."""
    return {f"u{i}": [ttft, ttft] for i in range(n)}


def _decide(
    rows: list[dict[str, Any]], cells: dict[str, pd.DataFrame], slo: Slo = SLO, **kw: Any
) -> dict[str, Any]:
    (sweep,) = decide(
        pd.DataFrame(rows),
        _filled(rows, cells),
        slo,
        replicates=2000,
        min_sessions=1,
        min_window_requests=1,
        **kw,
    )
    return {d.tier: d for d in sweep.tiers} | {"sweep": sweep}


def test_the_crossing_is_the_linear_interpolation_between_the_levels_around_it() -> None:
    # gpu: p95 0.3 s with 2 sessions at once, 0.7 s with 4; the 0.5 s target is crossed at
    # 2 + (0.5 - 0.3) / (0.7 - 0.3) x (4 - 2) = 3.0 sessions. Identical sessions: a zero-width interval.
    got = _decide(
        [_row("g2", "gpu", 2), _row("g4", "gpu", 4)], {"g2": _cell(_same(3, 0.3)), "g4": _cell(_same(3, 0.7))}
    )["gpu"]
    assert got.status == "crossing"
    assert (got.last_meeting, got.first_missing) == (2, 4)
    assert got.sessions == pytest.approx(3.0)
    assert got.sessions_ci == [pytest.approx(3.0), pytest.approx(3.0)]
    assert got.sessions_ci_censored == [False, False]
    assert got.binding_limit == "p95 TTFT"
    assert got.sessions_text == "3 [3-3] (one run)"


def test_the_crossings_interval_by_hand() -> None:
    """Upper level (4 at once): sessions a (0.6 s) and b (1.0 s): p95 0.98 s, crossing
    2 + 0.2 / 0.68 x 2 = 2.588. Resamples: {a,a} p95 0.6 -> 3.333 (1/4), {a,b} -> 2.588 (1/2),
    {b,b} p95 1.0 -> 2 + 0.2 / 0.7 x 2 = 2.571 (1/4): the 95 % interval spans 2.571 to 3.333."""
    got = _decide(
        [_row("g2", "gpu", 2), _row("g4", "gpu", 4)],
        {"g2": _cell(_same(3, 0.3)), "g4": _cell({"a": [0.6], "b": [1.0]})},
    )["gpu"]
    assert got.sessions == pytest.approx(2 + 0.2 / 0.68 * 2)
    assert got.sessions_ci == [pytest.approx(2 + 0.2 / 0.7 * 2), pytest.approx(2 + 0.2 / 0.3 * 2)]
    assert got.sessions_ci_censored == [False, False]


def test_an_interval_end_beyond_the_bracket_is_a_bound() -> None:
    """Lower level: session a has 20 later requests at 0.3 s, b one at 0.9 s: p95 0.3 s (the 20th of 21
    values), so the level meets 0.5 s and the crossing is 3.0 as above. A quarter of the resamples
    draw {b,b} (p95 0.9 s): the lower level misses too, the crossing lies below 2, and the interval's
    lower end is "below 2", not a number."""
    got = _decide(
        [_row("g2", "gpu", 2), _row("g4", "gpu", 4)],
        {"g2": _cell({"a": [0.3] * 20, "b": [0.9]}), "g4": _cell(_same(3, 0.7))},
    )["gpu"]
    assert got.sessions == pytest.approx(3.0)
    assert got.sessions_ci == [pytest.approx(2.0), pytest.approx(3.0)]
    assert got.sessions_ci_censored == [True, False]
    assert got.sessions_text == "3 [<2-3] (one run)"


def test_too_few_sessions_give_no_interval() -> None:
    rows = [_row("g2", "gpu", 2), _row("g4", "gpu", 4)]
    cells = _filled(rows, {"g2": _cell(_same(3, 0.3)), "g4": _cell(_same(3, 0.7))})
    (sweep,) = decide(pd.DataFrame(rows), cells, SLO, replicates=200, min_window_requests=1)
    (gpu,) = sweep.tiers
    assert gpu.sessions == pytest.approx(3.0) and gpu.sessions_ci is None
    assert gpu.sessions_text == "3 (no interval; one run)"
    assert "gpu: too few sessions for an interval: 3 and 3 at the two levels, at least 10 each" in (
        sweep.conditions
    )


def test_a_tier_that_never_misses_is_censored_at_what_the_dataset_can_replay() -> None:
    # 4 users to replay: concurrency 8 runs 4 sessions at once, the most this dataset can replay.
    cells = {"c2": _cell(_same(3, 0.1)), "c8": _cell(_same(3, 0.2))}
    got = _decide([_row("c2", "cpu", 2, users=4), _row("c8", "cpu", 8, users=4)], cells)["cpu"]
    assert got.status == "at_least"
    assert (got.sessions, got.sessions_bound, got.sessions_ci) == (4.0, ">=", None)
    assert [lv.sessions_at_once for lv in got.levels] == [2, 4]
    assert got.sessions_text == (
        ">= 4 (the users cap it: 4 replayed, all the dataset offers; holding a level for a session takes "
        "about twice its users; one run)"
    )
    assert got.goodput is not None and got.goodput.bound == ">=" and got.goodput.sessions_at_once == 4
    # with users to spare, the bound is only the highest level measured
    more = _decide([_row("c2", "cpu", 2), _row("c8", "cpu", 8)], cells)["cpu"]
    assert more.sessions_text == ">= 8 (the highest level the campaign asked for; one run)"


def test_a_tier_that_always_misses_is_fewer_than_its_smallest_level() -> None:
    cells = {"n2": _cell(_same(3, 0.8)), "n4": _cell(_same(3, 0.9))}
    got = _decide([_row("n2", "nvme", 2), _row("n4", "nvme", 4)], cells)["nvme"]
    assert got.status == "fewer_than"
    assert (got.sessions, got.sessions_bound) == (2.0, "<")
    assert got.sessions_text == "< 2 (missed at every level; one run)"
    assert got.goodput is None and got.cost.per_million_tokens is None


def test_another_limit_can_bind_and_is_named() -> None:
    # hit rate 80 % at 2, 40 % at 4 against a floor of 60 %: 2 + (0.8 - 0.6) / (0.8 - 0.4) x 2 = 3.0,
    # while p95 TTFT (0.3 s and 0.4 s) meets 0.5 s at both levels.
    cells = {"g2": _cell(_same(3, 0.3), cached_tokens=80), "g4": _cell(_same(3, 0.4), cached_tokens=40)}
    slo = Slo(ttft_p95_s=0.5, min_later_hit_rate=0.6)
    got = _decide([_row("g2", "gpu", 2), _row("g4", "gpu", 4)], cells, slo)["gpu"]
    assert got.sessions == pytest.approx(3.0)
    assert got.binding_limit == "hit rate"
    assert got.levels[1].missed == ["hit rate 40 % < 60 %"]


def test_an_invalid_cell_is_left_out_with_its_reason() -> None:
    # the level that missed had a failed request: without it gpu never missed
    cells = {"g2": _cell(_same(3, 0.3)), "g4": _cell(_same(3, 0.7))}
    got = _decide([_row("g2", "gpu", 2), _row("g4", "gpu", 4, failed_requests=1)], cells)["gpu"]
    assert got.status == "at_least" and got.sessions == 2.0
    assert got.excluded == ["gpu g4 did not run clean (1 failed request(s))"]


def test_offload_against_gpu_gives_a_bounded_ratio_and_a_sentence() -> None:
    cells = {
        "g2": _cell(_same(3, 0.3)),
        "g4": _cell(_same(3, 0.7)),
        "c2": _cell(_same(3, 0.1)),
        "c4": _cell(_same(3, 0.2)),
    }
    rows = [_row("g2", "gpu", 2, users=4), _row("g4", "gpu", 4, users=4)]
    rows += [
        _row("c2", "cpu", 2, users=4, lmcache_l1_size_gb=10.0),
        _row("c4", "cpu", 4, users=4, lmcache_l1_size_gb=10.0),
    ]
    got = _decide(rows, cells)
    cpu, sweep = got["cpu"], got["sweep"]
    # cpu never missed up to 4 (the dataset's most), gpu crossed at 3.0: at least 4 / 3 = 1.33x
    assert cpu.ratio_vs_gpu == pytest.approx(4 / 3) and cpu.ratio_bound == ">="
    assert cpu.extra_sessions_vs_gpu == pytest.approx(1.0) and cpu.extra_bound == "<="
    # 10 GiB of L1 against none on gpu, over at least one extra session: at most 10.74 GB each
    assert cpu.dram_gb_per_extra_session == pytest.approx(10 * GIB / 1e9)
    # one run per level: the run-to-run noise is not measured, so no pick
    assert sweep.pick is None and sweep.no_pick is not None and "one run" in sweep.no_pick
    assert cpu.verdict == "more sessions than gpu; one run: no pick from it"
    assert got["gpu"].verdict == "baseline; one run: no pick from it"
    assert sweep.statements == [
        "cpu sustains at least 1.3x gpu's sessions at p95 TTFT <= 0.5 s (cpu never missed it up to 4 "
        "sessions; gpu's crossing at its interval's upper end) [one run: run-to-run noise not measured]; "
        "not priced: set prices.node_hour or prices.gpu_hour (campaign prices, or the inventory's "
        "kvoffload_prices)"
    ]
    assert sweep.missing_prices == ["prices.dram_gb_month", "prices.node_hour or prices.gpu_hour"]
    table = csv_rows([sweep])
    assert list(table["tier"]) == ["gpu", "cpu"]
    assert table.loc[1, "sessions_bound"] == ">=" and table.loc[0, "sessions"] == pytest.approx(3.0)
    assert table.loc[1, "runs"] == 1 and "one run" in table.loc[1, "no_pick"]
    assert table.loc[1, "capped_by"].startswith("the users cap it: 4 replayed")
    # two runs of every level: the same figures, and now a pick
    twice = _decide(*_twice(rows, cells))
    assert twice["sweep"].pick == "cpu" and twice["sweep"].no_pick is None
    assert twice["cpu"].verdict == "pick: more sessions than gpu"
    assert twice["cpu"].runs == 2 and twice["sweep"].runs == 2


def test_a_level_whose_load_was_not_held_is_named_and_never_a_crossings_end() -> None:
    """Issue 53: a level is judged where its load was held. At 4 the four users start together and end
    at 2.5, 5, 7.5 and 10 s: 4 live only until 2.5 s, shorter than the median session (6.25 s). Its
    p95 (0.7 s) would have missed 0.5 s; instead the level is not judged, and gpu is at least 2,
    capped by that level."""
    staggered = pd.concat(
        [_cell({f"u{i}": [0.7, 0.7]}, seconds=2.5 * (i + 1)).assign(user_id=f"u{i}") for i in range(4)],
        ignore_index=True,
    )
    got = _decide([_row("g2", "gpu", 2), _row("g4", "gpu", 4)], {"g2": _cell(_same(3, 0.3)), "g4": staggered})
    gpu = got["gpu"]
    four = gpu.levels[1]
    assert four.meets is None and four.cells == [] and four.runs == 0
    assert four.not_held == ["cell g4: held 2.5 s, shorter than the median session (6.25 s)"]
    assert gpu.status == "at_least" and gpu.sessions == 2.0
    assert (
        gpu.capped_by == "level 4 was not held: cell g4: held 2.5 s, shorter than the median session (6.25 s)"
    )
    assert gpu.levels[0].held_sessions == pytest.approx(3.0) and gpu.levels[0].window_s == pytest.approx(10.0)


def test_the_ratio_interval_pairs_the_tiers_replicates() -> None:
    # Replicates: cpu crosses at 6 in every draw, gpu at 2 or 3: ratios 3 and 2. A gpu draw above its
    # bracket (+inf) pushes the ratio down: the lower end is open once that is beyond the tail.
    # Ratios {2, 2, 2, 3}: numpy's 2.5th percentile is 2, its 97.5th 2 + 0.925 x (3 - 2) = 2.925.
    t = np.full(4, 6.0)
    assert crossing.ratio_interval(crossing.ratio_draws(t, np.array([3.0, 3.0, 3.0, 2.0]))) == [
        pytest.approx(2.0),
        pytest.approx(2.925),
    ]
    assert crossing.ratio_interval(crossing.ratio_draws(t, np.array([2.0, 3.0, 3.0, np.inf])))[0] is None


def test_goodput_counts_only_requests_that_met_the_target_themselves() -> None:
    """Four requests in a steady window of 4 s: TTFTs 0.2, 0.6, 0.4 and 0.5 s against 0.5 s: three
    count (0.5 s meets it), 0.75 requests/s; their tokens (110 + 320 + 120) / 4 s = 137.5 per s, completion
    (10 + 20 + 20) / 4 = 12.5; two GPUs (2 replicas x TP 1): 68.75 tokens/s per GPU."""
    req = pd.DataFrame(
        {
            "user_id": ["a", "a", "b", "b"],
            "round": [1, 2, 1, 2],
            "status": ["ok"] * 4,
            "ttft_s": [0.2, 0.6, 0.4, 0.5],
            "tpot_s": [0.01] * 4,
            "prompt_tokens": [100, 200, 300, 100],
            "completion_tokens": [10, 10, 20, 20],
            "t_start": [0.0, 1.0, 2.0, 2.5],
            "latency_s": [1.0, 1.0, 2.0, 1.0],
        }
    )
    level = crossing.Level(2, [2], ["x"], 2, 0.5, 0.4, 0.01, None, True)
    rows = pd.DataFrame([_row("x", "cpu", 2, replicas_configured=2, gpu_power_w=1000.0)])
    held = {"x": steady.Held(steady.Window(2, 0.0, 4.0, 2.0, 2.0, 2, True, None), req)}
    good, energy, power = costing.goodput(level, rows, held, SLO, "=")
    assert (good.requests_ok, good.requests_good) == (4, 3)
    assert good.requests_per_s == pytest.approx(0.75)
    assert good.tokens_per_s == pytest.approx(137.5)
    assert good.completion_tokens_per_s == pytest.approx(12.5)
    assert good.gpus == 2 and good.tokens_per_s_per_gpu == pytest.approx(68.75)
    # 1000 W for 4 s = 4000 J = 1/900 kWh over 550 goodput tokens: 2.0202 kWh per million tokens
    assert energy == pytest.approx(4000 / 3.6e6 / 550 * 1e6)
    assert power == 1000.0
    # a TPOT limit of 15 ms drops the request whose TPOT is 20 ms
    slow = req.assign(tpot_s=[0.01, 0.01, 0.02, 0.01])
    tight = Slo(ttft_p95_s=0.5, tpot_p95_s=0.015)
    slow_held = {"x": steady.Held(held["x"].window, slow)}
    assert costing.goodput(level, rows, slow_held, tight, "=")[0].requests_good == 2


def test_cost_adds_each_price_the_tier_uses() -> None:
    """cpu on a node of 2 GPUs with a 100 GiB L1 pool and 1 kW of GPU power, 137.5 goodput tokens/s:
    node 10 + GPUs 2 x 2 + DRAM 0.73 x 107.374 GB / 730 h + energy 0.5 x 1 kW = 14.6074 per hour;
    per million tokens 14.6074 / (137.5 x 3600) x 10^6 = 29.510; completion alone (12.5/s): 324.6."""
    res = costing.Resources(gpus=2, dram_gb=100 * GIB / 1e9, nvme_tb=0.0)
    prices = Prices(node_hour=10.0, gpu_hour=2.0, dram_gb_month=0.73, nvme_tb_month=73.0, kwh=0.5)
    good = costing.Goodput(2, ["x"], 4, 3, 0.75, 137.5, 12.5, 2, 68.75, 0.375)
    got = costing.cost("cpu", res, prices, good, 2.0, 1000.0)
    per_hour = 10 + 4 + 0.73 * 107.3741824 / 730 + 0.5
    assert got.per_hour == pytest.approx(per_hour)
    assert got.parts == {
        "node": 10.0,
        "gpu": 4.0,
        "dram": pytest.approx(0.1073741824),
        "energy": pytest.approx(0.5),
    }
    assert got.per_million_tokens == pytest.approx(per_hour / (137.5 * 3600) * 1e6)
    assert got.per_million_tokens == pytest.approx(29.510, abs=1e-3)
    assert got.per_million_completion_tokens == pytest.approx(per_hour / (12.5 * 3600) * 1e6)
    # gpu uses no DRAM or NVMe: neither price counts there
    gpu = costing.cost("gpu", costing.Resources(2, 0.0, 0.0), prices, good, 2.0, 1000.0)
    assert gpu.per_hour == pytest.approx(14.5)
    # nvme adds its L2: 2 TB x 73 / 730 = 0.2 per hour
    nvme = costing.cost("nvme", costing.Resources(2, 0.0, 2.0), prices, good, 2.0, 1000.0)
    assert nvme.parts["nvme"] == pytest.approx(0.2)


def test_cost_says_which_prices_would_complete_it() -> None:
    good = costing.Goodput(2, ["x"], 4, 3, 0.75, 137.5, 12.5, 2, 68.75, 0.375)
    res = costing.Resources(2, 10.0, 1.0)
    none = costing.cost("nvme", res, None, good, None, None)
    assert none.per_hour is None
    assert none.missing_prices == ["prices.node_hour or prices.gpu_hour", "prices.dram_gb_month",
                                   "prices.nvme_tb_month"]  # fmt: skip
    # energy measured: a price per kWh would complete it too
    assert costing.cost("gpu", res, None, good, 2.0, 800.0).missing_prices[-1] == "prices.kwh"
    # kWh priced but no GPU telemetry (the simulator): no cost, never one without the energy
    sim = costing.cost("gpu", res, Prices(node_hour=10.0, kwh=0.3), good, None, None)
    assert sim.per_hour is None
    assert sim.notes == ["no cost: the GPU energy (no GPU power telemetry) unknown"]
    # DRAM not priced: the node's price is taken to pay for it, and the cost says so
    cpu = costing.cost("cpu", res, Prices(node_hour=10.0), good, None, None)
    assert cpu.per_hour == 10.0 and "prices.dram_gb_month would price it" in cpu.notes[0]


def test_a_censored_tier_s_cost_is_an_upper_bound_in_the_sentence() -> None:
    """gpu crosses at 3.0 (p95 0.3 s at 2, 0.7 s at 4) and is priced there: at 2 its 6 later requests
    (of 3 users, over a 10 s window) met 0.5 s, 6 x 110 / 10 = 66 goodput tokens/s; at 4 none did (0.7
    s): 0. Halfway, 33 tokens/s. cpu never missed, so it is priced at its highest level, 4: 6 good
    requests in a 5 s window, 132 tokens/s, and at most that cost (it could carry more). Same node
    price: 33 / 132 = 0.25 of gpu's cost, 75 % less, and at least that."""
    cells = {
        "g2": _cell(_same(3, 0.3)),
        "g4": _cell(_same(3, 0.7)),
        "c2": _cell(_same(3, 0.1)),
        "c4": _cell(_same(3, 0.2), seconds=5.0),
    }
    rows = [_row("g2", "gpu", 2, users=4), _row("g4", "gpu", 4, users=4)]
    rows += [_row("c2", "cpu", 2, users=4), _row("c4", "cpu", 4, users=4)]
    got = _decide(rows, cells, prices=Prices(node_hour=10.0))
    assert got["cpu"].cost.bound == "<="
    assert got["cpu"].cost.per_million_tokens == pytest.approx(10.0 / (6 * 110 / 5 * 3600) * 1e6)
    gpu = got["gpu"]
    assert gpu.goodput is not None and gpu.goodput.sessions_at_once == pytest.approx(3.0)
    assert gpu.goodput.tokens_per_s == pytest.approx(33.0)
    assert gpu.cost.per_million_tokens == pytest.approx(10.0 / (33 * 3600) * 1e6)
    assert gpu.cost.per_million_tokens_ci == [pytest.approx(10.0 / (33 * 3600) * 1e6)] * 2
    assert got["cpu"].cost_change_pct == pytest.approx(-75.0) and got["cpu"].cost_change_bound == "<="
    assert got["sweep"].statements[0].endswith("for 1x the node cost: at least 75 % less per million tokens")


def test_two_crossings_give_a_ratio_with_its_joint_interval() -> None:
    """gpu crosses at 2.588 with replicates 3.333 / 2.588 / 2.571 (1/4, 1/2, 1/4; see the interval
    test above); cpu crosses at 4 + (0.5 - 0.3) / (0.7 - 0.3) x 4 = 6 in every replicate. Ratios
    6 / 3.333 = 1.8, 6 / 2.588 = 2.318, 6 / 2.571 = 2.333: the interval spans 1.8 to 2.333."""
    cells = {
        "g2": _cell(_same(3, 0.3)),
        "g4": _cell({"a": [0.6], "b": [1.0]}),
        "c4": _cell(_same(3, 0.3)),
        "c8": _cell(_same(3, 0.7)),
    }
    rows = [_row("g2", "gpu", 2), _row("g4", "gpu", 4), _row("c4", "cpu", 4), _row("c8", "cpu", 8)]
    got = _decide(rows, cells)
    cpu = got["cpu"]
    assert cpu.ratio_vs_gpu == pytest.approx(6 / (2 + 0.2 / 0.68 * 2)) and cpu.ratio_bound == "="
    assert cpu.ratio_ci == [pytest.approx(1.8), pytest.approx(6 / (2 + 0.2 / 0.7 * 2))]
    assert got["sweep"].pick is None  # one run
    assert (
        got["sweep"]
        .statements[0]
        .startswith(
            "cpu sustains 2.3x gpu's sessions at p95 TTFT <= 0.5 s (95 % CI 1.8-2.3x) [one run: run-to-run "
            "noise not measured]; not priced"
        )
    )
