"""`make test`'s runner: the suite as lanes, one pytest process each, several at once.

Most of the suite's wall time is waiting (engines starting, replays, ssh round trips, containers
booting), so lanes overlap well on CI's 2 cores: serial, the suite took 54-77 minutes. A lane is a
plain pytest run of some paths, so every test runs exactly as `pytest <paths>` runs it, module-scoped
fixtures (one virtual lab per lab module, the molecule image and wheels) are built once per lane, and
each lane collects only its own tests. The lanes split the suite without a gap or an overlap: the last
lane is everything the others do not name (`--ignore`). Lanes never share a lab: each lab module
brings up its own on its own bridge, subnet, host prefix and state folder; the molecule scenarios run
in podman containers, one after another.

    python -m tests.support.lanes            # every lane (what `make test` runs)
    python -m tests.support.lanes lab local  # some lanes, by name

Each lane writes its whole output to `.make/test-lanes/<lane>.log`; this prints a line as each lane
ends, a heartbeat while they run, then every lane's summary and slowest tests, and the failures of a
lane that failed. Exit status 0 only when every lane passed (or collected nothing). Ctrl-C (or a
SIGTERM to the runner) stops every lane with SIGINT, so the lab fixtures still take their labs down.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / ".make" / "test-lanes"
HEARTBEAT_S = 120.0
STOP_GRACE_S = 300.0  # a lab fixture's `lab down` after SIGINT
# Lanes at once. The suite is CPU-bound once its waits overlap: on CI's 2 cores, six lanes at once
# kept both cores busy from the first minute but ran each lane 4-6 times slower than alone (a third
# of the time in the kernel: forks, podman, ssh), so the whole was no faster. Two at once fill one
# lane's waits with another's work (alone, the suite kept the cores 40-85 % busy).
SLOTS = 2
REAL_ENGINE = "tests/lab/test_lab_real_engine.py"
FAULTS = "tests/lab/test_lab_faults.py"


@dataclass(frozen=True)
class Lane:
    """A name and the pytest arguments that select its tests."""

    name: str
    args: tuple[str, ...]


LANES: tuple[Lane, ...] = (
    # Longest first (the comments: minutes of a clean-clone run on a fresh 2-core machine, two at a
    # time), so that the short lanes fill the slots at the end: molecule holds one slot for most of
    # the run and the other lanes share the other. Molecule is one lane by choice, not need (its
    # scenarios skip molecule's prerun, so two at once no longer race on an installed collection): alone
    # it keeps the cores only 45-65 % busy, so it is the lane that best shares the machine.
    Lane("molecule", ("tests/molecule",)),  # 22.4
    # 9.1: the engines' wheels, a lab, doctor's smoke check, three engine starts, six cells
    Lane("real-engine", (REAL_ENGINE,)),
    # 9.6 before README's virtual-lab recipe joined this lane (tests/lab/test_readme_recipe.py: its own
    # lab, four simulator cells: 3.8 min alone, 2026-12-05)
    Lane("lab", ("tests/lab", f"--ignore={REAL_ENGINE}", f"--ignore={FAULTS}")),
    Lane("lab-faults", (FAULTS,)),  # 7.0
    Lane("integration", ("tests/integration",)),  # 6.8: real processes on loopback
    # Everything else (2.4): the unit tier (and any new folder of tests).
    Lane("local", ("tests", "--ignore=tests/lab", "--ignore=tests/molecule", "--ignore=tests/integration")),
)


def pytest_argv(lane: Lane, basetemp: Path) -> list[str]:
    """The command line of one lane: quiet, skips and failures summarised, its 15 slowest tests."""
    return [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-ra",
        "--durations=15",
        # Lanes run at once: each its own temporary folder, and no shared .pytest_cache to race on.
        f"--basetemp={basetemp}",
        "-p",
        "no:cacheprovider",
        *lane.args,
    ]


@dataclass
class Running:
    """A lane's pytest process and where its output goes."""

    lane: Lane
    proc: subprocess.Popen[bytes]
    log: Path
    basetemp: Path
    started: float


