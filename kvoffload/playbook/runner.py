"""Typed facade over `ansible_runner.run` (see package docstring).

Artifacts (job events, stdout) are kept under the campaign's results folder, one `ident` per call, so a
failed deploy can be read after the fact.

Extra variables reach ansible-playbook as `-e @FILE`, never as values on its command line (which any
local user reads with `ps`, and which ansible-runner records in `artifacts/<ident>/command`): FILE is a
JSON file of mode 0600 in a fresh folder of mode 0700, readable by this user (and root) only, and
removed when the playbook ends.

Secrets. Extra variables and environment variables are still NOT secret channels: the job events kept
under `artifacts/` carry task arguments and results, hence variable values, and ansible-runner records
the whole environment it gives ansible-playbook (its own environment included) in
`artifacts/<ident>/command`. So `run` refuses secret-named extra variables, and the environment handed
to ansible-runner never holds the Hugging Face token: HF_TOKEN (and its older name) are blanked there.
The one secret, the Hugging Face token, reaches the vllm role either from the inventory (ansible-vault,
`vllm_hf_token`, which ansible itself reads) or, when the controller's HF_TOKEN is set, through an
in-memory file (Linux memfd) of this process that lives only while the playbook runs: its path, not
the token, goes in $KVOFFLOAD_HF_TOKEN_FILE, and the role's download task reads it inside `no_log`.
Nothing of the token is written to a disk on the controller. `suppress_env_files` stays on, and
ansible-runner's own env/extravars is not used: it would stay on disk in the results folder after the
run, and ansible-runner writes it once and would feed that stale file to every later run of the same
folder.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kvoffload
from kvoffload.errors import UserError

# The controller's variables that hold a Hugging Face token (huggingface_hub reads both names). Blanked
# in the environment of every playbook run: ansible-runner would record them in artifacts/<ident>/command
# and a host reached with a local connection would cache them in its `ansible_env` fact.
HF_TOKEN_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# Environment variable of ansible-playbook naming the in-memory file that holds the controller's HF_TOKEN
# (a /proc/<pid>/fd path, not the token); roles/vllm reads it as vllm_hf_token_file.
HF_TOKEN_FILE_VAR = "KVOFFLOAD_HF_TOKEN_FILE"
# Extra variables that look like secrets (`vllm_hf_token`, `*_password`, ...): refused, see the docstring.
SECRET_NAME = re.compile(r"(^|_)(token|password|passwd|secret|api_key)(_|$)", re.IGNORECASE)


def ansible_dir() -> Path:
    """Folder holding ansible.cfg, playbooks/ and roles/ (the repository root, or $KVOFFLOAD_ANSIBLE_DIR)."""
    override = os.environ.get("KVOFFLOAD_ANSIBLE_DIR")
    return Path(override) if override else Path(kvoffload.__file__).resolve().parents[1]


# The collection's modules whose results the runner keeps (PlaybookResult.unit_states, .software).
UNIT_STATES_MODULE = "kvoffload_unit_states"
START_UNITS_MODULE = "kvoffload_start_units"
SOFTWARE_MODULE = "kvoffload_software"


@dataclass(frozen=True)
class TaskFailure:
    host: str
    task: str
    message: str
    unreachable: bool = False
    play: str = ""  # the play the task belongs to


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
    # (play name, seconds from the run's start to the play's start), in order: lets a caller time the
    # phases of a playbook that runs several (replay.yml replays, then collects)
    plays: tuple[tuple[str, float], ...] = ()
    # host -> the units the collect role's `kvoffload_unit_states` read there (unit -> properties); a
    # run of the module that stopped units (a teardown) is not a reading of the cell's units
    unit_states: dict[str, dict[str, Any]] = field(default_factory=dict)
    # host -> unit -> NRestarts of a unit whose start failed and that systemd started again (the
    # `nrestarts` of `kvoffload_start_units`): restarts of the deploy, not of the cell
    start_restarts: dict[str, dict[str, int]] = field(default_factory=dict)
    # host -> the record the collect role's `kvoffload_software` read there (software/<host>.json)
    software: dict[str, dict[str, Any]] = field(default_factory=dict)
    # (play name, host, the lmcache_server role's `lmcache_server_l2_trim_result` fact) of each fstrim
    # after an L2 wipe, in order (roles/lmcache_server/tasks/trim_l2.yml)
    l2_trims: tuple[tuple[str, str, dict[str, Any]], ...] = ()

    @property
    def total_changed(self) -> int:
        return sum(self.changed.values())

    def seconds_from(self, play: str) -> float | None:
        """Seconds from the start of the first play named `play` to the run's end; None when it never
        started."""
        for name, at in self.plays:
            if name == play:
                return round(max(0.0, self.duration_s - at), 3)
        return None

    def failed_only_in(self, play: str) -> bool:
        """Whether tasks failed and every one of them in the play named `play`."""
        return bool(self.failures) and all(f.play == play for f in self.failures)


class PlaybookCanceled(KeyboardInterrupt):
    """A stop was requested (Ctrl-C, SIGTERM) while a playbook ran; ansible-playbook was killed."""


class _Stops:
    """Stop requests and running playbooks, shared by the threads of a node-parallel campaign.

    A stop cancels every playbook running when it is requested, and none started after it (the
    teardown that follows an interrupt must run): each run compares the stop count with the one it
    started under.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.running = 0

    def started(self) -> int:
        with self._lock:
            self.running += 1
            return self.requests

    def ended(self) -> None:
        with self._lock:
            self.running -= 1

    def request(self) -> bool:
        with self._lock:
            if not self.running:
                return False
            self.requests += 1
            return True


