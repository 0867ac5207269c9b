"""Bad input refused by a real child process: the CLI exits 2 naming file and key with the traps
armed through sitecustomize (no network, no subprocess, no file outside tmp), and no traceback.

Integration tier: each test starts `python -m kvoffload.cli.main`. The corpora live in
tests/unit/badinput (their in-process runs stay unit tests); a handful go through a process here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.badinput import test_cli_flags as flags
from tests.unit.badinput import test_datasets as datasets
from tests.unit.badinput.harness import assert_refused, cli_subprocess

pytestmark = pytest.mark.integration

CASES, TARGET, _fill, _paths = flags.CASES, flags.TARGET, flags._fill, flags._paths
DATA_CASES, _write = datasets.CASES, datasets._write


SUBPROCESS = (
    "run-unknown-cell",
    "sample-interval-nan",
    "serve-port-too-big",
    "calibrate-disk-bytes-infinite",
    "ingest-samples-bad-line",
)


@pytest.mark.parametrize("case_id", SUBPROCESS)
def test_bad_flag_is_refused_by_a_real_process(case_id: str, tmp_path: Path) -> None:
    """A handful again as child processes, with the same traps armed through sitecustomize."""
    case = next(c for c in CASES if c.id == case_id)
    paths = _paths(tmp_path, case.argv + case.needles)
    if case.setup is not None:
        case.setup(paths)
    outcome, sprung = cli_subprocess([_fill(a, paths) for a in case.argv], tmp_path)
    assert_refused(outcome, *(_fill(n, paths) for n in case.needles))
    assert sprung == []
    assert not (tmp_path / "r").exists() and not (tmp_path / "w").exists()


def test_the_child_process_traps_are_live(tmp_path: Path) -> None:
    """A valid snapshot of a TEST-NET target reaches for the network in the child: its trap fires,
    so `sprung == []` above means that nothing was tried, not that nothing was watched."""
    argv = ["metrics", "snapshot", *TARGET, "--output", str(tmp_path / "s.jsonl")]
    outcome, sprung = cli_subprocess(argv, tmp_path)
    assert outcome.rc != 0 and sprung
    assert sprung[0] in ("socket.getaddrinfo", "socket.connect")


def test_a_bad_line_is_named_by_a_real_process(tmp_path: Path) -> None:
    """The same check through a child process: a traceback on its stderr would show here."""
    case = next(c for c in DATA_CASES if c.id == "generic-not-utf8")
    path = _write(case, tmp_path / "ds")
    outcome, sprung = cli_subprocess(
        ["datasets", "inspect", "--dataset-code", "generic", str(path)], tmp_path
    )
    assert_refused(outcome, f"{path}: line 4: not UTF-8 text (byte 0xe9")
    assert sprung == []
