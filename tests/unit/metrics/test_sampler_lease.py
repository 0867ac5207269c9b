"""The sampler ends with its replay (issue 43, defect 13): after a Ctrl-C cancels the replay playbook, its
`always:` stop of the sampler never runs, and the sampler used to scrape the torn-down targets and grow
its files until the next run. The replay runs under `flock FILE` (the replay role); `ReplayLease` sees
the lock held, then free, and `run_sampler` stops by itself, with no stop signal."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from kvoffload.cli.main import main
from kvoffload.metrics.sampler import ReplayLease, Scraper, run_sampler
from kvoffload.metrics.targets import HttpTarget


def _dead_target_scraper() -> Scraper:
    """A scraper of one target that refuses connections, as a torn-down replica does."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    return Scraper(
        [HttpTarget("vllm-0", "http://gone:8000/metrics")],
        client=httpx.Client(transport=httpx.MockTransport(refuse)),
    )


class _Holder:
    """Holds an exclusive flock on a file through its own open file description, as flock(1) does."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def release(self) -> None:
        os.close(self.fd)


def test_the_lease_is_over_once_the_replay_held_the_lock_and_let_go(tmp_path: Path) -> None:
    lock = tmp_path / "cell.lock"
    lock.touch()
    now = [0.0]
    lease = ReplayLease(lock, grace_s=300.0, clock=lambda: now[0])
    assert lease.over() is None  # the sampler starts before the replay takes the lock
    holder = _Holder(lock)
    now[0] = 1000.0  # past the grace: a replay that holds the lock runs as long as it needs
    assert lease.held() and lease.over() is None
    assert lease.over() is None  # asking does not take the lock from the replay
    holder.release()
    assert not lease.held()
    assert lease.over() == f"the replay that held {lock} has ended"


def test_the_lease_is_over_when_no_replay_took_the_lock_within_the_grace(tmp_path: Path) -> None:
    now = [0.0]
    lease = ReplayLease(tmp_path / "cell.lock", grace_s=300.0, clock=lambda: now[0])
    now[0] = 299.0
    assert lease.over() is None
    now[0] = 301.0
    assert lease.over() == f"no replay took {tmp_path / 'cell.lock'} within 300 s"


def test_the_sampler_stops_by_itself_once_its_replay_is_gone(tmp_path: Path) -> None:
    lock = tmp_path / "cell.lock"
    lock.touch()
    holder = _Holder(lock)  # the replay runs
    stop = threading.Event()  # never set: the role's stop never comes (the playbook was canceled)
    scraper = _dead_target_scraper()
    rounds: list[int] = []
    thread = threading.Thread(
        target=lambda: rounds.append(
            run_sampler(scraper, tmp_path / "metrics", 0.02, stop, ReplayLease(lock, grace_s=60.0))
        )
    )
    try:
        thread.start()
        time.sleep(0.2)  # about ten rounds while the replay runs
        holder.release()  # the replay ends (or is killed): the kernel drops its lock
        thread.join(timeout=5)
        assert not thread.is_alive() and not stop.is_set()
        # one `up == 0` line per round of the dead target, every round while the replay ran
        lines = (tmp_path / "metrics" / "vllm-0.jsonl").read_text().splitlines()
        assert rounds == [len(lines)] and rounds[0] >= 1
    finally:
        stop.set()
        thread.join(timeout=5)
        scraper.close()


@pytest.mark.skipif(shutil.which("flock") is None, reason="flock(1) (util-linux) is not installed")
def test_the_lease_sees_the_lock_flock_1_holds_for_the_replay_role(tmp_path: Path) -> None:
    """The role runs `flock FILE kvoffload-lab replay ...`: the lease sees that lock while the command
    runs (the command inherits the locked file, so the lock lasts as long as the replay itself, even if
    flock(1) is killed first) and sees it gone when the command ends."""
    lock = tmp_path / "cell.lock"
    lock.touch()
    lease = ReplayLease(lock, grace_s=60.0)
    proc = subprocess.Popen(["flock", str(lock), "sleep", "30"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not lease.held() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lease.over() is None
        proc.kill()  # flock(1) alone: its command, the replay, still runs and holds the lock
        proc.wait()
        assert lease.held() and lease.over() is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the replay is gone too, as a teardown or a timeout ends it
    deadline = time.monotonic() + 10
    while lease.held() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lease.over() == f"the replay that held {lock} has ended"


def test_the_cli_refuses_a_replay_lock_that_is_not_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["metrics", "sample", "--target", "vllm-0=http://127.0.0.1:9/metrics", "--output", str(tmp_path)]
    assert main([*argv, "--replay-lock", str(tmp_path / "none.lock")]) == 2
    assert f"--replay-lock {tmp_path / 'none.lock'}: no such file (the replay role creates it)" in (
        capsys.readouterr().err
    )
    assert main([*argv, "--replay-lock", str(tmp_path), "--lock-grace", "0"]) == 2
    assert "--lock-grace 0.0: must be a finite number of seconds > 0" in capsys.readouterr().err
