"""The run-time estimate's load model (kvoffload/orchestrate/campaign/replay_time.py), every figure by
hand."""

from __future__ import annotations

import pytest

from kvoffload.orchestrate.campaign.replay_time import (
    Demand,
    FlatCost,
    GpuCache,
    ProfileCost,
    Round,
    User,
    gpu_cache,
    play,
)


def _users(n: int, rounds: int, gap_s: float = 0.0) -> list[User]:
    return [tuple(Round(100, 0, 10, gap_s) for _ in range(rounds)) for _ in range(n)]


def _flat(serial: float, delay: float) -> FlatCost:
    return FlatCost(serial + delay, serial / (serial + delay))


def test_a_request_lasts_its_delay_plus_its_serial_time_per_request_in_flight() -> None:
    half = _flat(0.5, 0.5).demand
    two = _users(2, 2)
    # one at a time: 4 requests of 1 s
    assert play(two, 1, 1, half).seconds == pytest.approx(4.0)
    # both at once on one engine: each round 2 x 0.5 s shared, then 0.5 s of delay: 1.5 s a round
    assert play(two, 2, 1, half).seconds == pytest.approx(3.0)
    # on two replicas each has its own engine: 1 s a round
    assert play(two, 2, 2, half).seconds == pytest.approx(2.0)
    # a free slot takes the next user: 3 users of 1 s of serial time, 2 slots: 2 s, then 1 s alone
    assert play(_users(3, 1), 2, 1, _flat(1.0, 0.0).demand).seconds == pytest.approx(3.0)
    # requests in flight on the replica, on average over the replay: 2 for 2 s, then 1 for 1 s
    assert play(_users(3, 1), 2, 1, _flat(1.0, 0.0).demand).in_flight == pytest.approx(5 / 3)


def test_gaps_are_waited_before_later_rounds_when_honored() -> None:
    user = (Round(100, 0, 10, 9.0), Round(100, 0, 10, 2.0), Round(100, 0, 10, 3.0))
    one = _flat(1.0, 0.0).demand
    # 1 + 2 + 1 + 3 + 1: the first round's gap is never waited
    assert play([user], 1, 1, one, honor_gaps=True).seconds == pytest.approx(8.0)
    assert play([user], 1, 1, one).seconds == pytest.approx(3.0)


def test_duration_stops_new_rounds_and_gaps_but_not_requests_in_flight() -> None:
    one = _flat(1.0, 0.0).demand
    # rounds start at 0, 1 and 2; the one that started at 2 ends at 3
    assert play(_users(1, 5), 1, 1, one, duration_s=2.5).seconds == pytest.approx(3.0)
    # round 1 ends at 1, then a gap of 10 s: the deadline at 5 ends it
    assert play(_users(1, 5, gap_s=10.0), 1, 1, one, honor_gaps=True, duration_s=5).seconds == 5.0
    # the next user is not taken after the deadline either
    assert play(_users(3, 1), 1, 1, one, duration_s=1.5).seconds == pytest.approx(2.0)


def test_a_profile_cost_splits_prefill_decode_and_copies() -> None:
    cost = ProfileCost(
        prefill_s=lambda a, b: (b - a) * 0.001,
        decode_base_s=0.002,
        decode_per_seq_s=0.001,
        decode_per_context_token_s=0.0,
        retained=0.5,
    )
    r = Round(prompt_tokens=1000, reused_tokens=600, output_tokens=10, shared_tokens=200)
    # the shared 200 stay, half of the user's own 400: 400 cached, 600 to prefill (0.6 s); decode
    # 10 x 0.001 serial and 10 x 0.002 of step cost, shared by the batch
    assert cost.demand(r) == Demand(pytest.approx(0.61), pytest.approx(0.02))
    # with a connector the other 200 come from the cache server (1e-4 s a token), 400 are stored
    copies = ProfileCost(
        lambda a, b: (b - a) * 0.001, 0.002, 0.001, 0.0, retained=0.5, connector=True,
        load_s_per_token=1e-4, store_s_per_token=1e-5,
    )  # fmt: skip
    assert copies.demand(r) == Demand(pytest.approx(0.4 + 0.01 + 0.02 + 0.004), pytest.approx(0.02))
    # two requests fit at once: a step's fixed cost is theirs alone, engine time
    batch = ProfileCost(lambda a, b: (b - a) * 0.001, 0.002, 0.001, 0.0, retained=0.5, batch=2.0)
    assert batch.demand(r) == Demand(pytest.approx(0.61 + 0.01), 0.0)
    # handling: 1e-5 s a prompt token, half of it engine time
    handled = ProfileCost(lambda a, b: 0.0, 0.0, 0.0, 0.0, handling_s_per_token=1e-5)
    assert handled.demand(r) == Demand(pytest.approx(0.005), pytest.approx(0.005))


def test_the_gpu_cache_keeps_what_the_running_requests_leave() -> None:
    users = [tuple(Round(1000, 0, 0, 0.0, 200) for _ in range(2))]
    # contexts of 1000 tokens, 200 shared: 800 each. 5000 tokens hold 6 requests: 4 users fit
    assert gpu_cache(users, 4, 5000.0) == GpuCache(1.0, None)
    # 2600 tokens: 3 run at once (2400 / 800) and fill it: nothing kept for the fourth user's history
    assert gpu_cache(users, 4, 2600.0) == GpuCache(0.0, pytest.approx(3.0))
    # with gaps, 2 send at once on average: 800 tokens left for the other 2 users' 1600: half kept
    assert gpu_cache(users, 4, 2600.0, running=2.0) == GpuCache(pytest.approx(0.5), None)
    assert gpu_cache(users, 4, None) == GpuCache(1.0, None)