_STOPS = _Stops()


def request_stop() -> bool:
    """Ask every running playbook to stop (ansible-playbook runs in its own session, so a terminal's
    Ctrl-C never reaches it). Returns False when no playbook is running: the caller then interrupts
    itself."""
    return _STOPS.request()


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
        if not result.failures:
            # No task failed: ansible-playbook itself stopped (a YAML error in a role, a bad option).
            lines += [f"  {line}" for line in _playbook_errors(result.artifacts / "stdout")]
        super().__init__("\n".join(lines))


def _playbook_errors(stdout: Path, limit: int = 8) -> list[str]:
    """The `[ERROR]` line of ansible-playbook's output and the lines after it, up to `limit`."""
    try:
        text = stdout.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    start = next((i for i, line in enumerate(text) if line.startswith(("[ERROR]", "ERROR!"))), None)
    if start is None:
        return []
    return [line.rstrip() for line in text[start : start + limit] if line.strip()]


EventCallback = Callable[[str, str], None]  # (host or "", task name) when a task starts on the run


# What a failure's message keeps: its first line, and of the lines after it (a unit's journal, quoted by
# kvoffload_start_units) the last ones, each cut.
MESSAGE_HEAD_CHARS = 400
MESSAGE_TAIL_LINES = 10
MESSAGE_LINE_CHARS = 300


def _clip(text: str) -> str:
    """A message's first line and its last MESSAGE_TAIL_LINES lines, each cut; "..." for lines left out."""
    first, *rest = text.strip().splitlines() or [""]
    kept = [line[:MESSAGE_LINE_CHARS] for line in rest[-MESSAGE_TAIL_LINES:]]
    return "\n".join([first[:MESSAGE_HEAD_CHARS], *(["..."] if len(rest) > len(kept) else []), *kept])


def _message(res: Mapping[str, Any]) -> str:
    """The task's message, with the last line of its stderr when it has one ("non-zero return code")."""
    parts = [_clip(str(res[k])) for k in ("msg", "reason") if res.get(k)]
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


