"""The lanes of `make test` (tests/support/lanes.py) against the Makefile and the test folders."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.lanes import DEFAULT_LANE, lane_names, lane_of

ROOT = Path(__file__).resolve().parents[2]


def test_make_test_starts_one_worker_per_lane() -> None:
    makefile = (ROOT / "Makefile").read_text()
    lanes = re.search(r"^LANES := (\d+)$", makefile, re.MULTILINE)
    assert lanes is not None and int(lanes.group(1)) == len(lane_names()), lane_names()
    assert "-n $(LANES) --dist loadgroup" in makefile


def test_every_lab_module_and_molecule_runs_outside_the_local_lane() -> None:
    # A lab module in the local lane would wait behind the whole unit tier with its lab down.
    slow = sorted((ROOT / "tests" / "lab").glob("test_*.py")) + sorted(
        (ROOT / "tests" / "molecule").glob("test_*.py")
    )
    assert len(slow) >= 6, slow
    for path in slow:
        assert lane_of(f"{path.relative_to(ROOT)}::test_x") != DEFAULT_LANE, path
    assert lane_of("tests/lab/test_lab_real_engine.py::test_x") == "real-engine"
    assert lane_of("tests/lab/test_lab_faults.py::test_x") == "lab-faults"
    assert lane_of("tests/lab/test_lab_campaign.py::test_x") == "lab"


def test_unit_and_integration_tests_share_the_local_lane() -> None:
    for nodeid in ("tests/unit/test_atomic.py::test_x", "tests/integration/test_replay.py::test_x[a/b]"):
        assert lane_of(nodeid) == DEFAULT_LANE
    assert lane_names()[-1] == DEFAULT_LANE and len(set(lane_names())) == len(lane_names())
