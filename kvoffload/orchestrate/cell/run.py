"""One cell's lifecycle on its node, owned by one object: `CellRun`.

Its phases are methods, in the order docs/architecture.md section 5 tells them: start (a fresh folder
and cell.json `running`), cold (a reset of the running engines, else install (a node's first cell),
teardown-before, deploy and the cold check), replay (replay.yml: the replay, its collect and, when no
next cell keeps the engines, its teardown), then the end (teardown unless the engines are kept, unit
states, software, faults, DONE). It reads the cell's frozen `CellPlan` and the node's `NodeState`,
runs playbooks through the campaign's services (`CampaignServices`, which `CampaignRunner`
implements) and returns a `CellOutcome`. The record it writes is a `CellRecord`
(kvoffload/orchestrate/cell/record.py).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from kvoffload.config import Cell, LabConfig
from kvoffload.orchestrate.cell.coldstart import CacheReset, Endpoints, ResetFailed
from kvoffload.orchestrate.cell.faults import Fault, TargetWatch, unit_faults
from kvoffload.orchestrate.cell.plan import CellPlan
from kvoffload.orchestrate.cell.record import (
    CellRecord,
    CellStatus,
    copy_software,
    host_software,
    tool_versions,
    unit_states,
    unpack_fetched,
    write_collected,
)
from kvoffload.orchestrate.cell.watch import ReplayWatcher, check_cold
from kvoffload.orchestrate.installs.client_install import ClientInstallFailed
from kvoffload.orchestrate.playbooks_api import (
    BETWEEN_CELLS_SKIP_TAGS,
    CELL_SKIP_TAGS,
    CLEAR_L2_NEXT_VAR,
    CLEAR_L2_PLAY,
    CLEAR_L2_VAR,
    COLLECT_PLAY,
    COLLECT_SOFTWARE_TAG,
    DEPLOY,
    JOURNAL_UNITS_VAR,
    REPLAY,
    TEARDOWN,
    TEARDOWN_AFTER_VAR,
    TEARDOWN_PLAY,
    ident_of,
)
from kvoffload.playbook import PlaybookFailed, PlaybookResult
from kvoffload.replay.command import WARMUP_REQUESTS

if TYPE_CHECKING:
    from kvoffload.contracts.layout import CellPaths
    from kvoffload.orchestrate.results import CampaignResults

log = logging.getLogger(__name__)
T = TypeVar("T")


class Progress(Protocol):
    """What the orchestrator tells the display (the CLI implements it)."""

    def phase(self, cell: Cell | None, index: int, total: int, phase: str) -> None: ...

    def task(self, name: str) -> None: ...

    def replay(self, done: int, expected: int) -> None: ...

    def cell_done(self, cell: Cell, status: str, seconds: float) -> None: ...


class CellDisplay(Protocol):
    """Where a cell's progress goes; the campaign shows it on the terminal and in status.json."""

    def phase(self, cell: Cell, node: str, index: int, total: int, name: str) -> None: ...

    def replay(self, node: str, done: int, expected: int) -> None: ...

    def live(self, node: str, counters: Mapping[str, float | None], ttft: Mapping[str, float]) -> None: ...

    def cell_done(
        self, cell: Cell, node: str, status: str, error: str | None, seconds: float, shown: str | None
    ) -> None:
        """`shown`: the outcome's line on the terminal (None: status.json only, as after an interrupt)."""


