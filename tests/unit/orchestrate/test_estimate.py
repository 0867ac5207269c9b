"""The campaign-time estimate (kvoffload/orchestrate/campaign/estimate.py), every figure worked by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvoffload.orchestrate.campaign.estimate import (
    DEFAULT_CELL_OVERHEAD_S,
    CellWork,
    KneeRamp,
    Measured,
    Priors,
    estimate,
    learn,
    phase_seconds,
    profile_priors,
)

PRIORS = Priors(install_s=200, engine_start_s=40, request_s=2, cell_overhead_s=50, campaign_s=100)


def test_nodes_add_their_cells_and_the_campaign_takes_its_start_and_slowest_node() -> None:
    work = [
        # node a: installs and starts engines, then keeps them (a reset), then restarts for a new tier
        CellWork("a1", "a", replay_s=20, starts_engines=True, installs=True),
        CellWork("a2", "a", replay_s=20, starts_engines=False, installs=False),
        CellWork("a3", "a", replay_s=20, starts_engines=True, installs=False),
        CellWork("b1", "b", replay_s=20, starts_engines=True, installs=True),
    ]
    e = estimate(work, PRIORS)
    # a1: 200 + 40 + 20 + 50 = 310; a2: 0 + 0 + 20 + 50 = 70; a3: 40 + 20 + 50 = 110
    assert e.cells["a1"] == {"install": 200, "engine_start": 40, "replay": 20, "overhead": 50}
    assert sum(e.cells["a2"].values()) == 70 and sum(e.cells["a3"].values()) == 110
    # b1: 200 + 40 + 20 + 50 = 310
    assert e.nodes == {"a": 490, "b": 310}
    assert e.total_s == 100 + 490
    assert e.phases() == {"install": 400, "engine_start": 120, "replay": 80, "overhead": 200}
    assert e.to_json()["priors"]["sources"]["request_s"] == "default"
    assert e.knee is None and e.to_json()["knee_search"] is None
    assert estimate([], PRIORS).total_s == 0.0
    # what earlier cells measured over what the model said of them scales every replay
    scaled = estimate(work[:1], replace(PRIORS, replay_scale=1.5))
    assert scaled.cells["a1"]["replay"] == 30.0


def test_the_knee_search_worst_case_is_its_longest_path_at_these_priors() -> None:
    ramp = KneeRamp(
        "cpu", 5, 1000, "32", "a",
        paths=(((4, 30.0),), ((8, 5.0), (6, 6.0)), ((8, 5.0), (6, 6.0), (7, 5.5))),
    )  # fmt: skip
    knee = estimate([], PRIORS, [ramp, replace(ramp, tier="nvme", paths=((),))]).knee
    assert knee is not None
    # the longest: 40 (engine start) + 3 x 50 (overhead) + 16.5 against 40 + 50 + 30 for (4); the nvme
    # ramp has no step
    assert knee.ramps[0]["concurrency"] == [8, 6, 7] and knee.ramps[0]["seconds"] == 206.5
    assert knee.ramps[1]["cells"] == 0 and knee.ramps[1]["seconds"] == 0.0
    assert (knee.cells, knee.total_s) == (3, 206.5)
    # without a cell's overhead the one long step is the worst: 40 + 30 against 40 + 16.5
    cheap = estimate([], replace(PRIORS, cell_overhead_s=0.0), [ramp]).knee
    assert cheap is not None and cheap.to_json()["ramps"][0]["concurrency"] == [4] and cheap.total_s == 70.0


def test_profile_priors_are_a_cold_prefill_plus_the_decode() -> None:
    p = profile_priors("tiny", startup_s=12.0, cold_prefill_s=0.25, decode_step_s=0.002, osl_tokens=100)
    # 10 s of the simulator's own start plus the profile's 12; 0.25 + 100 * 0.002 = 0.45 s a request
    assert p.engine_start_s == 22.0 and p.request_s == pytest.approx(0.45)
    assert p.cell_overhead_s == DEFAULT_CELL_OVERHEAD_S
    assert p.sources["request_s"] == "profile tiny" and p.sources["install_s"] == "default"


def test_phase_seconds_group_a_cells_timings() -> None:
    timings = {"install": 100.0, "deploy": 30.0, "cold-check": 1.0, "wait-client": 40.0, "replay": 60.0,
               "collect": 5.0, "teardown": 4.0, "total": 240.0}  # fmt: skip
    # overhead: cold-check + collect + teardown; the client's install is the run's, not the cell's
    assert phase_seconds(timings) == {"install": 100, "engine_start": 30, "replay": 60, "overhead": 10}
    # the replay's own 15 s: the replay playbook's other 45 s are overhead
    assert phase_seconds(timings, 15.0) == {"install": 100, "engine_start": 30, "replay": 15, "overhead": 55}


def test_learning_from_earlier_cells_replaces_only_what_they_measured() -> None:
    measured = [
        Measured(
            {"install": 300.0, "deploy": 20.0, "replay": 30.0, "collect": 6.0, "total": 356.0},
            60,
            4,
            modelled_s=20.0,
        ),
        # the replay's own 25 s of its 50 s phase
        Measured(
            {"reset": 2.0, "replay": 50.0, "collect": 8.0, "total": 60.0},
            100,
            8,
            replay_own_s=25.0,
            modelled_s=30.0,
        ),
    ]
    learned = learn(measured, PRIORS, starts=[80.0, 120.0])
    assert learned.install_s == 300 and learned.engine_start_s == 20  # one cell each had them
    # a request: 30 * 4 / 60 = 2.0 and 25 * 8 / 100 = 2.0; overhead 6 and 2 + 8 + 25 = 35: mean 20.5
    assert learned.request_s == 2.0 and learned.cell_overhead_s == 20.5
    assert learned.campaign_s == 100.0
    # the replays measured 30 + 25 s where the model said 20 + 30
    assert learned.replay_scale == 1.1 and learned.sources["replay_scale"] == "2 earlier cell(s)"
    assert learned.sources["request_s"] == "2 earlier cell(s)"
    assert learned.sources["campaign_s"] == "2 earlier run(s)"
    # nothing measured: the fallback's figures and sources
    assert learn([], PRIORS) == PRIORS
