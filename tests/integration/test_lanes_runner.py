"""`make test`'s lane runner (tests/support/lanes.py) on two small lanes of its own: real pytest runs."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import lanes
from tests.support.lanes import ROOT, Lane, run

pytestmark = pytest.mark.integration


def test_lanes_run_at_once_and_a_failed_lane_fails_the_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "test_ok.py").write_text(
        "def test_one():\n    pass\n\ndef test_two():\n    assert 1 + 1 == 2\n"
    )
    (tmp_path / "test_bad.py").write_text("def test_bad():\n    assert 'lane' == 'broken'\n")
    logs = tmp_path / "logs"
    lanes = [Lane("ok", (str(tmp_path / "test_ok.py"),)), Lane("bad", (str(tmp_path / "test_bad.py"),))]
    assert run(lanes, logs) == 1
    out = capsys.readouterr().out
    assert "lane ok: passed: 2 passed" in out and "lane bad: FAILED (exit 1): 1 failed" in out
    # the failure itself is shown, not only the log's path; the slowest tests of every lane too
    assert "AssertionError" in out and out.count("slowest") == 2
    assert "1 of 2 lanes passed" in out
    assert "2 passed" in (logs / "ok.log").read_text() and "1 failed" in (logs / "bad.log").read_text()
    # the failed lane's temporary folder is named (and kept), the passed one's removed
    kept = re.findall(r"its temporary files: (\S+)\)", out)
    assert len(kept) == 1 and "kvtest-bad-" in kept[0] and Path(kept[0]).is_dir()
    shutil.rmtree(kept[0])


def test_a_lane_that_collects_nothing_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "test_none.py").write_text("def helper():\n    return 1\n")
    assert run([Lane("empty", (str(tmp_path / "test_none.py"),))], tmp_path / "logs") == 0
    assert "lane empty: passed: no tests ran" in capsys.readouterr().out


def test_a_sigterm_to_the_runner_interrupts_every_lane_so_its_fixtures_clean_up(tmp_path: Path) -> None:
    # A lab fixture takes its lab down in a `finally`: the lane must get a KeyboardInterrupt, not die.
    cleaned = tmp_path / "cleaned"
    started = tmp_path / "started"
    (tmp_path / "test_slow.py").write_text(
        "import pathlib, time\n\n"
        "def test_slow():\n"
        f"    pathlib.Path({str(started)!r}).touch()\n"
        "    try:\n        time.sleep(120)\n"
        f"    finally:\n        pathlib.Path({str(cleaned)!r}).touch()\n"
    )
    lane = f"Lane('slow', ({str(tmp_path / 'test_slow.py')!r},))"
    code = (
        "import sys; from pathlib import Path; from tests.support.lanes import Lane, main; "
        f"sys.exit(main([], ({lane},), Path({str(tmp_path / 'logs')!r})))"
    )
    runner = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started.exists(), "the lane's test never started"
    runner.send_signal(signal.SIGTERM)
    out, _ = runner.communicate(timeout=60)
    assert runner.returncode == 130, out
    assert cleaned.exists(), "the lane's test was killed without running its cleanup"
    assert "stopping every lane" in out
    kept = out.split("their temporary files: ")[1].split()
    assert len(kept) == 1 and "kvtest-slow-" in kept[0]
    shutil.rmtree(kept[0])


def test_lanes_beyond_the_slots_wait_for_a_free_one_in_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("first", "second"):
        (tmp_path / f"test_{name}.py").write_text(
            "import pathlib, time\n\n"
            f"def test_{name}():\n"
            f"    pathlib.Path({str(tmp_path / (name + '.start'))!r}).write_text(str(time.time()))\n"
            "    time.sleep(1)\n"
            f"    pathlib.Path({str(tmp_path / (name + '.end'))!r}).write_text(str(time.time()))\n"
        )
    lanes = [Lane(name, (str(tmp_path / f"test_{name}.py"),)) for name in ("first", "second")]
    assert run(lanes, tmp_path / "logs", slots=1) == 0
    first_done = float((tmp_path / "first.end").read_text())
    second_started = float((tmp_path / "second.start").read_text())
    assert second_started >= first_done, "the second lane ran beside the first with one slot"
    assert "2 lanes, 1 at a time" in capsys.readouterr().out


def test_cpu_busy_share_comes_from_proc_stat_idle_and_iowait_excluded(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 50 800 50 0 0 0 30 0\ncpu0 1 2 3 4\n")
    before = lanes.cpu_times(stat)
    assert before == (150, 1000)
    stat.write_text("cpu  400 0 150 900 50 0 0 0 30 0\n")
    assert lanes.busy_percent(before, lanes.cpu_times(stat)) == "80 %"  # 400 busy of 500
    assert lanes.cpu_times(tmp_path / "missing") == (0, 0)
    assert lanes.busy_percent((0, 0), (0, 0)) == "?"