class CampaignServices(Protocol):
    """What a cell takes from its campaign (`kvoffload.orchestrate.campaign.runner.CampaignRunner`
    implements it): the lab and the results folder, the display, the playbooks run on a node, and the
    node-level hand-offs (its client host's install, its first install, the plans of its cells)."""

    lab: LabConfig
    results: CampaignResults
    display: CellDisplay
    facts: dict[str, dict[str, Any]]
    probe_payload: Callable[[Cell], dict[str, Any] | None] | None
    expected_requests: Callable[[Cell], int] | None

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
        """`playbook` for `cell`'s `phase` on `node`'s hosts (and its client host with `client`), with
        the node's fact cache (`facts`; emptied first with `fresh_facts`); `cancel`: a stop asked ends
        it. `options` go to PlaybookRunner.run (tags, skip_tags, on_play)."""

    def stopping(self) -> bool: ...

    def client_pending(self, node: str) -> bool: ...

    def client_ready(self, node: str) -> None: ...

    def node_installed(self, node: str) -> None: ...

    def plan_of(self, cell: Cell, node: str) -> CellPlan: ...


@dataclass
class NodeState:
    """What a node's cells hand on to the next one; only the node's own thread touches it.

    `deployed`, `baseline` and `previous` are one chain of cells (the node's campaign cells, or one
    knee ramp): the engine key left running, the unit states to judge the next cell's restart counts
    against, and the cell before. The rest lives as long as the run."""

    name: str
    deployed: str | None = None
    baseline: dict[str, Any] = field(default_factory=dict)
    previous: Cell | None = None
    last_key: str | None = None  # the engine key of the node's latest cell, whatever became of it
    # a cell of this run whose collect read the node's (and the client's) software: software changes
    # only in a node's install phase, once per run, so later cells copy that record
    software_from: CellPaths | None = None
    l2_trim: dict[str, Any] | None = None  # the last fstrim of the node's L2 (after a wipe)

    def new_chain(self) -> None:
        self.deployed, self.baseline, self.previous = None, {}, None