def _start(lane: Lane, logs: Path) -> Running:
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{lane.name}.log"
    basetemp = Path(tempfile.mkdtemp(prefix=f"kvtest-{lane.name}-"))
    with log.open("wb") as out:
        # Its own session: a Ctrl-C at the terminal reaches this runner only, which passes it on.
        proc = subprocess.Popen(
            pytest_argv(lane, basetemp),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
    return Running(lane, proc, log, basetemp, time.monotonic())


def last_line(log: Path) -> str:
    """The last non-empty line of a lane's log (pytest's summary line once it has ended)."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip("= ") if lines else "(no output)"


def report_sections(text: str, failed: bool) -> str:
    """What the end of the run shows of a lane's log: its slowest tests and short summary, and for a
    failed lane its failures and errors first (at most 400 lines of them)."""
    lines = text.splitlines()

    def start_of(marker: str) -> int | None:
        return next((i for i, line in enumerate(lines) if line.startswith("=") and marker in line), None)

    tail = start_of("slowest") or start_of("short test summary")
    tail = max(0, len(lines) - 40) if tail is None else tail
    shown = lines[tail:]
    if failed:
        first = min((i for i in (start_of("FAILURES"), start_of("ERRORS")) if i is not None), default=tail)
        shown = lines[first:tail][:400] + shown
    return "\n".join(shown)


def _stop(running: list[Running]) -> None:
    for r in running:
        if r.proc.poll() is None:
            r.proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + STOP_GRACE_S
    for r in running:
        try:
            r.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait()


def run(lanes: list[Lane], logs: Path = LOGS, slots: int = SLOTS) -> int:
    """Run the lanes, at most `slots` at once, in the given order (the longest first: a lane starts as
    soon as a slot frees); their logs in `logs`. The exit status of the whole."""
    t0 = time.monotonic()
    names = ", ".join(lane.name for lane in lanes)
    print(f"make test: {len(lanes)} lanes, {slots} at a time ({names}); logs in {logs}", flush=True)
    waiting = list(lanes)
    running: list[Running] = []
    ended: dict[str, tuple[int, float]] = {}
    next_beat = t0 + HEARTBEAT_S
    cpu_start = cpu_beat = cpu_times()
    try:
        while len(ended) < len(lanes):
            while waiting and len(running) - len(ended) < slots:
                running.append(_start(waiting.pop(0), logs))
            time.sleep(1.0)
            for r in running:
                if r.lane.name in ended or r.proc.poll() is None:
                    continue
                ended[r.lane.name] = (r.proc.returncode, time.monotonic() - r.started)
                verdict = "passed" if r.proc.returncode in (0, 5) else f"FAILED (exit {r.proc.returncode})"
                print(f"[{_clock(t0)}] lane {r.lane.name}: {verdict}: {last_line(r.log)}", flush=True)
            if time.monotonic() >= next_beat and len(ended) < len(lanes):
                busy = [r.lane.name for r in running if r.lane.name not in ended]
                cpu_now = cpu_times()
                print(f"[{_clock(t0)}] running: {', '.join(busy)}; waiting: {len(waiting)}; "
                      f"cpu busy {busy_percent(cpu_beat, cpu_now)}", flush=True)  # fmt: skip
                cpu_beat = cpu_now
                next_beat += HEARTBEAT_S
    except KeyboardInterrupt:
        print("make test: interrupted; stopping every lane (their labs are taken down)", flush=True)
        _stop(running)
        # Kept: a lane stopped twice may have left a lab up, and `lab down` needs its state folder.
        print("their temporary files: " + " ".join(str(r.basetemp) for r in running), flush=True)
        return 130
    failed = [r for r in running if ended[r.lane.name][0] not in (0, 5)]
    for r in running:
        rc, seconds = ended[r.lane.name]
        print(f"\n{'=' * 30} lane {r.lane.name}: {seconds / 60:.1f} min {'=' * 30}")
        print(report_sections(r.log.read_text(errors="replace"), r in failed))
        if rc in (0, 5):
            shutil.rmtree(r.basetemp, ignore_errors=True)
        else:
            print(f"(whole output: {r.log}; its temporary files: {r.basetemp})")
    print(
        f"\nmake test: {len(running) - len(failed)} of {len(running)} lanes passed in {_clock(t0)} "
        f"({slots} at a time; cpu busy {busy_percent(cpu_start, cpu_times())} over the run)"
    )
    for r in running:
        rc, seconds = ended[r.lane.name]
        print(f"  {r.lane.name:12s} {seconds / 60:5.1f} min  {last_line(r.log)}")
    return 1 if failed else 0


def cpu_times(stat: Path = Path("/proc/stat")) -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat's first line (idle and iowait count
    as not busy); (0, 0) where the file cannot be read."""
    try:
        fields = [int(f) for f in stat.read_text().splitlines()[0].split()[1:]]
    except (OSError, IndexError, ValueError):
        return 0, 0
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    idle = sum(fields[3:5])
    return total - idle, total


def busy_percent(before: tuple[int, int], after: tuple[int, int]) -> str:
    """The machine's CPU busy share between two `cpu_times` readings, e.g. "87 %" ("?" without data):
    near 100 % the lanes are CPU-bound and more slots would not help; well below, they wait."""
    total = after[1] - before[1]
    return f"{100 * (after[0] - before[0]) / total:.0f} %" if total > 0 else "?"


def _clock(t0: float) -> str:
    seconds = int(time.monotonic() - t0)
    return f"{seconds // 60:d}:{seconds % 60:02d}"


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str], lanes: tuple[Lane, ...] = LANES, logs: Path = LOGS) -> int:
    """Run the lanes named in `argv` (all of `lanes` when none is named)."""
    # The lanes run in sessions of their own: a SIGTERM to this runner (a CI job cancelled) must reach
    # them the way a Ctrl-C does, or their labs would outlive it.
    signal.signal(signal.SIGTERM, _interrupt)
    # A shell that starts a job in the background (a CI runner may) ignores SIGINT for it, and a lane
    # would inherit that and could not be stopped with its fixtures' cleanup: handle it here, so that
    # the lanes start with the default and Python's KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    names = {lane.name: lane for lane in lanes}
    unknown = [a for a in argv if a not in names]
    if unknown:
        print(f"unknown lane(s) {', '.join(unknown)}; the lanes: {', '.join(names)}", file=sys.stderr)
        return 2
    return run([names[a] for a in argv] if argv else list(lanes), logs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
