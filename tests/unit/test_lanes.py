"""The lanes of `make test` (tests/support/lanes.py): they split the suite without a gap or an overlap."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.lanes import LANES, Lane, main, report_sections

ROOT = Path(__file__).resolve().parents[2]


def _selects(lane: Lane, path: str) -> bool:
    """Whether pytest given the lane's arguments collects the file `path` (relative to the root)."""
    paths = [a for a in lane.args if not a.startswith("-")]
    ignored = [a.removeprefix("--ignore=") for a in lane.args if a.startswith("--ignore=")]
    inside = any(path == p or path.startswith(p.rstrip("/") + "/") for p in paths)
    return inside and not any(path == i or path.startswith(i.rstrip("/") + "/") for i in ignored)


def test_every_test_file_is_in_exactly_one_lane() -> None:
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py"))
    assert len(files) > 100, files[:5]
    for path in files:
        lanes = [lane.name for lane in LANES if _selects(lane, path)]
        assert len(lanes) == 1, (path, lanes)
    # molecule scenarios never run two at once: each installs this collection into one shared folder
    assert [lane.name for lane in LANES if _selects(lane, "tests/molecule/test_molecule.py")] == ["molecule"]


def test_lab_modules_and_molecule_never_wait_behind_the_unit_tier() -> None:
    local = next(lane for lane in LANES if lane.name == "local")
    for path in (
        *sorted((ROOT / "tests" / "lab").glob("test_*.py")),
        ROOT / "tests/molecule/test_molecule.py",
    ):
        assert not _selects(local, str(path.relative_to(ROOT))), path
    assert _selects(local, "tests/unit/test_atomic.py")
    integration = "tests/integration/test_replay.py"
    assert [lane.name for lane in LANES if _selects(lane, integration)] == ["integration"]
    assert len({lane.name for lane in LANES}) == len(LANES)


def test_make_test_runs_the_lanes() -> None:
    recipe = re.search(r"^test:.*?(?=^\S)", (ROOT / "Makefile").read_text(), re.MULTILINE | re.DOTALL)
    assert recipe is not None and "$(PY) -m tests.support.lanes" in recipe.group(0)


def test_the_end_of_the_run_shows_slowest_tests_and_a_failed_lanes_failures() -> None:
    log = "\n".join(
        ["..F.", "=== FAILURES ===", "___ test_x ___", "assert 1 == 2", "=== slowest 15 durations ===",
         "3.00s call tests/x.py::test_x", "=== short test summary info ===", "FAILED tests/x.py::test_x",
         "=== 1 failed, 3 passed in 4.00s ==="]
    )  # fmt: skip
    passed = report_sections(log, failed=False)
    assert passed.startswith("=== slowest") and "assert 1 == 2" not in passed
    failed = report_sections(log, failed=True)
    assert failed.startswith("=== FAILURES") and "assert 1 == 2" in failed and failed.endswith("4.00s ===")


def test_an_unknown_lane_is_refused_with_the_names() -> None:
    assert main(["nosuchlane"]) == 2