@dataclass(frozen=True)
class CellOutcome:
    """How a cell ended: its status, the text the display and CampaignOutcome.failed show ("done" or
    "failed: ..."), and what it left running for the next cell (engine key and unit states)."""

    status: CellStatus
    text: str
    engines: str | None = None
    units: Mapping[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.status is CellStatus.DONE


@contextmanager
def signals_deferred() -> Iterator[None]:
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


class CellFailed(RuntimeError):
    """The cell cannot go on (it did not start cold, its results are not whole)."""


class CellRun:
    """Runs one cell to its end on its node (a use-once object: `run()`).

    `following` is the next cell on the node (None: none), whose engine key decides whether the
    engines stay up; `install`, a cell whose variables first install the node's software and model
    (the node's first cell). Ctrl-C tears down, marks the cell interrupted and re-raises."""

    def __init__(
        self,
        services: CampaignServices,
        plan: CellPlan,
        node: NodeState,
        *,
        index: int,
        total: int,
        following: Cell | None = None,
        install: Cell | None = None,
    ) -> None:
        self.campaign = services
        self.plan = plan
        self.paths = plan.paths
        self.cell = plan.cell
        self.node = node
        self.index, self.total = index, total
        self.following = following
        self.install = install
        self.deployed = node.deployed  # the engine key running on the node (None: none to reuse)
        self.cold_start = services.lab.campaign.cold_start
        self.record = self._new_record()
        self.timings: dict[str, float] = {}
        self.record.timings = self.timings
        self.watched: list[Fault] = []  # outages the TargetWatch saw during the replay
        self.kept_units: dict[str, Any] = {}  # the unit states the engines kept from the cell before
        self.keeping = False  # the next cell keeps these engines (decided before the replay's collect)
        self.teardown_after = False  # replay.yml ends with the cell's teardown
        self.torn_down = False  # ... and it ran
        self.t0 = time.monotonic()

    def _new_record(self) -> CellRecord:
        cell, plan = self.cell, self.plan
        return CellRecord(
            cell_id=cell.id,
            campaign=self.campaign.lab.campaign.name,
            config={**cell.config, "id": cell.id},
            node=self.node.name,
            client=self.campaign.lab.client_of(self.campaign.lab.node(self.node.name)).name,
            engine_key=plan.engine_key,
            profiles=plan.profiles,
            hosts=self.campaign.facts,
            targets=plan.target_hosts,
            l2_device=plan.l2_device,
            replay_argv=list(plan.replay_argv),
            versions=tool_versions(),
            started_at=time.time(),
        )

    # -- the lifecycle ---------------------------------------------------------------------------------
    def run(self) -> CellOutcome:
        was_deployed, previous_key = self.deployed, self.node.last_key
        self.campaign.results.start_cell(self.cell)
        self.node.last_key = self.plan.engine_key
        self.record.write(self.paths)
        outcome = CellOutcome(CellStatus.DONE, str(CellStatus.DONE))
        try:
            self.check_client()
        except ClientInstallFailed as exc:
            # nothing of this cell was deployed: only engines an earlier cell kept for it need stopping
            self.torn_down = self.deployed is None
            return self.finish(self.failed(exc))
        try:
            self.make_cold(was_deployed is None and previous_key == self.plan.engine_key)
            self.replay()
        except KeyboardInterrupt:
            self.interrupted()
            raise
        except (PlaybookFailed, RuntimeError) as exc:
            outcome = self.failed(exc)
        return self.finish(outcome)

    def check_client(self) -> None:
        """A cell whose client host's install already failed fails at once, with that install's error,
        before it deploys or resets anything (ClientInstallFailed). One whose install still runs goes
        on: its replay waits for it (`replay`), while the engines start."""
        node = self.node.name
        if not self.campaign.client_pending(node):
            self.campaign.client_ready(node)  # returns at once: the install is over, or there is none

    def make_cold(self, torn_down_before: bool) -> None:
        """A reset of the engines the previous cell left running, else a (re)start proven cold.
        `torn_down_before`: the previous cell ran these engines but ended them."""
        reset_error = None
        if self.deployed == self.plan.engine_key and self.cold_start == "reset":
            try:
                self.record.cold_start = self.phase("reset", self.reset)
                self.kept_units = dict(self.node.baseline)
                return
            except (ResetFailed, PlaybookFailed) as exc:
                reset_error = str(exc)
                log.warning("cell %s: reset failed, restarting the engines: %s", self.cell.id, exc)
                self.deployed = None
        self.restart(reset_error, torn_down_before)

    def reset(self) -> dict[str, Any]:
        """Empty the running engines' caches and prove the cell cold (kvoffload/orchestrate/coldstart)."""
        t0 = time.monotonic()
        previous, probe = self.node.previous, self.campaign.probe_payload
        payload = probe(previous) if probe and previous else None
        reset = CacheReset(Endpoints.from_targets(self.plan.targets), external=self.cell.tier != "gpu")
        outcome = reset.run(payload).to_json()
        outcome["seconds"] = round(time.monotonic() - t0, 3)
        if payload is None:
            outcome["probe_skipped"] = "no prompt of the previous cell to repeat"
        return outcome

    def restart(self, reset_error: str | None, torn_down_before: bool) -> None:
        """Install (the node's first cell), stop what runs, deploy, and prove the engines cold."""
        if self.install is not None:
            self.install_node(self.install)
        if self.deployed is not None or reset_error is not None or self.install is not None:
            self.phase("teardown-before", lambda: self.play(TEARDOWN, skip=BETWEEN_CELLS_SKIP_TAGS))
        deployed = self.phase("deploy", lambda: self.play(DEPLOY, skip=CELL_SKIP_TAGS))
        # a unit whose start failed and that systemd started again: restarts of the deploy, before any
        # traffic, so the cell's faults count from there (and the record says they happened)
        came_back = {
            f"{host}--{unit}": restarts
            for host, units in deployed.start_restarts.items()
            for unit, restarts in units.items()
        }
        self.kept_units = {key: {"NRestarts": n} for key, n in came_back.items()}
        cold = self.phase("cold-check", lambda: check_cold(self.plan.targets))
        reason = restart_reason(self.cold_start, reset_error, self.node.previous, torn_down_before)
        self.record.cold_start = {
            "method": "restart",
            "reason": reason,
            "cold": cold.cold,
            "checked": cold.checked,
            "problems": list(cold.problems),
            "unreachable": list(cold.unreachable),
            "deploy_restarts": came_back,
        }
        if came_back:
            log.warning("cell %s: restarted by systemd while it started: %s", self.cell.id, came_back)
        if not cold.cold:
            raise CellFailed("cell did not start cold: " + "; ".join(cold.problems))

    def install_node(self, install: Cell) -> None:
        """Once per node and campaign: software and model (cells skip those tags), and nothing left
        running by an earlier campaign that a deploy would not restart. Its deploy gathers the node's
        facts afresh, after what provision mounted and wrote."""
        node = self.node.name
        extravars = self.campaign.plan_of(install, node).extravars
        try:
            self.phase(
                "install",
                lambda: self.campaign.play(
                    DEPLOY,
                    extravars,
                    node=node,
                    cell=self.cell,
                    phase="install",
                    fresh_facts=True,
                    tags=CELL_SKIP_TAGS,
                ),
            )
        finally:
            self.campaign.node_installed(node)  # the client installs while the engines start

    def replay(self) -> None:
        """replay.yml: the replay on the client, its collect and (no next cell keeps the engines, and
        the client is no host of another node) the cell's teardown; then the collected files."""
        if self.cold_start == "reset" and self.following is not None:
            self.keeping = (
                self.campaign.plan_of(self.following, self.node.name).engine_key == self.plan.engine_key
            )
        self.teardown_after = not self.keeping and not client_of_another_node(
            self.campaign.lab, self.node.name
        )
        if self.plan.has_l2:  # the trim after the last wipe of L2 before this cell (null: none this run)
            self.record.l2_trim = self.node.l2_trim
        node = self.node.name
        if self.campaign.client_pending(node):
            # once per run and client host: not this cell's overhead
            self.phase("wait-client", lambda: self.campaign.client_ready(node))
        else:
            self.campaign.client_ready(node)  # raises when the client host's install failed
        try:
            result = self.phase("replay", self.replay_play)
        except PlaybookFailed as exc:
            self.collected(exc.result)
            if not (self.teardown_after and exc.result.failed_only_in(TEARDOWN_PLAY)):
                raise
            # the replay and its collect are whole: the cell stands, and its teardown runs again on
            # its own (where a second failure becomes the cell's teardown_error)
            log.warning("teardown after cell %s failed, trying again: %s", self.cell.id, exc)
        else:
            self.collected(result)
            self.torn_down = self.teardown_after and result.seconds_from(TEARDOWN_PLAY) is not None
        self.record.write(self.paths)
        if self.node.software_from is not None:
            copy_software(self.node.software_from, self.paths)
        else:
            self.node.software_from = self.paths

    def replay_play(self) -> PlaybookResult:
        expected = self.campaign.expected_requests(self.cell) if self.campaign.expected_requests else 0
        node, display = self.node.name, self.campaign.display

        def on_replay(finished: int) -> None:
            display.replay(node, max(0, finished - WARMUP_REQUESTS), expected)

        with (
            # the replicas also count the replay's warmup requests, sent before the dataset's
            ReplayWatcher(self.plan.targets, on_replay, on_live=lambda c, t: display.live(node, c, t)),
            TargetWatch(self.plan.targets) as watch,
        ):

            def on_play(name: str) -> None:  # a teardown's stops are not outages of the cell
                if self.teardown_after and name == TEARDOWN_PLAY:
                    watch.stop()

            try:
                return self.play(
                    REPLAY,
                    client=True,
                    skip=self.replay_skips(),
                    clear_l2=self.l2_clears(),
                    more=self.replay_switches(),
                    on_play=on_play,
                )
            finally:
                self.watched.extend(watch.faults())
                unpack_fetched(self.paths)

    def replay_switches(self) -> dict[str, bool]:
        """replay.yml's own switches and the role writes it turns off for this cell."""
        return {
            # the collect's unit states and software come back in the run's events (collected())
            "collect_units_to_controller": False,
            "collect_software_to_controller": False,
            "replay_unpack_on_controller": False,  # unpack_fetched
            "replay_keep_attempts": False,  # start_cell kept them
            TEARDOWN_AFTER_VAR: self.teardown_after,
        }

    def replay_skips(self) -> list[str]:
        """Nothing was installed since the node's first collect (once per node and run), whose software
        later cells copy; the periodic disk jobs stay masked until the node's last cell is over."""
        software = [COLLECT_SOFTWARE_TAG] if self.node.software_from is not None else []
        return [*CELL_SKIP_TAGS, *BETWEEN_CELLS_SKIP_TAGS, *software]

    def l2_clears(self) -> list[str]:
        """After a reset, L2 holds the KV of the probes: emptied before the replay starts; the collect
        at the end empties it for a next cell that keeps these engines."""
        reset = (self.record.cold_start or {}).get("method") == "reset"
        clear = {CLEAR_L2_VAR: reset, CLEAR_L2_NEXT_VAR: self.keeping}
        return [var for var, wanted in clear.items() if wanted]

    def collected(self, result: PlaybookResult) -> None:
        """What replay.yml brought back: the collect and teardown timings, units and software, trims."""
        split_collect(self.timings, result, self.teardown_after)
        write_collected(self.paths, result)
        self.note_l2_trims(result, this_cell=self.plan.has_l2)

    def interrupted(self) -> None:
        self.record.status = CellStatus.INTERRUPTED
        with signals_deferred():
            self.teardown(final=True)
            self.record.write(self.paths)
            seconds = time.monotonic() - self.t0
            self.campaign.display.cell_done(
                self.cell, self.node.name, str(CellStatus.INTERRUPTED), None, seconds, None
            )

    def failed(self, exc: Exception) -> CellOutcome:
        self.record.status = CellStatus.FAILED
        self.record.error = str(exc)
        log.error("cell %s failed: %s", self.cell.id, exc)
        return CellOutcome(CellStatus.FAILED, f"failed: {exc}")

    def finish(self, outcome: CellOutcome) -> CellOutcome:
        """Teardown unless the engines stay up, unit states, software, faults, DONE, the displays."""
        keep = outcome.done and self.keeping
        if keep:
            self.record.engines_kept = True
        elif not self.torn_down:
            # the node's periodic disk jobs come back once its last cell is over (the campaign's unquiet)
            self.teardown(final=False)
        self.judge()
        if outcome.done:
            outcome = self.check_whole()
        self.record.write(self.paths)
        if outcome.done:
            self.campaign.results.mark_done(self.cell)
        self.campaign.display.cell_done(
            self.cell,
            self.node.name,
            str(self.record.status),
            self.record.error,
            self.timings["total"],
            outcome.text,
        )
        if keep and outcome.done:
            return CellOutcome(outcome.status, outcome.text, self.plan.engine_key, self.record.units or {})
        if keep:  # the results were incomplete: do not carry this deployment over
            self.teardown(final=False)
            self.record.write(self.paths)
        return outcome

    def judge(self) -> None:
        """Unit states, software and faults (unit states exist only when collect ran; a cell that failed
        before it is judged on what the watch saw, and is not done anyway)."""
        record = self.record
        record.units = unit_states(self.paths)
        record.software = host_software(self.paths.software_dir)
        units = unit_faults(record.units, list(self.plan.units), self.kept_units) if record.units else []
        record.judge(self.watched, units, self.paths.requests)
        record.finished_at = time.time()
        self.timings["total"] = round(time.monotonic() - self.t0, 3)

    def check_whole(self) -> CellOutcome:
        """A done cell whose replay left requests.jsonl and sessions.json; else failed."""
        missing = [p.name for p in (self.paths.requests, self.paths.sessions) if not p.is_file()]
        if missing:
            text = f"failed: collected results lack {', '.join(missing)}"
            self.record.status, self.record.error = CellStatus.FAILED, text
            return CellOutcome(CellStatus.FAILED, text)
        self.record.status = CellStatus.DONE
        return CellOutcome(CellStatus.DONE, str(CellStatus.DONE))

    # -- playbooks and phases --------------------------------------------------------------------------
    def phase(self, name: str, fn: Callable[[], T]) -> T:
        """One timed phase of the cell, on the display and in status.json; cell.json after it."""
        if self.campaign.stopping():
            raise KeyboardInterrupt
        self.campaign.display.phase(self.cell, self.node.name, self.index, self.total, name)
        t0 = time.monotonic()
        try:
            return fn()
        finally:
            self.timings[name] = round(time.monotonic() - t0, 3)
            self.record.write(self.paths)

    def play(
        self,
        playbook: str,
        *,
        client: bool = False,
        skip: Sequence[str] = (),
        clear_l2: Sequence[str] = (),
        more: Mapping[str, Any] | None = None,
        on_play: Callable[[str], None] | None = None,
    ) -> PlaybookResult:
        """A playbook of this cell on its node (and the client); `clear_l2` only where there is an L2."""
        node = self.node.name
        switches = {**(dict.fromkeys(clear_l2, True) if self.plan.has_l2 else {}), **(more or {})}
        result = self.campaign.play(
            playbook,
            self.plan.extravars_with(switches),
            node=node,
            cell=self.cell,
            phase=ident_of(playbook),
            client=client,
            skip_tags=skip,
            on_play=on_play,
        )
        if playbook != REPLAY:  # replay.yml's trims: after the replay (collected())
            self.note_l2_trims(result)
        return result

    def teardown(self, *, final: bool) -> None:
        """Stop the cell's services and wipe L2; `final` (an interrupt: no cell follows) also gives the
        hosts their periodic disk jobs back, which after a node's last cell the campaign's unquiet does.
        After a failed cell the journal of every unit it stops lands in the cell's units/ folder
        (`<host>--<unit>.failed-cell.journal.txt`): the engines' last words beside the cell's error."""
        t0 = time.monotonic()
        # a failed cell's collect did not run: keep every stopped unit's journal beside its error
        failed = self.record.status == CellStatus.FAILED
        try:
            result = self.campaign.play(
                TEARDOWN,
                self.plan.extravars_with({JOURNAL_UNITS_VAR: "all"}) if failed else self.plan.extravars,
                node=self.node.name,
                cell=self.cell,
                phase="teardown",
                cancel=False,
                facts=False,
                skip_tags=() if final else BETWEEN_CELLS_SKIP_TAGS,
            )
        except PlaybookFailed as exc:
            self.record.teardown_error = str(exc)
            log.error("teardown after cell %s failed: %s", self.cell.id, exc)
            self.note_l2_trims(exc.result)
        else:
            self.note_l2_trims(result)
        self.timings["teardown"] = round(time.monotonic() - t0, 3)

    def note_l2_trims(self, result: PlaybookResult, *, this_cell: bool = False) -> None:
        """Keep the run's last fstrim of the node's L2 for its next cell; with `this_cell` (a replay.yml
        run of a cell with an L2), one in its first play, before the replay, is this cell's own."""
        for play_name, _host, trim in result.l2_trims:
            if this_cell and play_name == CLEAR_L2_PLAY:
                self.record.l2_trim = trim
            else:
                self.node.l2_trim = trim


def client_of_another_node(lab: LabConfig, node: str) -> bool:
    """Whether `node`'s client host deploys cells of another node (a lab may put it there): its replay
    then must not end with this node's teardown."""
    client = lab.client_of(lab.node(node)).name
    return any(client in lab.node_hosts(other) for other in lab.nodes if other.name != node)


def split_collect(timings: dict[str, float], result: PlaybookResult, teardown_after: bool) -> None:
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


def restart_reason(cold_start: str, reset_error: str | None, previous: Cell | None, torn_down: bool) -> str:
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
