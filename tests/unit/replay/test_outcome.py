"""Exit codes of `kvoffload-lab replay` from session counts, their verdict lines, and the role's copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvoffload.replay.outcome import COMPLETED, MEANING, ExitCode, exit_code, verdict
from kvoffload.replay.records import SessionCounts

ROLE_VARS = Path(__file__).resolve().parents[3] / "roles" / "replay" / "vars" / "main.yml"
BASE = SessionCounts(requested_concurrency=2, num_rounds=5, virtual_users_available=4)


@pytest.mark.parametrize(
    ("changes", "code", "line"),
    [
        ({"requests": 20, "complete": 4}, ExitCode.OK, None),
        (
            {"requests": 20, "failed_requests": 2, "complete": 2, "error": 2, "first_error": "HTTP 500: x"},
            ExitCode.SOME_FAILED,
            "replay completed with failures: 2 of 20 requests failed, 2 error sessions; first: HTTP 500: x",
        ),
        # a session that raised before sending anything: every request ok, still not a clean run
        (
            {"requests": 15, "complete": 3, "error": 1, "exceptions": 1},
            ExitCode.SOME_FAILED,
            "1 error sessions",
        ),
        (
            {"requests": 4, "failed_requests": 4, "error": 4, "first_error": "HTTP 503: down"},
            ExitCode.ALL_FAILED,
            "replay failed: every request failed (4 of 4); first: HTTP 503: down",
        ),
        (
            {"error": 4, "exceptions": 4, "first_error": "KeyError: 'messages'"},
            ExitCode.ALL_FAILED,
            "replay failed: no request could be sent (4 error sessions); first: KeyError: 'messages'",
        ),
        (
            {"stopped_by": "warmup", "stop_reason": "all 4 warm-up requests failed (ConnectError)"},
            ExitCode.ALL_FAILED,
            "replay failed: all 4 warm-up requests failed (ConnectError)",
        ),
        (
            {"requests": 9, "failed_requests": 2, "stopped_by": "stall", "stop_reason": "no byte for 300 s"},
            ExitCode.STALLED,
            "replay stalled: no byte for 300 s",
        ),
        (
            {"requests": 3, "interrupted": True, "stopped_by": "interrupt"},
            ExitCode.INTERRUPTED,
            "interrupted",
        ),
    ],
)
def test_exit_code_and_verdict(changes: dict[str, object], code: ExitCode, line: str | None) -> None:
    counts = BASE.model_copy(update=changes)
    assert exit_code(counts) is code
    got = verdict(counts)
    if line is None:
        assert got is None
    else:
        assert got is not None and line in got


def test_codes_are_distinct_and_keep_2_for_bad_input() -> None:
    assert len({int(c) for c in ExitCode}) == len(ExitCode)
    assert int(ExitCode.BAD_INPUT) == 2
    assert set(MEANING) == set(ExitCode)


def test_the_replay_role_completes_a_cell_on_exactly_these_codes() -> None:
    role_vars = yaml.safe_load(ROLE_VARS.read_text())
    assert role_vars["_replay_completed_rcs"] == [int(c) for c in COMPLETED]
    assert [int(c) for c in COMPLETED] == [0, 3]
