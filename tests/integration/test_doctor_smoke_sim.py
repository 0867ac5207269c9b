"""The doctor's pair smoke check (kvoffload/orchestrate/checks/round_trip.py `round_trip`, judged by
kvoffload/doctor/smoke.py) against the simulator's engine and cache server as real processes on
loopback: the same HTTP calls and counter families as against real vLLM and LMCache (the simulator
copies their names, tests/integration/test_sim_engine.py holds it to the captures). The real pair is
the real-engine lane's (tests/lab/test_lab_real_engine.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from kvoffload.doctor import smoke as ds
from kvoffload.doctor.checks import Status
from kvoffload.orchestrate.checks.round_trip import Pair, round_trip
from tests.integration.test_sim_engine import MODEL, cache_server, engine

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_the_round_trip_stores_then_retrieves_through_the_simulated_pair(tmp_path: Path) -> None:
    with (
        httpx.Client(timeout=60, trust_env=False) as client,
        cache_server(tmp_path, l1_gb=0.5) as (cache, port),
        engine(tmp_path, "r", [], port, dev=True) as replica,
    ):
        facts = round_trip(Pair("node", replica.url, cache.url, MODEL, 256), client, nonce="a1")
        # nothing will be stored this time: wait 3 s for it, not the minute a real server may need
        again = round_trip(
            Pair("node", replica.url, cache.url, MODEL, 256), client, nonce="a1", store_wait_s=3
        )
    verdict = ds.judge(facts)
    assert verdict.status == Status.OK, (verdict.detail, facts)
    summary = verdict.facts
    assert summary["registered"] is None  # the simulator's /status does not list registrations
    assert summary["prompt_tokens"][0] >= 3 * 256 and summary["stored_chunks"] >= 3
    assert summary["hit_tokens"] == summary["external_hits"] >= 3 * 256
    # the same nonce again: the first request now hits what the earlier trip stored, nothing new is
    # written, and the verdict says the store did not happen (a fresh nonce per doctor run avoids it)
    failed = ds.judge(again)
    assert failed.status == Status.FAIL and "stored nothing" in failed.detail, failed.detail
