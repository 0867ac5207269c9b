"""Running a campaign: provision once, then per node its cells in order, one thread per node, then the
knee search; resumable.

`CampaignRunner` owns the run: scheduling (kvoffload/orchestrate/campaign/schedule.py), resume, the node
threads,
the client hosts' installs (kvoffload/orchestrate/installs/client_install.py), the knee loop and
campaign.json. Each
cell's lifecycle is one `CellRun` (kvoffload/orchestrate/cell/run.py), on the cell's frozen `CellPlan`
(kvoffload/orchestrate/cell/plan.py), built once per (cell, node) here. Resume: cells whose folder holds
DONE are skipped; any other cell runs again from a fresh folder (the unfinished attempt is kept under
attempts/). Ctrl-C: the current cell is marked interrupted, the lab is torn down, and KeyboardInterrupt
propagates to the CLI (docs/architecture.md section 5).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvoffload.config import Cell, LabConfig
from kvoffload.datasets.digest import dataset_digest
from kvoffload.orchestrate.campaign import knee
from kvoffload.orchestrate.campaign.estimate_inputs import campaign_estimate, measured_phases
from kvoffload.orchestrate.campaign.schedule import NodePlan, schedule
from kvoffload.orchestrate.campaign.status import StatusBoard
from kvoffload.orchestrate.cell.plan import CellPlan
from kvoffload.orchestrate.cell.record import tool_versions
from kvoffload.orchestrate.cell.run import (
    CellDisplay,
    CellOutcome,
    CellRun,
    NodeState,
    Progress,
    signals_deferred,
)
from kvoffload.orchestrate.installs.client_install import ClientInstalls
from kvoffload.orchestrate.installs.wheelhouse import DEFAULT_HOSTS_PYTHON, Wheels, build_wheels
from kvoffload.orchestrate.playbooks_api import (
    INSTALL_TAG,
    PREFLIGHT,
    PROVISION,
    REPLAY,
    TEARDOWN,
    UNQUIET_TAG,
)
from kvoffload.orchestrate.results import CampaignResults, write_json_atomic
from kvoffload.playbook import PlaybookFailed, PlaybookResult, PlaybookRunner

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

__all__ = ["CampaignOutcome", "CampaignRunner", "Progress", "host_facts"]


@dataclass
class CampaignOutcome:
    done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    interrupted: str | None = None


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


class _CellDisplay:
    """The cells' display (cell/run.py CellDisplay): each step goes to the CLI's progress and to
    status.json; a lab of several nodes names the node on the terminal."""

    def __init__(self, runner: CampaignRunner) -> None:
        self.runner = runner

    def phase(self, cell: Cell, node: str, index: int, total: int, name: str) -> None:
        label = f" on {node}" if self.runner.lab.multi_node else ""
        self.runner.progress.phase(cell, index, total, name + label)
        self.runner.status.phase(node, cell.id, name)

    def replay(self, node: str, done: int, expected: int) -> None:
        self.runner.progress.replay(done, expected)
        self.runner.status.replay(node, done, expected)

    def live(self, node: str, counters: Mapping[str, float | None], ttft: Mapping[str, float]) -> None:
        self.runner.status.live(node, counters, ttft)

    def cell_done(
        self, cell: Cell, node: str, status: str, error: str | None, seconds: float, shown: str | None
    ) -> None:
        if shown is not None:
            self.runner.progress.cell_done(cell, shown, seconds)
        self.runner.status.cell_done(node, cell.id, status, error, seconds)


class CampaignRunner:
    """One campaign's run on a lab: provision, the nodes' cells (each a `CellRun`), the knee search,
    campaign.json; also the campaign-wide playbooks of `provision`, `teardown` and the doctor's smoke.
    Implements `cell_run.CampaignServices` for its cells."""

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
        self.playbooks = PlaybookRunner(inventory, results.ansible, on_task=lambda _h, t: progress.task(t))
        self.wheels: Wheels | None = None
        self.facts: dict[str, dict[str, Any]] = {}
        # the live view of the run (status.json): every phase the display is told goes there too
        self.status = StatusBoard(
            results.paths.status_json, lab.campaign.name, sample_interval_s=lab.campaign.sample_interval_s
        )
        self.display: CellDisplay = _CellDisplay(self)
        self._lock = threading.Lock()  # the outcome, the cell counter and the timings, shared by the threads
        self._started = 0
        self._nodes: dict[str, NodeState] = {}  # what each node's cells hand on to the next
        self._plans: dict[tuple[str, str], CellPlan] = {}  # (cell id, node) -> the cell's plan there
        self._campaign_timings: dict[str, float] = {}
        # what `plan` estimated for this run's cells and, once they ran, what they measured
        # (kvoffload/orchestrate/campaign/estimate.py; campaign.json `estimate`)
        self._estimate: dict[str, Any] | None = None
        self._dataset: dict[str, Any] | None = None  # campaign.json `dataset`, digested once per run
        self._knee: list[knee.RampLog] = []
        # facts, once a node's install gathered them, serve its later cells (node_facts)
        self._facts_dir = results.ansible / "facts"
        self._provision = True  # run(): provision before the first cell
        self._prepared = False  # _prepare ran (once per runner)
        self._stop = threading.Event()  # a stop asked: every node stops at its next phase
        # the client hosts' installs that run beside the nodes' first deploys (_prepare)
        self._clients = ClientInstalls(self._install_client)
        self._client_extravars: Mapping[str, Any] | None = None

    # -- campaign level -------------------------------------------------------------------------
    def write_campaign_json(self) -> None:
        from kvoffload.engines.lab import engine_sets_record

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
                "dataset": self._dataset_record(),
                "versions": tool_versions(),
                # the engine set each node installs (kvoffload/engines): name, build, pins, source
                "engine_sets": engine_sets_record(self.lab),
                "nodes": [n.name for n in self.lab.nodes],
                "timings": self._campaign_timings,
                "knee_search": [log.to_json() for log in self._knee] or None,
                # issue 42: the prices the report's decision uses (the campaign's, or the inventory's
                # kvoffload_prices: config/slo.py lab_prices) and where they are written
                "prices": None if self.lab.prices is None else self.lab.prices.model_dump(mode="json"),
                "prices_source": self.lab.prices_source,
                "estimate": self._estimate,
                "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
        )

    def _dataset_record(self) -> dict[str, Any]:
        """campaign.json `dataset` (docs/contracts.md): the dataset's code, its absolute path on this
        controller as this run resolved it (a relative `dataset.path` is relative to the campaign file,
        which the report's working directory knows nothing of) and its digest, to find it again."""
        if self._dataset is None:
            path = self.lab.dataset_path.resolve()
            try:
                digest = dataset_digest(path)
            except OSError as exc:
                log.warning("dataset %s: no digest (%s); the report finds it by its path only", path, exc)
                digest = None
            self._dataset = {"code": self.lab.campaign.dataset.code, "path": str(path), "digest": digest}
        return self._dataset

    def plan_of(self, cell: Cell, node: str) -> CellPlan:
        """The cell's plan on `node`, built once (the wheels first, when none are built yet)."""
        key = (cell.id, node)
        plan = self._plans.get(key)
        if plan is None:
            built = CellPlan.build(self.lab, cell, self.results.cell_paths(cell), self._wheels(), node)
            with self._lock:
                plan = self._plans.setdefault(key, built)
        return plan

    def _base_extravars(self) -> dict[str, Any]:
        """The first cell's extravars for the campaign-wide playbooks (preflight, provision, the final
        teardown), which cover every node: without `kvoffload_node`, which limits preflight to one node's
        hosts (a plain run of one cell, roles/preflight/tasks/cell_hosts.yml)."""
        extravars = dict(self.plan_of(self.lab.cells[0], self.lab.nodes[0].name).extravars)
        del extravars["kvoffload_node"]
        return extravars

    def _wheels(self) -> Wheels:
        if self.wheels is None:
            self.prepare_wheelhouse()
        assert self.wheels is not None
        return self.wheels

    def prepare_wheelhouse(self) -> None:
        """This package's wheel, and (offline) the wheelhouse of everything the hosts install, for the
        Python the hosts report unless `hosts_python` was given (orchestrate/installs/host_python.py)."""
        if self.offline and self.hosts_python is None:
            from kvoffload.orchestrate.installs.host_python import learn_hosts_python

            self._campaign_phase("hosts' python")
            self.hosts_python = learn_hosts_python(self.playbooks)
        self._campaign_phase("wheelhouse")
        from kvoffload.engines.lab import wheel_sets

        self.wheels = build_wheels(
            self.wheel_cache,
            offline=self.offline,
            engine_sets=wheel_sets(self.lab),
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
        self.playbooks.run(PREFLIGHT, extravars, check=check, ident=self.ident("preflight"))
        self._campaign_phase("provision")
        result = self.playbooks.run(PROVISION, extravars, check=check, ident=self.ident("provision"))
        self.facts = host_facts(result.artifacts / "fact_cache")
        self._campaign_timings["provision"] = result.duration_s
        if gate and not check:
            self.doctor_gate()
        return result

    def doctor_gate(self) -> None:
        """The doctor's cheap checks on every host, once provisioned (the L2 mount exists then): a host
        that fails one stops the run before its first cell, naming the fix (orchestrate/checks/doctor.py)."""
        from kvoffload.orchestrate.checks.doctor import RUN_DOCTOR_DIR, cheap_gate

        self._campaign_phase("doctor")
        hosts_python = self.hosts_python if self.offline else None
        cheap_gate(self.lab, self.playbooks, self.results.root / RUN_DOCTOR_DIR, hosts_python=hosts_python)

    def teardown(self) -> PlaybookResult:
        return self.playbooks.run(TEARDOWN, self._base_extravars(), ident=self.ident("teardown"))

    def plan(self, cells: Sequence[Cell]) -> list[NodePlan]:
        """Which node runs which cells (kvoffload/orchestrate/campaign/schedule.py); nodes without work
        drop out."""
        plans = schedule(
            cells, [n.name for n in self.lab.nodes], self.expected_requests, self.lab.campaign.repeat_order
        )
        return [p for p in plans if p.cells]

    def run(self, only: Sequence[str] | None = None, provision: bool = True) -> CampaignOutcome:
        outcome = CampaignOutcome()
        self.write_campaign_json()
        todo: list[Cell] = []
        for cell in (c for c in self.lab.cells if not only or c.id in only):
            if self.results.is_done(cell):
                outcome.skipped.append(cell.id)
            else:
                todo.append(cell)
        knee_search = self.lab.campaign.knee_spec() is not None and not only
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
            self._run_cells(todo, outcome)
            if knee_search:
                k0 = time.monotonic()  # apart from the cells: the estimate's total leaves it out
                self._knee_search(len(todo), outcome)
                self._campaign_timings["knee-search"] = round(time.monotonic() - k0, 3)
            ended = "failed" if outcome.failed else "done"
        except KeyboardInterrupt:
            raise
        except BaseException:
            ended = "failed"
            raise
        finally:
            self._end_run(ended, t0)
        return outcome

    def _run_cells(self, todo: Sequence[Cell], outcome: CampaignOutcome) -> None:
        """The campaign's cells still to run: the nodes at once, each its own cells in order."""
        if not todo:
            self.status.start({}, outcome.skipped)  # the knee search's steps join as they start
            return
        plans = self.plan(todo)
        self._estimate = self._estimate_of(todo)
        # the plan's estimate goes with the queues, so the live page has an ETA before any cell ends
        self.status.start({p.node: [c.id for c in p.cells] for p in plans}, outcome.skipped, self._estimate)
        self._prepare(todo[0], len(todo), [p.node for p in plans])
        if len(plans) > 1:
            self._run_nodes(plans, len(todo), outcome)
            return
        try:
            self._run_node(plans[0], len(todo), outcome)
        except KeyboardInterrupt:
            self._stop.set()  # the client hosts' installs, if they still run, stop too
            raise

    def _end_run(self, ended: str, t0: float) -> None:
        """status.json's final state, the client hosts' installs over, the run's timings in campaign.json."""
        self.status.finish(ended)
        with signals_deferred():
            self._clients.join()  # canceled with the cells when the run stops
        beside = self._clients.seconds()  # the installs that ran beside the nodes' deploys
        if beside is not None:
            self._campaign_timings["install-client"] = max(
                self._campaign_timings.get("install-client", 0.0), beside
            )
        self._campaign_timings["cells"] = round(time.monotonic() - t0, 3)
        if self._estimate is not None:
            self._estimate["measured"] = measured_phases(
                self.results.paths,
                list(self._estimate["cells"]),
                self._campaign_timings["cells"],
                self._campaign_timings.get("knee-search"),
                [step["cell_id"] for ramp in self._knee for step in ramp.steps if step["cell_id"]],
            )
        self.write_campaign_json()
        shutil.rmtree(self._facts_dir, ignore_errors=True)

    def _estimate_of(self, todo: Sequence[Cell]) -> dict[str, Any] | None:
        """What `plan` estimates for `todo` (None, logged, when it cannot: a guide never stops a run)."""
        try:
            return campaign_estimate(self.lab, todo, self.results.root, self.expected_requests).to_json()
        except Exception as exc:
            log.warning("no estimate of the run's time: %s: %s", type(exc).__name__, exc)
            return None

    def _prepare(self, cell: Cell, total: int, nodes: Sequence[str]) -> None:
        """Before the run's first cell: provision. Before the cells of `nodes` (the run's, or a knee
        ramp's node): the software and dataset of their client hosts that this run has not installed
        yet (the node threads' replays then skip those). A resumed run's knee search may ramp on a node
        none of the run's cells ran on, whose client host this run would otherwise never install.

        A client host's install does not hold up the nodes (kvoffload/orchestrate/installs/client_install.py):
        it starts once every node of `nodes` has installed its own software (so that the pip runs
        never share a host's cores) and runs while the nodes start their first engines (a model load:
        minutes on GPUs). Every replay waits for its own client host's install (`client_ready`). A
        client host that is also one of the nodes' hosts installs first, alone."""
        if not self._prepared:
            self._prepared = True
            if self._provision:
                self.provision()
            self._client_extravars = self.plan_of(cell, self.lab.nodes[0].name).extravars
        assignment = self.lab.client_assignment
        clients = list(dict.fromkeys(assignment[n] for n in nodes)) if nodes else [self.lab.clients[0].name]
        node_hosts = {h for n in nodes for h in self.lab.node_hosts(self.lab.node(n))}
        for client in (c for c in clients if not self._clients.covers(c)):
            if client in node_hosts or not nodes:
                self._campaign_phase("install (client)" + (f" {client}" if len(clients) > 1 else ""), total)
                t0 = time.monotonic()
                self._clients.run_now(client)
                self._campaign_timings["install-client"] = max(
                    self._campaign_timings.get("install-client", 0.0), round(time.monotonic() - t0, 3)
                )
            else:
                self._clients.add(client, nodes)

    def _install_client(self, client: str) -> None:
        """One client host's install (replay.yml, tag install), limited to it where the lab has more."""
        assert self._client_extravars is not None
        several = len(self.lab.clients) > 1
        self.playbooks.run(
            REPLAY,
            self._client_extravars,
            tags=[INSTALL_TAG],
            limit=client if several else None,
            ident=self.ident(f"install-client-{client}" if several else "install-client"),
            cancel=self.stopping,
        )

    def client_pending(self, node: str) -> bool:
        """Whether `node`'s client host still installs."""
        return self._clients.pending(self.lab.client_of(self.lab.node(node)).name)

    def client_ready(self, node: str) -> None:
        """Before a replay on `node`: wait for its client host's install; a failed one fails the cell."""
        self._clients.ready(self.lab.client_of(self.lab.node(node)).name, self.stopping)

    def node_installed(self, node: str) -> None:
        """`node`'s install is over (or will not happen): client installs that waited for it last start."""
        self._clients.node_installed(node)

    def _knee_search(self, total: int, outcome: CampaignOutcome) -> None:
        """The campaign's knee search (kvoffload/orchestrate/campaign/knee.py): each ramp on the node that ran
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
        state = self._node_state(node)
        state.new_chain()
        last: Cell | None = None
        try:
            for seed in seeds:
                ramp = knee.RampLog(seed.tier, seed.num_rounds, seed.isl, str(seed.osl), node=node)
                self._knee.append(ramp)
                pooled = knee.nodes_alike(self.facts, [n.name for n in self.lab.nodes])
                for cell in knee.walk(self.lab.campaign, seed, self._summary, ramp, node=node, pooled=pooled):
                    if self.results.is_done(cell):
                        outcome.skipped.append(cell.id)
                        continue
                    self._knee_step(cell, state, total, outcome)
                    last = cell
        finally:
            if last is not None:
                self._end_knee_node(state, last)

    def _summary(self) -> pd.DataFrame:
        """The campaign's summary table as the knee search reads it (after every step)."""
        return knee.campaign_summary(self.results.root)

    def _knee_step(self, cell: Cell, state: NodeState, total: int, outcome: CampaignOutcome) -> None:
        """One step of a ramp: keep the engines (the ramp may go on at this tier); the node's first
        step installs its software and quiets its disk jobs again (its last cell gave them back)."""
        first = state.previous is None
        # provision in a resumed run whose campaign cells were all done; this node's client host,
        # unless this run installed it for its cells
        self._prepare(cell, total, [state.name])
        index = self._next_index()
        result = self.run_cell(
            cell, index, max(total, index), state, following=cell, install=cell if first else None
        )
        self.node_installed(state.name)  # the client's install waits for no one now
        state.previous = cell
        self._tally(cell, result, outcome)

    def _end_knee_node(self, state: NodeState, last: Cell) -> None:
        """After a node's ramps: its engines down, else (the last step's teardown kept them masked) its
        periodic disk jobs back."""
        if state.deployed is None:
            self._unquiet(state.name, last)
            return
        t0 = time.monotonic()
        self.playbooks.run(
            TEARDOWN,
            self.plan_of(last, state.name).extravars,
            limit=self.limit(state.name, client=False),
            ident=self.ident("teardown-knee"),
        )
        self._campaign_timings["teardown-knee-search"] = round(time.monotonic() - t0, 3)

    def _run_nodes(self, plans: Sequence[NodePlan], total: int, outcome: CampaignOutcome) -> None:
        """One thread per node. A node that fails a cell goes on with its next one; Ctrl-C stops every
        node (each tears its cell down) and then propagates."""
        errors: dict[str, BaseException] = {}

        def work(plan: NodePlan) -> None:
            try:
                self._run_node(plan, total, outcome)
            except BaseException as exc:  # handed to the main thread below
                errors[plan.node] = exc
                if isinstance(exc, KeyboardInterrupt):
                    # a stop canceled this node's playbook: the other nodes stop at their next phase
                    # (their running playbooks were canceled by the same request)
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
            with signals_deferred():
                for thread in threads:
                    thread.join()
            raise
        _raise_node_errors(errors)

    def stopping(self) -> bool:
        return self._stop.is_set()

    def _run_node(self, plan: NodePlan, total: int, outcome: CampaignOutcome) -> None:
        """The node's cells in order, keeping the engines up between cells that share them."""
        state = self._node_state(plan.node)
        state.new_chain()
        # The node installs once what its cells need: with an offload cell among them, the cache server.
        install = next((c for c in plan.cells if c.tier != "gpu"), plan.cells[0])
        for i, cell in enumerate(plan.cells):
            following = plan.cells[i + 1] if i + 1 < len(plan.cells) else None
            index = self._next_index()
            try:
                result = self.run_cell(
                    cell, index, total, state, following=following, install=install if i == 0 else None
                )
            except KeyboardInterrupt:
                with self._lock:
                    outcome.interrupted = outcome.interrupted or cell.id
                raise
            finally:
                self.node_installed(plan.node)  # also when its install failed or never began
            self._tally(cell, result, outcome)
            state.previous = cell
        self._unquiet(plan.node, extravars_of=plan.cells[-1])

    def _node_state(self, node: str) -> NodeState:
        with self._lock:
            return self._nodes.setdefault(node, NodeState(node))

    def _next_index(self) -> int:
        with self._lock:
            self._started += 1
            return self._started

    def _tally(self, cell: Cell, result: CellOutcome, outcome: CampaignOutcome) -> None:
        with self._lock:
            if result.done:
                outcome.done.append(cell.id)
            else:
                outcome.failed[cell.id] = result.text

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
                self.plan_of(extravars_of, node).extravars,
                limit=self.limit(node, client=False),  # as the install masked them
                tags=[UNQUIET_TAG],
                ident=self.ident(f"unquiet-{node}"),
            )
        except PlaybookFailed as exc:
            log.error("giving %s its periodic disk jobs back failed: %s", node, exc)
        self.status.node_phase(node, "finished")
        with self._lock:
            self._campaign_timings[f"unquiet-{node}"] = round(time.monotonic() - t0, 3)

    def ident(self, phase: str, cell: Cell | None = None) -> str:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        return f"{stamp}-{cell.id}-{phase}" if cell else f"{stamp}-{phase}"

    # -- what a cell takes from its campaign (cell_run.CampaignServices) ---------------------------
    def limit(self, node: str, *, client: bool) -> str | None:
        """`--limit` for a cell's playbooks: None in a lab of one node and one client host (every group
        is this run's); else the node's hosts, and its client host when the playbook replays or
        collects there."""
        if not self.lab.multi_node and len(self.lab.clients) == 1:
            return None
        host = self.lab.node(node)
        hosts = self.lab.node_hosts(host)
        return ",".join([*hosts, self.lab.client_of(host).name] if client else hosts)

    def node_facts(self, node: str) -> Path:
        """The fact cache (jsonfile) of the node's playbooks in this run: its install empties it and
        gathers the node's facts afresh, after what provision mounted and wrote (the L2 file system, the
        GPU's local facts); with `gathering = smart` (ansible.cfg) its cells' deploys then gather none,
        a round trip less per cell. The facts the roles check (addresses, mounts, GPU local facts) do
        not change during a run once a node is provisioned. Removed as the run ends."""
        return self._facts_dir / node

    def play(
        self,
        playbook: str,
        extravars: Mapping[str, Any],
        *,
        node: str,
        cell: Cell,
        phase: str,
        client: bool = False,
        cancel: bool = True,
        facts: bool = True,
        fresh_facts: bool = False,
        **options: Any,
    ) -> PlaybookResult:
        """A cell's playbook on its node (cell/run.py CampaignServices.play): limited to the node's
        hosts (`limit`), named for the cell and phase, with the node's fact cache (`node_facts`)."""
        fact_cache: Path | None = None
        if facts:
            fact_cache = self.node_facts(node)
            if fresh_facts:  # empty, and the owner's alone (the facts name the hosts' environment)
                shutil.rmtree(fact_cache, ignore_errors=True)
                fact_cache.mkdir(parents=True, mode=0o700)
        return self.playbooks.run(
            playbook,
            extravars,
            limit=self.limit(node, client=client),
            ident=self.ident(phase, cell),
            cancel=self.stopping if cancel else None,
            fact_cache=fact_cache,
            **options,
        )

    def run_cell(
        self,
        cell: Cell,
        index: int,
        total: int,
        state: NodeState,
        *,
        following: Cell | None = None,
        install: Cell | None = None,
    ) -> CellOutcome:
        """Run one cell to DONE on the node of `state` (kvoffload/orchestrate/cell/run.py), and hand on
        to the node's next cell what it left running: the engine key (None after a teardown) and the
        unit states to judge the next cell's restart counts against. Ctrl-C tears down and re-raises."""
        plan = self.plan_of(cell, state.name)
        run = CellRun(self, plan, state, index=index, total=total, following=following, install=install)
        result = run.run()
        state.deployed, state.baseline = result.engines, dict(result.units)
        return result


def _raise_node_errors(errors: Mapping[str, BaseException]) -> None:
    """A node thread's interrupt, else its first error, raised in the main thread."""
    interrupts = [e for e in errors.values() if isinstance(e, KeyboardInterrupt)]
    if interrupts:
        raise interrupts[0]
    if errors:
        node, exc = next(iter(errors.items()))
        raise RuntimeError(f"node {node}: {exc}") from exc
