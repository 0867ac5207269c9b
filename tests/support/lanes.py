"""The lanes of `make test`: which tests share a pytest-xdist worker (tests/conftest.py applies them).

Most of the suite's wall time is waiting (engines starting, replays, ssh round trips, containers
booting), so the lanes run at once, one pytest-xdist worker each (`-n 5 --dist loadgroup`: the lane is
the scheduler's scope, tests/conftest.py). A lane keeps its tests on one worker in collection order, so
a module-scoped fixture (one virtual lab per lab module, the molecule image and wheels) is
built once. Lanes never share a lab: each lab module brings up its own on its own bridge, subnet, host
prefix and state folder, and the molecule scenarios run in podman containers.

The split follows the durations measured on a fresh 2-core machine (README, "Tests"): the real-engine
lane and molecule are the longest, the simulator's lab modules and the fault tests next, and the
in-process and loopback tiers fill the last lane.
"""

from __future__ import annotations

# path prefix (from the repository root) -> lane; the first match wins, the rest runs in DEFAULT_LANE.
LANES: tuple[tuple[str, str], ...] = (
    ("tests/lab/test_lab_real_engine.py", "real-engine"),
    ("tests/lab/test_lab_faults.py", "lab-faults"),
    ("tests/lab/", "lab"),
    ("tests/molecule/", "molecule"),
)
DEFAULT_LANE = "local"


def lane_of(nodeid: str) -> str:
    """The lane of a test, from its node id (`tests/lab/test_lab_up.py::test_lab_up_reach_and_down`)."""
    return next((lane for prefix, lane in LANES if nodeid.startswith(prefix)), DEFAULT_LANE)


def lane_names() -> list[str]:
    """Every lane once, in the order of LANES, the default last."""
    return list(dict.fromkeys([lane for _, lane in LANES] + [DEFAULT_LANE]))
