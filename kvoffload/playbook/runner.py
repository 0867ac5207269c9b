"""Typed facade over `ansible_runner.run` (see package docstring).

Artifacts (job events, stdout) are kept under the campaign's results folder, one `ident` per call, so a
failed deploy can be read after the fact. Extra variables are passed on the command line, never written
to the runner's env/ folder (`suppress_env_files`), since they may carry secrets.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kvoffload


def ansible_dir() -> Path:
    """Folder holding ansible.cfg, playbooks/ and roles/ (the repository root, or $KVOFFLOAD_ANSIBLE_DIR)."""
    override = os.environ.get("KVOFFLOAD_ANSIBLE_DIR")
    return Path(override) if override else Path(kvoffload.__file__).resolve().parents[1]


@dataclass(frozen=True)
class TaskFailure:
    host: str
    task: str
    message: str
    unreachable: bool = False


@dataclass(frozen=True)
class PlaybookResult:
    playbook: str
    status: str
    rc: int
    changed: dict[str, int]
    failures: tuple[TaskFailure, ...]
    artifacts: Path
    duration_s: float
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def total_changed(self) -> int:
        return sum(self.changed.values())


class PlaybookCanceled(KeyboardInterrupt):
    """A stop was requested (Ctrl-C, SIGTERM) while a playbook ran; ansible-playbook was killed."""


_STOP = threading.Event()
_RUNNING = threading.Event()


def request_stop() -> bool:
    """Ask the running playbook to stop (ansible-playbook runs in its own session, so a terminal's
    Ctrl-C never reaches it). Returns False when no playbook is running: the caller then interrupts
    itself."""
    if not _RUNNING.is_set():
        return False
    _STOP.set()
    return True


class PlaybookFailed(RuntimeError):
    """A playbook ended in failure; the message names each failed host and task."""

    def __init__(self, result: PlaybookResult) -> None:
        self.result = result
        lines = [
            f"playbook {result.playbook} {result.status} (rc {result.rc}); artifacts: {result.artifacts}"
        ]
        for f in result.failures:
            kind = "unreachable" if f.unreachable else "failed"
            lines.append(f"  {f.host}: {kind} at task '{f.task}': {f.message}")
        super().__init__("\n".join(lines))


EventCallback = Callable[[str, str], None]  # (host or "", task name) when a task starts on the run


def _message(res: Mapping[str, Any]) -> str:
    """The task's message, with the last line of its stderr when it has one ("non-zero return code")."""
    parts = [str(res[k]).strip()[:400] for k in ("msg", "reason") if res.get(k)]
    stderr = str(res.get("stderr") or "").strip()
    if stderr:
        parts.append("stderr: " + stderr.splitlines()[-1][:400])
    return ": ".join(parts) or "no message"


def _kill_leftovers(artifact_dir: Path) -> int:
    """SIGKILL what a canceled ansible-playbook left behind.

    ansible-runner kills ansible-playbook's process group, but ansible's per-host workers run in
    sessions of their own and would go on (polling a remote replay, say) as orphans. Every one of them
    inherits AWX_ISOLATED_DATA_DIR=<this run's artifact dir> from ansible-runner, which identifies them.
    """
    marker = f"AWX_ISOLATED_DATA_DIR={artifact_dir}".encode()
    killed = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environ:
            try:
                os.kill(int(proc.name), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


class PlaybookRunner:
    """Runs phase playbooks of this repository against one inventory."""

    def __init__(
        self,
        inventory: Path,
        artifacts: Path,
        on_task: EventCallback | None = None,
        envvars: Mapping[str, str] | None = None,
    ) -> None:
        self.inventory = inventory.resolve()
        self.artifacts = artifacts.resolve()
        self.on_task = on_task
        self.envvars = dict(envvars or {})

    def run(
        self,
        playbook: str,
        extravars: Mapping[str, Any] | None = None,
        *,
        limit: str | None = None,
        tags: Sequence[str] = (),
        check: bool = False,
        ident: str | None = None,
    ) -> PlaybookResult:
        """Run `playbooks/<playbook>`; raise `PlaybookFailed` unless it succeeds."""
        import ansible_runner  # only this module imports it

        base = ansible_dir()
        path = base / "playbooks" / playbook
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such playbook")
        self.artifacts.mkdir(parents=True, exist_ok=True)
        ident = ident or f"{time.strftime('%Y%m%dT%H%M%S')}-{path.stem}"
        failures: list[TaskFailure] = []
        facts: dict[str, dict[str, Any]] = {}

        def handler(event: dict[str, Any]) -> bool:
            data = event.get("event_data") or {}
            kind = event.get("event")
            if kind == "playbook_on_task_start" and self.on_task is not None:
                self.on_task("", str(data.get("task", "")))
            elif kind == "runner_on_failed" and not data.get("ignore_errors"):
                failures.append(
                    TaskFailure(str(data.get("host")), str(data.get("task")), _message(data.get("res") or {}))
                )
            elif kind == "runner_on_unreachable":
                failures.append(
                    TaskFailure(
                        str(data.get("host")), str(data.get("task")), _message(data.get("res") or {}), True
                    )
                )
            elif kind == "runner_on_ok":
                res = data.get("res") or {}
                set_facts = res.get("ansible_facts") if isinstance(res, dict) else None
                if isinstance(set_facts, dict) and set_facts.get("kvoffload_host_facts"):
                    facts[str(data.get("host"))] = set_facts["kvoffload_host_facts"]
            return True  # keep the event in the artifacts

        cmdline = "--check --diff" if check else None
        bindir = Path(sys.executable).parent  # the ansible of this environment, whatever PATH says
        env = {
            "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
            "ANSIBLE_CONFIG": str(base / "ansible.cfg"),
            "ANSIBLE_ROLES_PATH": str(base / "roles"),
            "ANSIBLE_NOCOLOR": "1",
            **self.envvars,
        }
        t0 = time.monotonic()
        _STOP.clear()
        _RUNNING.set()
        try:
            runner = ansible_runner.run(
                private_data_dir=str(self.artifacts),
                project_dir=str(base / "playbooks"),
                playbook=str(path),
                inventory=str(self.inventory),
                extravars=dict(extravars or {}),
                limit=limit,
                tags=",".join(tags) if tags else None,
                cmdline=cmdline,
                envvars=env,
                ident=ident,
                quiet=True,
                suppress_env_files=True,
                event_handler=handler,
                cancel_callback=_STOP.is_set,
            )
        finally:
            _RUNNING.clear()
        if runner.status == "canceled":
            _STOP.clear()
            _kill_leftovers(self.artifacts / "artifacts" / ident)
            raise PlaybookCanceled(
                f"playbook {playbook} stopped on request; artifacts: {self.artifacts / 'artifacts' / ident}"
            )
        stats = runner.stats or {}
        result = PlaybookResult(
            playbook=playbook,
            status=str(runner.status),
            rc=int(runner.rc),
            changed={str(h): int(n) for h, n in (stats.get("changed") or {}).items()},
            failures=tuple(failures),
            artifacts=self.artifacts / "artifacts" / ident,
            duration_s=round(time.monotonic() - t0, 3),
            facts=facts,
        )
        if result.status != "successful" or result.rc != 0:
            raise PlaybookFailed(result)
        return result
