"""Running a campaign: provision once, then each cell deploy -> cold-start check -> replay (with the
sampler and before/after snapshots, on the client host) -> collect -> teardown, resumable.

Resume: cells whose folder holds DONE are skipped; any other cell runs again from a fresh folder (the
unfinished attempt is kept under attempts/). Ctrl-C: the current cell is marked interrupted, the lab is
torn down, and KeyboardInterrupt propagates to the CLI. Phase timings, host facts, versions (the
controller's tools), software (what ran on each lab host, from the collect role), targets and unit
restart counts go to cell.json (docs/architecture.md section 9).
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import kvoffload
from kvoffload.atomic import write_text_atomic
from kvoffload.config import Cell, LabConfig
from kvoffload.contracts.cell import CELL_SCHEMA, cell_json_text
from kvoffload.contracts.layout import CellPaths
from kvoffload.orchestrate import knee
from kvoffload.orchestrate.coldstart import CacheReset, Endpoints, ResetFailed
from kvoffload.orchestrate.deployment import (
    cell_extravars,
    cell_units,
    deployment,
    engine_key,
    l2_device,
    replay_command,
    target_hosts,
)
from kvoffload.orchestrate.estimate_inputs import campaign_estimate, measured_phases
from kvoffload.orchestrate.faults import Fault, TargetWatch, fault_effects, unit_faults
from kvoffload.orchestrate.playbooks_api import (
    BETWEEN_CELLS_SKIP_TAGS,
    CELL_SKIP_TAGS,
    CLEAR_L2_NEXT_VAR,
    CLEAR_L2_PLAY,
    CLEAR_L2_VAR,
    COLLECT_PLAY,
    COLLECT_SOFTWARE_TAG,
    DEPLOY,
    INSTALL_TAG,
    PREFLIGHT,
    PROVISION,
    REPLAY,
    TEARDOWN,
    TEARDOWN_AFTER_VAR,
    TEARDOWN_PLAY,
    UNQUIET_TAG,
    ident_of,
)
from kvoffload.orchestrate.probe import ReplayWatcher, check_cold
from kvoffload.orchestrate.results import CampaignResults, write_json_atomic
from kvoffload.orchestrate.schedule import NodePlan, schedule
from kvoffload.orchestrate.status import StatusBoard
from kvoffload.orchestrate.wheelhouse import DEFAULT_HOSTS_PYTHON, Wheels, build_wheels
from kvoffload.playbook import PlaybookFailed, PlaybookResult, PlaybookRunner, ansible_dir
from kvoffload.profiles.resolve import caddy_profile
from kvoffload.replay.command import WARMUP_REQUESTS

log = logging.getLogger(__name__)


class Progress(Protocol):
    """What the orchestrator tells the display (the CLI implements it)."""

    def phase(self, cell: Cell | None, index: int, total: int, phase: str) -> None: ...

    def task(self, name: str) -> None: ...

    def replay(self, done: int, expected: int) -> None: ...

    def cell_done(self, cell: Cell, status: str, seconds: float) -> None: ...


@dataclass
class CampaignOutcome:
    done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    interrupted: str | None = None


def _git_sha() -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(ansible_dir()), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def tool_versions() -> dict[str, str | None]:
    from importlib import metadata

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "kvoffload-lab": kvoffload.__version__,
        "git_sha": _git_sha(),
        "python": platform.python_version(),
        "ansible-core": version("ansible-core"),
        "ansible-runner": version("ansible-runner"),
    }


def host_facts(fact_cache: Path) -> dict[str, dict[str, Any]]:
    """CPU, RAM, OS, Python, the NUMA layout and local facts (GPUs and NVMe devices with their NUMA node,
    written by the roles) per host, from ansible's fact cache."""
    out: dict[str, dict[str, Any]] = {}
    if not fact_cache.is_dir():
        return out
    for path in sorted(fact_cache.iterdir()):
        try:
            facts = json.loads(path.read_text())
            # ansible-core 2.19 wraps the facts as a JSON string and names the file s<version>_<host>
            if isinstance(facts.get("__payload__"), str):
                facts = json.loads(facts["__payload__"])
        except (OSError, json.JSONDecodeError, AttributeError):
            continue
        host = re.sub(r"^s\d+_", "", path.name)
        local = facts.get("ansible_local") or {}
        processor = facts.get("ansible_processor") or []
        out[host] = {
            "cpu": processor[2] if len(processor) > 2 else None,
            "vcpus": facts.get("ansible_processor_vcpus"),
            "ram_gib": round(facts["ansible_memtotal_mb"] / 1024, 1)
            if facts.get("ansible_memtotal_mb")
            else None,
            "os": " ".join(
                str(facts.get(k, "")) for k in ("ansible_distribution", "ansible_distribution_version")
            ),
            "kernel": facts.get("ansible_kernel"),
            "python": facts.get("ansible_python_version"),
            # each GPU and NVMe device carries its NUMA node (null: the firmware does not say)
            "numa_nodes": ((local.get("kvoffload_gpu") or {}).get("numa_nodes")) or [],
            "gpus": ((local.get("kvoffload_gpu") or {}).get("devices")) or [],
            "nvme": ((local.get("kvoffload_nvme") or {}).get("devices")) or [],
            "local": local,
        }
    return out


def _unit_states(cell_dir: Path) -> dict[str, Any]:
    """`<host>--<unit>` -> the unit's collected state, from the collect role's `units/<host>.json`
    (`{host, units: {unit: {property: value}}}`)."""
    units: dict[str, Any] = {}
    for path in sorted(CellPaths(cell_dir).units_dir.glob("*.json")):
        try:
            data = json.loads(path.read_text())
            for unit, state in data["units"].items():
                units[f"{data['host']}--{unit}"] = {**state, "host": data["host"]}
        except (OSError, json.JSONDecodeError, KeyError, AttributeError, TypeError):
            units[path.stem] = {"error": f"unreadable {path.name}"}
    return units


