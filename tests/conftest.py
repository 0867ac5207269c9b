"""Suite-wide hooks: under `make test` (pytest-xdist, `-n 5 --dist loadgroup`) one worker per lane.

The lanes and why they exist: tests/support/lanes.py. Without xdist (`make unit`, `pytest tests/lab`,
one module by hand), or with another `--dist`, this file changes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.lanes import lane_of


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` schedules whole lanes: xdist's own grouping renames node ids (`name@group`),
    which pytest 9.2's node ids no longer allow, so the lane is read from the node id here instead."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return lane_of(nodeid)

    return LaneScheduling(config, log)
