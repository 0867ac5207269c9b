"""What the bad-input corpus shares: running the CLI (in-process, or as a child process for a few cases
so that a traceback would show), the checks on its outcome, and traps proving that nothing reached for
a host: no socket connect, bind or name lookup, no child process, no lab, model or GPU work.

The traps raise `Touched`, a BaseException, so that code under test cannot swallow it as an OSError and
exit 2 for the wrong reason; every trap also records its name.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvoffload.cli.main import main
from kvoffload.config.ansible_inventory import ansible_machinery

ROOT = Path(__file__).resolve().parents[3]


class Touched(BaseException):
    """Raised by a trap: the command reached for a host, the network, a child process or the lab."""


# (object or module path, attribute) of everything a command could use to touch the outside world.
TRAPS: tuple[tuple[Any, str], ...] = (
    (socket.socket, "connect"),
    (socket.socket, "connect_ex"),
    (socket.socket, "bind"),
    (socket, "getaddrinfo"),
    (subprocess.Popen, "__init__"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    ("multiprocessing.process.BaseProcess", "start"),  # the simulator's process pools
    ("kvoffload.lab.lifecycle", "up"),
    ("kvoffload.lab.lifecycle", "down"),
    ("kvoffload.lab.lifecycle", "status"),
    ("kvoffload.lab.tinymodel", "build_tiny_model"),
    ("kvoffload.calibrate.runner", "run_calibration"),
)


def install_traps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Arm every trap for the current test; returns the list the traps append their names to."""
    # Importing ansible-core runs `ldconfig` (ctypes) and probes socket.getaddrinfo('127.0.0.1', 22) (a
    # numeric self-check, no lookup, no host): done before the traps, as any earlier test would have.
    ansible_machinery()
    touched: list[str] = []

    def trap(name: str) -> Any:
        def sprung(*_args: Any, **_kwargs: Any) -> Any:
            touched.append(name)
            raise Touched(name)

        return sprung

    for owner, attr in TRAPS:
        if isinstance(owner, str):
            monkeypatch.setattr(f"{owner}.{attr}", trap(f"{owner}.{attr}"))
        else:
            monkeypatch.setattr(owner, attr, trap(f"{getattr(owner, '__name__', owner)}.{attr}"))
    return touched


@dataclass(frozen=True)
class Outcome:
    rc: int
    out: str
    err: str


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Outcome:
    """`kvoffload-lab ARGV` in this process; argparse's SystemExit becomes the exit status."""
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return Outcome(rc, out, err)


# Loaded by the child through PYTHONPATH: the same traps, recording to $KVOFFLOAD_TRAP_LOG.
_SITECUSTOMIZE = textwrap.dedent(
    """
    import multiprocessing.process, os, socket, subprocess

    # ansible-core's import runs ldconfig and a numeric getaddrinfo self-check: done before arming.
    from kvoffload.config.ansible_inventory import ansible_machinery
    ansible_machinery()

    _LOG = os.environ["KVOFFLOAD_TRAP_LOG"]

    class Touched(BaseException):
        pass

    def _trap(name):
        def sprung(*args, **kwargs):
            with open(_LOG, "a") as f:
                f.write(name + "\\n")
            raise Touched(name)
        return sprung

    for owner, attr in ((socket.socket, "connect"), (socket.socket, "connect_ex"),
                        (socket.socket, "bind"), (socket, "getaddrinfo"),
                        (subprocess.Popen, "__init__"), (os, "fork"), (os, "forkpty"),
                        (os, "posix_spawn"), (os, "posix_spawnp"),
                        (multiprocessing.process.BaseProcess, "start")):
        setattr(owner, attr, _trap(f"{getattr(owner, '__name__', owner)}.{attr}"))
    """
)


def cli_subprocess(argv: list[str], tmp_path: Path) -> tuple[Outcome, list[str]]:
    """`python -m kvoffload.cli.main ARGV` as a child with the traps armed; (outcome, traps sprung)."""
    guard = tmp_path / "trap-site"
    guard.mkdir(exist_ok=True)
    (guard / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    log = tmp_path / "traps.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(guard), str(ROOT)]),
        "KVOFFLOAD_TRAP_LOG": str(log),
        "COLUMNS": "200",
    }
    # The timeout only guards against a hang (an ssh connect would wait for its own timeout); it is
    # no assertion on speed.
    proc = subprocess.run(
        [sys.executable, "-m", "kvoffload.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    sprung = log.read_text().split() if log.exists() else []
    return Outcome(proc.returncode, proc.stdout, proc.stderr), sprung


def assert_refused(outcome: Outcome, *needles: str) -> None:
    """Exit 2, no traceback, and every needle (file and key, line or flag) in the error output."""
    assert "Traceback" not in outcome.err, outcome.err
    assert outcome.rc == 2, (outcome.rc, outcome.out, outcome.err)
    for needle in needles:
        assert needle in outcome.err, f"{needle!r} not in stderr:\n{outcome.err}"