@contextmanager
def memory_file(text: str) -> Iterator[str | None]:
    """A path that reads back `text` while the block runs (None for an empty text).

    The file is a memfd of this process: it lives in memory only, never in a file system on a disk, and
    is gone when the block ends or the process dies. Its path, /proc/<pid>/fd/<n>, opens for processes
    of the same user (ansible-playbook and its workers, children of this process), not for others.
    """
    if not text:
        yield None
        return
    if not hasattr(os, "memfd_create"):
        raise UserError(
            "HF_TOKEN is set, but this controller has no memfd (Linux) to hand it to ansible without "
            "writing it to a file: put the token in the inventory with ansible-vault as vllm_hf_token "
            "and unset HF_TOKEN"
        )
    fd = os.memfd_create("kvoffload-hf-token", os.MFD_CLOEXEC)
    try:
        with open(fd, "wb", closefd=False) as handle:
            handle.write(text.encode())
        yield f"/proc/{os.getpid()}/fd/{fd}"
    finally:
        os.close(fd)


@contextmanager
def extravars_file(variables: Mapping[str, Any]) -> Iterator[Path]:
    """A JSON file holding `variables` while the block runs: mode 0600 in a fresh folder of mode 0700
    (only this user and root read it), removed with its folder when the block ends."""
    folder = Path(tempfile.mkdtemp(prefix="kvoffload-extravars-"))  # mkdtemp: mode 0700
    try:
        path = folder / "extravars.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, json.dumps(variables).encode())
        finally:
            os.close(fd)
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _refuse_secrets(extravars: Mapping[str, Any], envvars: Mapping[str, str]) -> None:
    names = sorted(k for k in extravars if SECRET_NAME.search(k))
    names += sorted(k for k in envvars if k in HF_TOKEN_VARS)
    if names:
        raise ValueError(
            f"refusing to pass {', '.join(names)} to a playbook as an extra or environment variable: "
            "ansible-runner records the environment in artifacts/<ident>/command and variable values in "
            "its job events, and the extra variables file is written to the controller's disk; a "
            "secret comes from the inventory (ansible-vault) or, for the Hugging Face token, the "
            "controller's HF_TOKEN (see kvoffload/playbook/runner.py)"
        )


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
        _refuse_secrets({}, self.envvars)

    def run(
        self,
        playbook: str,
        extravars: Mapping[str, Any] | None = None,
        *,
        limit: str | None = None,
        tags: Sequence[str] = (),
        skip_tags: Sequence[str] = (),
        check: bool = False,
        ident: str | None = None,
        cancel: Callable[[], bool] | None = None,
        on_play: Callable[[str], None] | None = None,
        fact_cache: Path | None = None,
    ) -> PlaybookResult:
        """Run `playbooks/<playbook>`; raise `PlaybookFailed` unless it succeeds, `PlaybookCanceled` on
        `request_stop()` or when `cancel()` turns true. `on_play` is called with each play's name as
        the play starts. `fact_cache`: the folder of Ansible's fact cache (jsonfile), for runs that
        share facts; by default each run has its own, in its artifacts (ansible-runner's)."""
        import ansible_runner  # only this module imports it

        variables = dict(extravars or {})
        _refuse_secrets(variables, {})
        base = ansible_dir()
        path = base / "playbooks" / playbook
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such playbook")
        self.artifacts.mkdir(parents=True, exist_ok=True)
        ident = ident or f"{time.strftime('%Y%m%dT%H%M%S')}-{path.stem}"
        failures: list[TaskFailure] = []
        facts: dict[str, dict[str, Any]] = {}
        plays: list[tuple[str, float]] = []
        unit_states: dict[str, dict[str, Any]] = {}
        start_restarts: dict[str, dict[str, int]] = {}
        software: dict[str, dict[str, Any]] = {}
        l2_trims: list[tuple[str, str, dict[str, Any]]] = []

        def handler(event: dict[str, Any]) -> bool:
            data = event.get("event_data") or {}
            kind = event.get("event")
            if kind == "playbook_on_task_start" and self.on_task is not None:
                self.on_task("", str(data.get("task", "")))
            elif kind == "playbook_on_play_start":
                # events reach the handler as they happen (ansible-runner streams them)
                plays.append((str(data.get("play", "")), round(time.monotonic() - t0, 3)))
                if on_play is not None:
                    on_play(plays[-1][0])
            elif kind == "runner_on_unreachable" or (
                kind == "runner_on_failed" and not data.get("ignore_errors")
            ):
                failures.append(
                    TaskFailure(
                        str(data.get("host")),
                        str(data.get("task")),
                        _message(data.get("res") or {}),
                        unreachable=kind == "runner_on_unreachable",
                        play=str(data.get("play", "")),
                    )
                )
            elif kind == "runner_on_ok":
                res = data.get("res") or {}
                set_facts = res.get("ansible_facts") if isinstance(res, dict) else None
                if isinstance(set_facts, dict) and set_facts.get("kvoffload_host_facts"):
                    facts[str(data.get("host"))] = set_facts["kvoffload_host_facts"]
                trim = set_facts.get("lmcache_server_l2_trim_result") if isinstance(set_facts, dict) else None
                if isinstance(trim, dict):
                    l2_trims.append((str(data.get("play", "")), str(data.get("host")), trim))
                action = str(data.get("resolved_action") or data.get("task_action") or "")
                units = res.get("units") if isinstance(res, dict) else None
                args = (res.get("invocation") or {}).get("module_args") or {} if isinstance(res, dict) else {}
                if (
                    action.rsplit(".", 1)[-1] == UNIT_STATES_MODULE
                    and isinstance(units, dict)
                    and not args.get("stop")
                ):
                    unit_states[str(data.get("host"))] = units
                restarts = res.get("nrestarts") if isinstance(res, dict) else None
                if action.rsplit(".", 1)[-1] == START_UNITS_MODULE and isinstance(restarts, dict):
                    start_restarts.setdefault(str(data.get("host")), {}).update(restarts)
                record = res.get("software") if isinstance(res, dict) else None
                if action.rsplit(".", 1)[-1] == SOFTWARE_MODULE and isinstance(record, dict):
                    software[str(data.get("host"))] = record
            return True  # keep the event in the artifacts

        # --diff with --check: what would change, file by file; tasks that handle a secret set diff: false
        check_args = " --check --diff" if check else ""
        bindir = Path(sys.executable).parent  # the ansible of this environment, whatever PATH says
        env = {
            "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
            "ANSIBLE_CONFIG": str(base / "ansible.cfg"),
            "ANSIBLE_ROLES_PATH": str(base / "roles"),
            "ANSIBLE_NOCOLOR": "1",
            **self.envvars,
            # ansible-runner starts from this process's environment: blank the token there (docstring)
            **dict.fromkeys(HF_TOKEN_VARS, ""),
        }
        t0 = time.monotonic()
        stops_at_start = _STOPS.started()

        def canceled() -> bool:
            return _STOPS.requests != stops_at_start or (cancel is not None and cancel())

        try:
            with (
                memory_file(os.environ.get("HF_TOKEN", "").strip()) as token_file,
                extravars_file(variables) as variables_file,
            ):
                if token_file is not None:
                    env[HF_TOKEN_FILE_VAR] = token_file
                runner = ansible_runner.run(
                    private_data_dir=str(self.artifacts),
                    project_dir=str(base / "playbooks"),
                    playbook=str(path),
                    inventory=str(self.inventory),
                    limit=limit,
                    tags=",".join(tags) if tags else None,
                    skip_tags=",".join(skip_tags) if skip_tags else None,
                    # the extra variables by file, not on the command line (docstring)
                    cmdline=f"-e {shlex.quote('@' + str(variables_file))}{check_args}",
                    envvars=env,
                    ident=ident,
                    quiet=True,
                    suppress_env_files=True,
                    event_handler=handler,
                    cancel_callback=canceled,
                    # an absolute path: ansible-runner joins it to the run's artifacts folder
                    fact_cache=str(fact_cache.resolve()) if fact_cache is not None else None,
                )
        finally:
            _STOPS.ended()
        if runner.status == "canceled":
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
            plays=tuple(plays),
            unit_states=unit_states,
            start_restarts=start_restarts,
            software=software,
            l2_trims=tuple(l2_trims),
        )
        if result.status != "successful" or result.rc != 0:
            raise PlaybookFailed(result)
        return result
