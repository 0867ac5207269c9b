"""A replica's restart and lmcache-server's are not coupled in the rendered units (issue 41, finding 5g).

A replica that dies after registering its KV cache and before its first request stays registered in
lmcache-server for the registration grace (its KV pool mapped there). Coupling the units would restart
the server, and with it break every other replica of the node, whenever one replica restarts; the lab
keeps them apart, documents the hold in the replica unit and docs/contracts.md, and the doctor's smoke
check names it (tests/unit/doctor/test_doctor_smoke.py). These renders pin that choice for every tier.
"""

from __future__ import annotations

import pytest

from kvoffload.tiers import LMCACHE_REGISTRATION_GRACE_S
from tests.unit.roles.test_rendered_units import CASES, _directives, rendered_files

COUPLING = ("BindsTo", "PartOf", "Requires", "Requisite", "PropagatesReloadTo", "ReloadPropagatedFrom")


@pytest.mark.parametrize(("tier", "engine"), CASES)
def test_replicas_are_ordered_after_the_server_but_never_bound_to_it(tier: str, engine: str) -> None:
    files = rendered_files(tier, engine)
    replica = _directives(files["kvoffload-vllm@.service"])
    assert replica["After"] == ["network-online.target kvoffload-lmcache.service"]
    for key in COUPLING:
        assert key not in replica, f"kvoffload-vllm@.service: {key}={replica.get(key)}"
    if "kvoffload-lmcache.service" in files:
        server = _directives(files["kvoffload-lmcache.service"])
        assert not any("kvoffload-vllm" in v for key in COUPLING for v in server.get(key, [])), server


def test_the_replica_unit_says_why_and_names_the_grace() -> None:
    unit = rendered_files("cpu", "vllm")["kvoffload-vllm@.service"]
    assert "never bound to it either way (no BindsTo=/PartOf=/Requires=)" in unit
    assert "LMCACHE_REGISTRATION_GRACE_S" in unit and LMCACHE_REGISTRATION_GRACE_S == 2100