def _copy_tree(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)


def host_software(folder: Path) -> dict[str, Any]:
    """host -> the collect role's `software/<host>.json` (groups, packages, python, gpu), for cell.json.

    Empty when the folder is missing (collect did not run); an unreadable file maps to {"error": ...}.
    """
    software: dict[str, Any] = {}
    if not folder.is_dir():
        return software
    for path in sorted(folder.glob("*.json")):
        try:
            software[path.stem] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            software[path.stem] = {"error": f"unreadable {path.name}"}
    return software


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Let teardown finish even if Ctrl-C is pressed again or SIGTERM arrives. Signal handlers belong
    to the main thread: a node thread's teardown relies on the main thread deferring them (it does,
    while it waits for the node threads after an interrupt)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class CampaignRunner:
    def __init__(
        self,
        lab: LabConfig,
        inventory: Path,
        results: CampaignResults,
        progress: Progress,
        wheel_cache: Path,
        expected_requests: Callable[[Cell], int] | None = None,
        probe_payload: Callable[[Cell], dict[str, Any] | None] | None = None,
        *,
        offline: bool = True,
        hosts_python: str | None = None,
    ) -> None:
        self.lab = lab
        self.results = results
        self.progress = progress
        self.wheel_cache = wheel_cache
        self.offline = offline
        # the Python the wheelhouse is built for; None: learned from the hosts when it is built
        self.hosts_python = hosts_python
        self.expected_requests = expected_requests
        self.probe_payload = probe_payload
        self._lock = threading.Lock()  # the outcome and the cell counter, shared by the node threads
        self._started = 0
        self._last_key: dict[str, str] = {}  # node -> engine key of its latest cell
        # node -> a cell of this run whose collect read the node's (and the client's) software: software
        # changes only in a node's install phase, once per run, so later cells copy that record
        self._software_from: dict[str, Cell] = {}
        # node -> the last fstrim of its L2 file system (after a wipe), which its next cell records
        self._l2_trims: dict[str, dict[str, Any]] = {}
        self._campaign_timings: dict[str, float] = {}
        # what `plan` estimated for this run's cells and, once they ran, what they measured
        # (kvoffload/orchestrate/estimate.py; campaign.json `estimate`)
        self._estimate: dict[str, Any] | None = None
        self._knee: list[knee.RampLog] = []
        # facts, once a node's install gathered them, serve its later cells (_node_facts)
        self._facts_dir = results.ansible / "facts"
        self.playbooks = PlaybookRunner(inventory, results.ansible, on_task=lambda _h, t: progress.task(t))
        self.wheels: Wheels | None = None
        self.facts: dict[str, dict[str, Any]] = {}
        # the live view of the run (status.json): every phase the display is told goes there too
        self.status = StatusBoard(
            results.paths.status_json, lab.campaign.name, sample_interval_s=lab.campaign.sample_interval_s
        )

    # -- campaign level -------------------------------------------------------------------------
    def write_campaign_json(self) -> None:
        inv = Path(self.lab.inventory.file)
        write_json_atomic(
            self.results.paths.campaign_json,
            {
                "schema": 1,
                "name": self.lab.campaign.name,
                "campaign": self.lab.campaign.model_dump(mode="json"),
                "campaign_file": self.lab.campaign_file,
                "inventory": str(inv),
                "inventory_sha256": hashlib.sha256(inv.read_bytes()).hexdigest() if inv.is_file() else None,
                "cells": [{"id": c.id, **c.config} for c in self.lab.cells],
                "versions": tool_versions(),
                "nodes": [n.name for n in self.lab.nodes],
                "timings": self._campaign_timings,
                "knee_search": [log.to_json() for log in self._knee] or None,
                "estimate": self._estimate,
                "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
        )

    def _base_extravars(self) -> dict[str, Any]:
        """The first cell's extravars for the campaign-wide playbooks (preflight, provision, the final
        teardown), which cover every node: without `kvoffload_node`, which limits preflight to one node's
        hosts (a plain run of one cell, roles/preflight/tasks/cell_hosts.yml)."""
        first = self.lab.cells[0]
        extravars = cell_extravars(self.lab, first, self.results.cell_dir(first), self._wheels())
        del extravars["kvoffload_node"]
        return extravars

    def _wheels(self) -> Wheels:
        if self.wheels is None:
            self.prepare_wheelhouse()
        assert self.wheels is not None
        return self.wheels

    def prepare_wheelhouse(self) -> None:
        """This package's wheel, and (offline) the wheelhouse of everything the hosts install, for the
        Python the hosts report unless `hosts_python` was given (orchestrate/host_python.py)."""
        if self.offline and self.hosts_python is None:
            from kvoffload.orchestrate.host_python import learn_hosts_python

            self._campaign_phase("hosts' python")
            self.hosts_python = learn_hosts_python(self.playbooks)
        self._campaign_phase("wheelhouse")
        self.wheels = build_wheels(
            self.wheel_cache,
            offline=self.offline,
            engine_builds=self.lab.engine_builds,
            # without a wheelhouse (not offline) no Python is learned, and build_wheels reads none
            hosts_python=self.hosts_python or DEFAULT_HOSTS_PYTHON,
        )

    def _campaign_phase(self, name: str, total: int | None = None) -> None:
        """A phase of the whole run, before or beside the cells: on the display and in status.json."""
        self.progress.phase(None, 0, len(self.lab.cells) if total is None else total, name)
        self.status.campaign_phase(name)

    def provision(self, check: bool = False, gate: bool = True) -> PlaybookResult:
        """Preflight then provision every host (idempotent: a second run reports no change); then, with
        `gate`, the doctor's cheap checks (the doctor's smoke check has made the full ones already)."""
        extravars = self._base_extravars()
        self._campaign_phase("preflight")
        self.playbooks.run(PREFLIGHT, extravars, check=check, ident=self._ident("preflight"))
        self._campaign_phase("provision")
        result = self.playbooks.run(PROVISION, extravars, check=check, ident=self._ident("provision"))
        self.facts = host_facts(result.artifacts / "fact_cache")
        self._campaign_timings["provision"] = result.duration_s
        if gate and not check:
            self.doctor_gate()
        return result

    def doctor_gate(self) -> None:
        """The doctor's cheap checks on every host, once provisioned (the L2 mount exists then): a host
        that fails one stops the run before its first cell, naming the fix (orchestrate/doctor.py)."""
        from kvoffload.orchestrate.doctor import RUN_DOCTOR_DIR, cheap_gate

        self._campaign_phase("doctor")
        hosts_python = self.hosts_python if self.offline else None
        cheap_gate(self.lab, self.playbooks, self.results.root / RUN_DOCTOR_DIR, hosts_python=hosts_python)

    def teardown(self) -> PlaybookResult:
        return self.playbooks.run(TEARDOWN, self._base_extravars(), ident=self._ident("teardown"))

    def plan(self, cells: Sequence[Cell]) -> list[NodePlan]:
        """Which node runs which cells (kvoffload/orchestrate/schedule.py); nodes without work drop out."""
        plans = schedule(cells, [n.name for n in self.lab.nodes], self.expected_requests)
        return [p for p in plans if p.cells]

    def run(self, only: Sequence[str] | None = None, provision: bool = True) -> CampaignOutcome:
        outcome = CampaignOutcome()
        self.write_campaign_json()
        cells = [c for c in self.lab.cells if not only or c.id in only]
        todo: list[Cell] = []
        for cell in cells:
            if self.results.is_done(cell):
                outcome.skipped.append(cell.id)
            else:
                todo.append(cell)
        knee_search = self.lab.campaign.knee_search is not None and not only
        if not todo and not knee_search:
            self.status.start({}, outcome.skipped)
            self.status.finish("done")
            return outcome
        self._provision = provision
        self._stop = threading.Event()
        t0 = time.monotonic()
        shutil.rmtree(self._facts_dir, ignore_errors=True)  # nothing an earlier run saw of the hosts
        ended = "interrupted"  # what status.json says if the run stops by an exception
        try:
            if todo:
                plans = self.plan(todo)
                self._estimate = self._estimate_of(todo)
                self.status.start({p.node: [c.id for c in p.cells] for p in plans}, outcome.skipped)
                self._prepare(todo[0], len(todo), [p.node for p in plans])
                if len(plans) == 1:
                    try:
                        self._run_node(plans[0], len(todo), outcome)
                    except KeyboardInterrupt:
                        self._stop.set()  # the client's install, if it still runs, stops too
                        raise
                else:
                    self._run_nodes(plans, len(todo), outcome)
            else:
                self.status.start({}, outcome.skipped)  # the knee search's steps join as they start
            if knee_search:
                self._knee_search(len(todo), outcome)
            ended = "failed" if outcome.failed else "done"
        except KeyboardInterrupt:
            raise
        except BaseException:
            ended = "failed"
            raise
        finally:
            self.status.finish(ended)
            if self._client_install is not None:
                with _signals_deferred():
                    self._client_install.join()  # canceled with the cells when the run stops
            self._campaign_timings["cells"] = round(time.monotonic() - t0, 3)
            if self._estimate is not None:
                self._estimate["measured"] = measured_phases(
                    self.results.paths, list(self._estimate["cells"]), self._campaign_timings["cells"]
                )
            self.write_campaign_json()
            shutil.rmtree(self._facts_dir, ignore_errors=True)
        return outcome

    def _estimate_of(self, todo: Sequence[Cell]) -> dict[str, Any] | None:
        """What `plan` estimates for `todo` (None, logged, when it cannot: a guide never stops a run)."""
        try:
            return campaign_estimate(self.lab, todo, self.results.root, self.expected_requests).to_json()
        except Exception as exc:
            log.warning("no estimate of the run's time: %s: %s", type(exc).__name__, exc)
            return None

    _provision = True
    _prepared = False
    # The client's install when it runs beside the nodes' first deploys (_prepare): the thread, the
    # nodes whose installs it still waits for, its extravars, its end and its error.
    _client_install: threading.Thread | None = None
    _client_after: frozenset[str] = frozenset()
    _client_extravars: dict[str, Any] | None = None
    _client_done: threading.Event | None = None
    _client_error: BaseException | None = None

    def _prepare(self, cell: Cell, total: int, nodes: Sequence[str]) -> None:
        """Once per run, before its first cell: provision, then the client's software and dataset (the
        node threads' replays then skip those).

        The client's install does not hold up the nodes: it starts once every node of the run has
        installed its own software (so that the pip runs never share a host's cores) and runs while the
        nodes start their first engines (a model load: minutes on GPUs). Every replay waits for it
        (`_client_ready`). A client host that is also one of the nodes' hosts installs first, alone."""
        if self._prepared:
            return
        self._prepared = True
        if self._provision:
            self.provision()
        extravars = cell_extravars(self.lab, cell, self.results.cell_dir(cell), self._wheels())
        client = self.lab.client_host.name
        if any(client in self.lab.node_hosts(self.lab.node(n)) for n in nodes) or not nodes:
            self._campaign_phase("install (client)", total)
            t0 = time.monotonic()
            self.playbooks.run(REPLAY, extravars, tags=[INSTALL_TAG], ident=self._ident("install-client"))
            self._campaign_timings["install-client"] = round(time.monotonic() - t0, 3)
            return
        self._client_extravars = extravars
        self._client_after = frozenset(nodes)
        self._client_done = threading.Event()

    def _node_installed(self, node: str) -> None:
        """`node`'s install is over (or will not happen): the client's starts after the last one."""
        with self._lock:
            if node not in self._client_after:
                return
            self._client_after -= {node}
            if self._client_after or self._client_install is not None:
                return
            self._client_install = threading.Thread(target=self._install_client, name="install-client")
        self._client_install.start()

    def _install_client(self) -> None:
        assert self._client_extravars is not None and self._client_done is not None
        t0 = time.monotonic()
        try:
            self.playbooks.run(
                REPLAY,
                self._client_extravars,
                tags=[INSTALL_TAG],
                ident=self._ident("install-client"),
                cancel=self._stopping,
            )
        except BaseException as exc:  # handed to the replays waiting for it
            self._client_error = exc
        finally:
            with self._lock:
                self._campaign_timings["install-client"] = round(time.monotonic() - t0, 3)
            self._client_done.set()

    def _client_pending(self) -> bool:
        return self._client_done is not None and not self._client_done.is_set()

    def _client_ready(self) -> None:
        """Before a replay: wait for the client's install; a failed one fails the cell."""
        if self._client_done is None:
            return
        while not self._client_done.wait(0.5):
            if self._stopping():
                raise KeyboardInterrupt
        if isinstance(self._client_error, KeyboardInterrupt):  # PlaybookCanceled too: a stop
            raise KeyboardInterrupt
        if self._client_error is not None:
            raise RuntimeError(f"the client host's install failed: {self._client_error}")

    def _knee_search(self, total: int, outcome: CampaignOutcome) -> None:
        """The campaign's knee search (kvoffload/orchestrate/knee.py): each ramp on the node that ran
        its seed's cells, node after node."""
        self._knee = []
        names = {n.name for n in self.lab.nodes}
        seeds = knee.ramps(self.lab.cells)
        summary = knee.campaign_summary(self.results.root) if seeds else None
        by_node: dict[str, list[Cell]] = {}
        for seed in seeds:
            assert summary is not None
            node = knee.ramp_node(summary, seed, self.lab.nodes[0].name)
            by_node.setdefault(node if node in names else self.lab.nodes[0].name, []).append(seed)
        for node, mine in by_node.items():
            self._knee_node(node, mine, total, outcome)

    def _knee_node(self, node: str, seeds: Sequence[Cell], total: int, outcome: CampaignOutcome) -> None:
        """The ramps of `seeds`, one after the other on `node`, on one set of engines."""
        deployed: str | None = None
        baseline: dict[str, Any] = {}
        previous: Cell | None = None
        last: tuple[Cell, dict[str, Any]] | None = None
        try:
            for seed in seeds:
                log = knee.RampLog(seed.tier, seed.num_rounds, seed.isl, str(seed.osl), node=node)
                self._knee.append(log)
                for cell in knee.walk(
                    self.lab.campaign, seed, lambda: knee.campaign_summary(self.results.root), log, node=node
                ):
                    if self.results.is_done(cell):
                        outcome.skipped.append(cell.id)
                        continue
                    first = previous is None
                    # a resumed run whose campaign cells were all done
                    self._prepare(cell, total, [node])
                    with self._lock:
                        self._started += 1
                        index = self._started
                    status, deployed, baseline = self.run_cell(
                        cell,
                        index,
                        max(total, index),
                        node=node,
                        deployed=deployed,
                        previous=previous,
                        following=cell,  # keep the engines: the ramp may go on at this tier
                        baseline=baseline,
                        # the node's software and quiet disk jobs again: its last cell gave them back
                        install=cell if first else None,
                    )
                    self._node_installed(node)  # the client's install waits for no one now
                    previous = cell
                    last = (
                        cell,
                        cell_extravars(self.lab, cell, self.results.cell_dir(cell), self._wheels(), node),
                    )
                    if status == "done":
                        outcome.done.append(cell.id)
                    else:
                        outcome.failed[cell.id] = status
        finally:
            if deployed is None and last is not None:
                self._unquiet(node, last[0])  # the last step's teardown kept them masked
            if deployed is not None and last is not None:
                t0 = time.monotonic()
                self.playbooks.run(
                    TEARDOWN,
                    last[1],
                    limit=self._limit(node, client=False),
                    ident=self._ident("teardown-knee"),
                )
                self._campaign_timings["teardown-knee-search"] = round(time.monotonic() - t0, 3)

    def _run_nodes(self, plans: Sequence[NodePlan], total: int, outcome: CampaignOutcome) -> None:
        """One thread per node. A node that fails a cell goes on with its next one; Ctrl-C stops every
        node (each tears its cell down) and then propagates."""
        assert self._stop is not None  # run() made it
        errors: dict[str, BaseException] = {}

        def work(plan: NodePlan) -> None:
            try:
                self._run_node(plan, total, outcome)
            except BaseException as exc:  # handed to the main thread below
                errors[plan.node] = exc
                if isinstance(exc, KeyboardInterrupt):
                    # a stop canceled this node's playbook: the other nodes stop at their next phase
                    # (their running playbooks were canceled by the same request)
                    assert self._stop is not None
                    self._stop.set()

        threads = [threading.Thread(target=work, args=(p,), name=f"node-{p.node}") for p in plans]
        for thread in threads:
            thread.start()
        try:
            while any(t.is_alive() for t in threads):
                for thread in threads:
                    thread.join(timeout=0.5)
        except KeyboardInterrupt:
            self._stop.set()
            with _signals_deferred():
                for thread in threads:
                    thread.join()
            raise
        interrupts = [e for e in errors.values() if isinstance(e, KeyboardInterrupt)]
        if interrupts:
            raise interrupts[0]
        if errors:
            node, exc = next(iter(errors.items()))
            raise RuntimeError(f"node {node}: {exc}") from exc

    _stop: threading.Event | None = None

    def _stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    def _run_node(self, plan: NodePlan, total: int, outcome: CampaignOutcome) -> None:
        """The node's cells in order, keeping the engines up between cells that share them."""
        deployed: str | None = None
        baseline: dict[str, Any] = {}
        previous: Cell | None = None
        # The node installs once what its cells need: with an offload cell among them, the cache server.
        install = next((c for c in plan.cells if c.tier != "gpu"), plan.cells[0])
        for i, cell in enumerate(plan.cells):
            following = plan.cells[i + 1] if i + 1 < len(plan.cells) else None
            with self._lock:
                self._started += 1
                index = self._started
            try:
                status, deployed, baseline = self.run_cell(
                    cell,
                    index,
                    total,
                    node=plan.node,
                    deployed=deployed,
                    previous=previous,
                    following=following,
                    baseline=baseline,
                    install=install if i == 0 else None,
                )
            except KeyboardInterrupt:
                with self._lock:
                    outcome.interrupted = outcome.interrupted or cell.id
                raise
            finally:
                self._node_installed(plan.node)  # also when its install failed or never began
            with self._lock:
                if status == "done":
                    outcome.done.append(cell.id)
                else:
                    outcome.failed[cell.id] = status
            previous = cell
        self._unquiet(plan.node, extravars_of=plan.cells[-1])

    def _unquiet(self, node: str, extravars_of: Cell) -> None:
        """After a node's last cell: give its hosts their periodic disk jobs back, which the node's install
        masked for the whole run. Node-level, like the install: campaign.json `timings`
        `unquiet-<node>`. A failure is logged, not raised: the cells' results stand."""
        t0 = time.monotonic()
        self.progress.phase(None, self._started, self._started, f"unquiet on {node}")
        self.status.node_phase(node, "unquiet")
        try:
            self.playbooks.run(
                TEARDOWN,
                cell_extravars(
                    self.lab, extravars_of, self.results.cell_dir(extravars_of), self._wheels(), node
                ),
                limit=self._limit(node, client=False),  # as the install masked them
                tags=[UNQUIET_TAG],
                ident=self._ident(f"unquiet-{node}"),
            )
        except PlaybookFailed as exc:
            log.error("giving %s its periodic disk jobs back failed: %s", node, exc)
        self.status.node_phase(node, "finished")
        with self._lock:
            self._campaign_timings[f"unquiet-{node}"] = round(time.monotonic() - t0, 3)

    def _ident(self, phase: str, cell: Cell | None = None) -> str:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        return f"{stamp}-{cell.id}-{phase}" if cell else f"{stamp}-{phase}"

    # -- one cell -------------------------------------------------------------------------------
    def _limit(self, node: str, *, client: bool) -> str | None:
        """`--limit` for a cell's playbooks: None in a lab of one node (every group is this run's);
        else the node's hosts, and the client when the playbook replays or collects there."""
        if not self.lab.multi_node:
            return None
        hosts = self.lab.node_hosts(self.lab.node(node))
        return ",".join([*hosts, self.lab.client_host.name] if client else hosts)

    def _client_of_another_node(self, node: str) -> bool:
        """Whether the client host deploys cells of a node other than `node` (a lab may put it there)."""
        client = self.lab.client_host.name
        return any(client in self.lab.node_hosts(other) for other in self.lab.nodes if other.name != node)

    def _node_facts(self, node: str) -> Path:
        """The fact cache (jsonfile) of the node's playbooks in this run: its install empties it and
        gathers the node's facts afresh, after what provision mounted and wrote (the L2 file system, the
        GPU's local facts); with `gathering = smart` (ansible.cfg) its cells' deploys then gather none,
        a round trip less per cell. The facts the roles check (addresses, mounts, GPU local facts) do
        not change during a run once a node is provisioned. Removed as the run ends."""
        return self._facts_dir / node

    def _keeps_engines(self, cell: Cell, key: str, following: Cell | None, node: str) -> bool:
        """Whether the engines stay up after `cell`: the next cell on the node runs the same ones."""
        if following is None or self.lab.campaign.cold_start != "reset":
            return False
        nxt = cell_extravars(self.lab, following, self.results.cell_dir(following), self._wheels(), node)
        return engine_key(nxt) == key

    def run_cell(
        self,
        cell: Cell,
        index: int,
        total: int,
        *,
        node: str | None = None,
        deployed: str | None = None,
        previous: Cell | None = None,
        following: Cell | None = None,
        baseline: dict[str, Any] | None = None,
        install: Cell | None = None,
    ) -> tuple[str, str | None, dict[str, Any]]:
        """Run one cell to DONE on `node` (default: the first node).

        `deployed` is the engine key of what already runs on the node (None: nothing of this
        campaign); when it is this cell's, the cell is made cold by a reset instead of a restart.
        Returns the status ("done" or a failure text), the engine key left running (None after a
        teardown) and the unit states to judge the next cell's restart counts against. `install`:
        first install the node's software and model with that cell's variables (the node's first
        cell). Ctrl-C tears down and re-raises.
        """
        node = node or self.lab.nodes[0].name
        was_deployed = deployed
        previous_key = self._last_key.get(node)
        cell_dir = self.results.start_cell(cell)
        extravars = cell_extravars(self.lab, cell, cell_dir, self._wheels(), node)
        key = engine_key(extravars)
        self._last_key[node] = key
        targets = extravars["replay_metrics_targets"]
        record: dict[str, Any] = {
            "schema": CELL_SCHEMA,
            "cell_id": cell.id,
            "campaign": self.lab.campaign.name,
            "status": "running",
            "config": {**cell.config, "id": cell.id},
            "node": node,
            "engine_key": key,
            "profiles": {
                "engine": cell.engine_profile,
                "lmcache": cell.lmcache_profile,
                "caddy": caddy_profile(cell.tier).lb_policy
                if len(deployment(self.lab, cell, node).replicas) >= 2
                else None,
            },
            "hosts": self.facts,
            "targets": target_hosts(self.lab, cell, targets, node),
            "l2_device": l2_device(self.lab, cell, node),
            "replay_argv": replay_command(extravars),
            "timings": {},
            "versions": tool_versions(),
            "software": {},  # filled from the collect role's files once the cell is over
            "started_at": time.time(),
        }
        timings: dict[str, float] = record["timings"]
        _write_cell(cell_dir, record)
        label = f" on {node}" if self.lab.multi_node else ""

        def phase(name: str, fn: Callable[[], Any]) -> Any:
            if self._stopping():
                raise KeyboardInterrupt
            self.progress.phase(cell, index, total, name + label)
            self.status.phase(node, cell.id, name)
            t0 = time.monotonic()
            try:
                return fn()
            finally:
                timings[name] = round(time.monotonic() - t0, 3)
                _write_cell(cell_dir, record)

        def play(
            playbook: str,
            *,
            client: bool = False,
            tags: Sequence[str] = (),
            skip: Sequence[str] = (),
            clear_l2: Sequence[str] = (),
            more: dict[str, Any] | None = None,
            on_play: Callable[[str], None] | None = None,
        ) -> PlaybookResult:
            result = self.playbooks.run(
                playbook,
                {**extravars, **(dict.fromkeys(clear_l2, True) if has_l2 else {}), **(more or {})},
                limit=self._limit(node, client=client),
                tags=tags,
                skip_tags=skip,
                ident=self._ident(ident_of(playbook), cell),
                cancel=self._stopping,
                on_play=on_play,
                fact_cache=self._node_facts(node),
            )
            if playbook != REPLAY:  # replay.yml's trims: after the replay, below
                self._note_l2_trims(node, result)
            return result

        has_l2 = bool(extravars.get("lmcache_server_l2_path"))
        keeping = False  # the next cell keeps these engines (decided before the replay's collect, which
        # then empties L2)
        torn_down = False  # replay.yml ended with the cell's teardown
        t_cell = time.monotonic()
        status = "done"
        watched: list[Fault] = []  # outages the TargetWatch saw during the replay
        kept_units = dict(baseline or {})
        try:
            reset_error = None
            if deployed == key and self.lab.campaign.cold_start == "reset":
                try:
                    record["cold_start"] = phase("reset", lambda: self._reset(cell, targets, previous))
                except (ResetFailed, PlaybookFailed) as exc:
                    reset_error = str(exc)
                    log.warning("cell %s: reset failed, restarting the engines: %s", cell.id, exc)
                    deployed = None
            else:
                kept_units = {}
            if "cold_start" not in record:
                if install is not None:
                    # Once per node and campaign: software and model (cells skip those tags), and
                    # nothing left running by an earlier campaign that a deploy would not restart.
                    # Its deploy gathers the node's facts afresh, after what provision mounted and wrote.
                    _empty_folder(self._node_facts(node))
                    with_all = cell_extravars(
                        self.lab, install, self.results.cell_dir(install), self._wheels(), node
                    )
                    try:
                        phase(
                            "install",
                            lambda: self.playbooks.run(
                                DEPLOY,
                                with_all,
                                limit=self._limit(node, client=False),
                                tags=CELL_SKIP_TAGS,
                                ident=self._ident("install", cell),
                                cancel=self._stopping,
                                fact_cache=self._node_facts(node),
                            ),
                        )
                    finally:
                        self._node_installed(node)  # the client installs while the engines start
                if deployed is not None or reset_error is not None or install is not None:
                    phase("teardown-before", lambda: play(TEARDOWN, skip=BETWEEN_CELLS_SKIP_TAGS))
                kept_units = {}
                phase("deploy", lambda: play(DEPLOY, skip=CELL_SKIP_TAGS))
                deployed = key
                cold = phase("cold-check", lambda: check_cold(targets))
                record["cold_start"] = {
                    "method": "restart",
                    "reason": _restart_reason(
                        cell,
                        self.lab.campaign.cold_start,
                        reset_error,
                        previous,
                        was_deployed is None and previous_key == key,
                    ),
                    "cold": cold.cold,
                    "checked": cold.checked,
                    "problems": list(cold.problems),
                    "unreachable": list(cold.unreachable),
                }
                if not cold.cold:
                    raise RuntimeError("cell did not start cold: " + "; ".join(cold.problems))
            expected = self.expected_requests(cell) if self.expected_requests else 0

            source = self._software_from.get(node)
            # the next cell keeps these engines: its reset finds L2 empty (L1 and the GPU caches it
            # empties itself)
            keeping = self._keeps_engines(cell, key, following, node)
            # no next cell keeps these engines: replay.yml tears them down after its collect, unless
            # the client it replays from is a host of another node, whose units it would stop too
            teardown_after = not keeping and not self._client_of_another_node(node)

            def on_replay(finished: int) -> None:
                done = max(0, finished - WARMUP_REQUESTS)
                self.progress.replay(done, expected)
                self.status.replay(node, done, expected)

            def replay() -> PlaybookResult:
                with (
                    # the replicas also count the replay's warmup requests, sent before the dataset's
                    ReplayWatcher(targets, on_replay, on_live=lambda c, t: self.status.live(node, c, t)),
                    TargetWatch(targets) as watch,
                ):
                    # a teardown's stops are not outages of the cell
                    def on_play(name: str) -> None:
                        if teardown_after and name == TEARDOWN_PLAY:
                            watch.stop()

                    try:
                        # after a reset, L2 holds the KV of the probes: emptied before the replay starts;
                        # the collect at the end empties it for a next cell that keeps these engines
                        reset = record["cold_start"]["method"] == "reset"
                        clear = {CLEAR_L2_VAR: reset, CLEAR_L2_NEXT_VAR: keeping}
                        return play(
                            REPLAY,
                            # the collect's unit states and software come back in the run's events
                            # (_write_collected)
                            more={
                                "collect_units_to_controller": False,
                                "collect_software_to_controller": False,
                                "replay_unpack_on_controller": False,  # _unpack_fetched
                                "replay_keep_attempts": False,  # start_cell kept them
                                TEARDOWN_AFTER_VAR: teardown_after,
                            },
                            client=True,
                            # nothing was installed since that cell's collect (once per node and run);
                            # the periodic disk jobs stay masked until the node's last cell is over
                            skip=[
                                *CELL_SKIP_TAGS,
                                *BETWEEN_CELLS_SKIP_TAGS,
                                *([COLLECT_SOFTWARE_TAG] if source is not None else []),
                            ],
                            clear_l2=[var for var, wanted in clear.items() if wanted],
                            on_play=on_play,
                        )
                    finally:
                        watched.extend(watch.faults())
                        _unpack_fetched(cell_dir)

            if has_l2:  # the trim after the last wipe of L2 before this cell (null: none this run)
                record["l2_trim"] = self._l2_trims.get(node)
            if self._client_pending():
                phase("wait-client", self._client_ready)  # once per run: not this cell's overhead
            else:
                self._client_ready()  # raises when the client's install failed
            try:
                result = phase("replay", replay)
            except PlaybookFailed as exc:
                _split_collect(timings, exc.result, teardown_after)
                _write_collected(cell_dir, exc.result)
                self._note_l2_trims(node, exc.result, record if has_l2 else None)
                if not (teardown_after and exc.result.failed_only_in(TEARDOWN_PLAY)):
                    raise
                # the replay and its collect are whole: the cell stands, and its teardown runs again on
                # its own below (where a second failure becomes the cell's teardown_error)
                log.warning("teardown after cell %s failed, trying again: %s", cell.id, exc)
                result = exc.result
            else:
                _split_collect(timings, result, teardown_after)
                _write_collected(cell_dir, result)
                self._note_l2_trims(node, result, record if has_l2 else None)
                torn_down = teardown_after and result.seconds_from(TEARDOWN_PLAY) is not None
            _write_cell(cell_dir, record)
            if source is not None:
                _copy_tree(self.results.cell_paths(source).software_dir, CellPaths(cell_dir).software_dir)
            else:
                self._software_from[node] = cell
        except KeyboardInterrupt:
            record["status"] = "interrupted"
            with _signals_deferred():
                self._teardown_cell(cell, extravars, record, timings, node, final=True)
                _write_cell(cell_dir, record)
                self.status.cell_done(node, cell.id, "interrupted", None, time.monotonic() - t_cell)
            raise
        except (PlaybookFailed, RuntimeError) as exc:
            status = f"failed: {exc}"
            record["status"] = "failed"
            record["error"] = str(exc)
            log.error("cell %s failed: %s", cell.id, exc)
        keep = status == "done" and keeping
        if keep:
            record["engines_kept"] = True
        elif not torn_down:
            # the node's periodic disk jobs come back once its last cell is over (_run_node), not here
            self._teardown_cell(cell, extravars, record, timings, node, final=False)
        record["units"] = _unit_states(cell_dir)
        record["software"] = host_software(CellPaths(cell_dir).software_dir)
        self._record_faults(record, watched, cell_units(self.lab, cell, node), cell_dir, kept_units)
        record["finished_at"] = time.time()
        timings["total"] = round(time.monotonic() - t_cell, 3)
        if status == "done":
            files = CellPaths(cell_dir)
            missing = [p.name for p in (files.requests, files.sessions) if not p.is_file()]
            if missing:
                status = f"failed: collected results lack {', '.join(missing)}"
                record["status"] = "failed"
                record["error"] = status
            else:
                record["status"] = "done"
        _write_cell(cell_dir, record)
        if status == "done":
            self.results.mark_done(cell)
        self.progress.cell_done(cell, status, timings["total"])
        self.status.cell_done(node, cell.id, record["status"], record.get("error"), timings["total"])
        if keep and status == "done":
            return status, key, record["units"]
        if keep:  # the results were incomplete: do not carry this deployment over
            self._teardown_cell(cell, extravars, record, timings, node, final=False)
            _write_cell(cell_dir, record)
        return status, None, {}

    def _note_l2_trims(self, node: str, result: PlaybookResult, record: dict[str, Any] | None = None) -> None:
        """Keep the run's last fstrim of the node's L2 for its next cell; with `record` (a replay.yml
        run), one in its first play, before the replay, is this cell's own."""
        for play_name, _host, trim in result.l2_trims:
            if record is not None and play_name == CLEAR_L2_PLAY:
                record["l2_trim"] = trim
            else:
                self._l2_trims[node] = trim

    def _reset(self, cell: Cell, targets: list[dict[str, str]], previous: Cell | None) -> dict[str, Any]:
        """Empty the running engines' caches and prove the cell cold (kvoffload/orchestrate/coldstart)."""
        t0 = time.monotonic()
        payload = self.probe_payload(previous) if self.probe_payload and previous else None
        reset = CacheReset(Endpoints.from_targets(targets), external=cell.tier != "gpu")
        outcome = reset.run(payload).to_json()
        outcome["seconds"] = round(time.monotonic() - t0, 3)
        if payload is None:
            outcome["probe_skipped"] = "no prompt of the previous cell to repeat"
        return outcome

    @staticmethod
    def _record_faults(
        record: dict[str, Any],
        watched: list[Fault],
        units: list[str],
        cell_dir: Path,
        baseline: dict[str, Any] | None = None,
    ) -> None:
        """`faults` (each with its reason and time), `valid`, and what the engines did after a fault.

        Unit states exist only when collect ran; a cell that failed before it is judged on what the
        watch saw (and is not done anyway).
        """
        faults = list(watched)
        if record["units"]:
            faults += unit_faults(record["units"], units, baseline or {})
        record["faults"] = [f.to_json() for f in faults]
        record["valid"] = not faults
        if faults:
            record["invalid_reasons"] = [f.reason() for f in faults]
            record["fault_effects"] = fault_effects(CellPaths(cell_dir).requests, faults)
            for f in faults:
                log.warning("cell %s: %s", record["cell_id"], f.reason())

    def _teardown_cell(
        self,
        cell: Cell,
        extravars: dict[str, Any],
        record: dict[str, Any],
        timings: dict[str, float],
        node: str,
        *,
        final: bool,
    ) -> None:
        """Stop the cell's services and wipe L2; `final` (an interrupt: no cell follows) also gives the
        hosts their periodic disk jobs back, which after a node's last cell `_unquiet` does."""
        t0 = time.monotonic()
        try:
            result = self.playbooks.run(
                TEARDOWN,
                extravars,
                limit=self._limit(node, client=False),
                skip_tags=() if final else BETWEEN_CELLS_SKIP_TAGS,
                ident=self._ident("teardown", cell),
            )
        except PlaybookFailed as exc:
            record["teardown_error"] = str(exc)
            log.error("teardown after cell %s failed: %s", cell.id, exc)
            self._note_l2_trims(node, exc.result)
        else:
            self._note_l2_trims(node, result)
        timings["teardown"] = round(time.monotonic() - t0, 3)


def _empty_folder(folder: Path) -> None:
    """`folder`, empty and the owner's alone (the facts name the hosts' environment)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, mode=0o700)


def _split_collect(timings: dict[str, float], result: PlaybookResult, teardown_after: bool) -> None:
    """Time replay.yml's collect plays as the cell's `collect` phase and, with `teardown_after`, its
    teardown plays as the cell's `teardown`, both taken out of its `replay` phase."""
    collect = result.seconds_from(COLLECT_PLAY)
    if collect is None or "replay" not in timings:
        return
    teardown = result.seconds_from(TEARDOWN_PLAY) if teardown_after else None
    if teardown is not None:
        timings["teardown"] = teardown
        collect = round(max(0.0, collect - teardown), 3)
    timings["collect"] = collect
    timings["replay"] = round(max(0.0, timings["replay"] - collect - (teardown or 0.0)), 3)


def _unpack_fetched(cell_dir: Path) -> None:
    """Unpack the cell folder that replay.yml fetched (`replay_unpack_on_controller: false`) into the
    cell's folder, as the role's own tasks would, and remove the tarball; nothing when it fetched none
    (a replay that failed before its fetch)."""
    archive = CellPaths(cell_dir).fetched_archive
    if not archive.is_file():
        return
    # the tarball of our own client: relative members under "."; GNU tar as the role uses it
    argv = ["tar", "--extract", "--gzip", "--no-same-owner", "--no-overwrite-dir", "--file", str(archive)]
    proc = subprocess.run([*argv, "--directory", str(cell_dir)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"unpacking {archive} failed: {proc.stderr.strip()[-400:]}")
    archive.unlink()


def _write_collected(cell_dir: Path, result: PlaybookResult) -> None:
    """`units/<host>.json` and `software/<host>.json` of every host the run's collect read, as the
    collect role writes them when left to (`collect_units_to_controller`,
    `collect_software_to_controller`)."""
    paths = CellPaths(cell_dir)
    for host, units in result.unit_states.items():
        paths.units_dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"host": host, "units": units}, indent=4, sort_keys=True)
        write_text_atomic(paths.units_dir / f"{host}.json", text + "\n")
    for host, software in result.software.items():
        paths.software_dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps(software, indent=4, sort_keys=True)
        write_text_atomic(paths.software_dir / f"{host}.json", text + "\n")


def _write_cell(cell_dir: Path, record: dict[str, Any]) -> None:
    """cell.json, checked against its model (kvoffload/contracts/cell.py) and written atomically."""
    write_text_atomic(CellPaths(cell_dir).cell_json, cell_json_text(record))


def _restart_reason(
    cell: Cell, cold_start: str, reset_error: str | None, previous: Cell | None, torn_down: bool
) -> str:
    """Why a cell's engines were (re)started, for cell.json `cold_start.reason`. `torn_down`: the
    previous cell ran the same engines but ended them (it failed or its results were incomplete)."""
    if reset_error is not None:
        return f"the reset failed: {reset_error}"
    if cold_start == "restart":
        return "cold_start: restart"
    if previous is None:
        return "first cell on the node"
    if torn_down:
        return "the previous cell's engines were torn down"
    return "the engine configuration changed"
