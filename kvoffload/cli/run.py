"""`kvoffload-lab run | provision | teardown`: campaigns on a lab described by an Ansible inventory.

Thin: `run` and `provision` check their input (kvoffload/orchestrate/checks/controller.py), build the campaign
runner (kvoffload/orchestrate/campaign/runner.py, with the cells' virtual users of
kvoffload/orchestrate/campaign/pools.py) and call it; `teardown` calls
kvoffload/orchestrate/campaign/teardown.py. This
module parses flags, shows progress and prints the outcome.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvoffload.cli.args import DEFAULT_WHEEL_CACHE, add_command, add_lab_arguments, hosts_python_flag
from kvoffload.errors import UserError
from kvoffload.orchestrate.campaign.beside import start_beside
from kvoffload.orchestrate.checks.controller import (
    check_engine_pins,
    check_folder_flag,
    check_host_addresses,
    check_sim_profile,
    load_campaign_dataset,
)

if TYPE_CHECKING:
    from kvoffload.config import Cell, LabConfig

log = logging.getLogger("kvoffload.run")


def _common(p: argparse.ArgumentParser) -> None:
    add_lab_arguments(p)
    p.add_argument(
        "--wheel-cache",
        type=Path,
        default=DEFAULT_WHEEL_CACHE,
        help=f"where the wheelhouse shipped to hosts is built (default {DEFAULT_WHEEL_CACHE})",
    )
    p.add_argument(
        "--no-wheelhouse",
        action="store_true",
        help="hosts install dependencies from their index (this package and Caddy still go as wheels)",
    )
    p.add_argument(
        "--hosts-python",
        default=None,
        metavar="X.Y.Z",
        help=(
            "the hosts' python3 version the wheelhouse is built for (default: the version the hosts "
            "report, asked before the wheelhouse is built; every host must report the same); provision "
            "refuses a host whose python3 differs, naming its version"
        ),
    )


def register(sub: Any) -> None:
    r = add_command(sub, "run", run)
    _common(r)
    r.add_argument("--cells", help="comma list of cell ids to run (default: all; see `plan`)")
    r.add_argument(
        "--fresh", action="store_true", help="keep the existing results folder aside and start anew"
    )
    r.add_argument("--skip-provision", action="store_true", help="hosts are already provisioned")
    r.add_argument("--no-report", action="store_true", help="do not ingest and report at the end")
    r.add_argument(
        "--watch",
        action="store_true",
        help="serve the live page (`kvoffload-lab watch`) beside the run, as long as it runs; prints its URL",
    )
    r.add_argument(
        "--watch-bind", default="127.0.0.1", help="address of the --watch page (default 127.0.0.1)"
    )
    r.add_argument(
        "--watch-port", type=int, default=8765, help="port of the --watch page (default 8765; 0: any)"
    )
    p = add_command(sub, "provision", provision)
    _common(p)
    p.add_argument("--check", action="store_true", help="ansible --check --diff: show what would change")
    t = add_command(sub, "teardown", teardown)
    add_lab_arguments(t, results=False)


class _Display:
    """The progress display: rich on a terminal, log lines otherwise. Implements orchestrate's Progress."""

    def __init__(self, campaign: str, total: int) -> None:
        self.campaign = campaign
        self.total = total
        self.tty = sys.stderr.isatty()
        self.state: dict[str, Any] = {"cell": "-", "index": 0, "phase": "starting", "task": "", "replay": ""}
        self._t_phase = time.monotonic()
        self._last_log = 0.0
        self._live: Any = None

    def __enter__(self) -> _Display:
        if self.tty:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(
                self._render(), console=Console(stderr=True), refresh_per_second=4, transient=False
            )
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.stop()

    def _render(self) -> Any:
        from rich.table import Table

        s = self.state
        table = Table.grid(padding=(0, 2))
        table.add_row("campaign", f"[bold]{self.campaign}[/]  cell {s['index']}/{self.total}  {s['cell']}")
        table.add_row("phase", f"[cyan]{s['phase']}[/]  {time.monotonic() - self._t_phase:5.0f} s")
        table.add_row("task", str(s["task"])[:100])
        if s["replay"]:
            table.add_row("replay", s["replay"])
        return table

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def phase(self, cell: Cell | None, index: int, total: int, phase: str) -> None:
        self.state.update(
            cell=f"{cell.id} ({cell.tier}, c={cell.concurrency}, r={cell.num_rounds})" if cell else "-",
            index=index,
            phase=phase,
            task="",
            replay="",
        )
        self.total = total
        self._t_phase = time.monotonic()
        if not self.tty:
            log.info("cell %d/%d %s: %s", index, total, self.state["cell"], phase)
        self._refresh()

    def task(self, name: str) -> None:
        self.state["task"] = name
        self._refresh()

    def replay(self, done: int, expected: int) -> None:
        text = f"{done}/{expected} requests" if expected else f"{done} requests"
        changed = text != self.state["replay"]
        self.state["replay"] = text
        if not self.tty and changed and time.monotonic() - self._last_log >= 10:
            self._last_log = time.monotonic()
            log.info("replay: %s", text)
        self._refresh()

    def cell_done(self, cell: Cell, status: str, seconds: float) -> None:
        shape = f"{cell.tier}, c={cell.concurrency}, r={cell.num_rounds}"
        line = f"cell {cell.id} ({shape}): {status} in {seconds:.0f} s"
        if self._live is not None:
            self._live.console.print(line)
        else:
            log.info("%s", line)


def _runner(args: argparse.Namespace, fresh: bool = False, replays: bool = False) -> Any:
    """The validated lab and the campaign runner. Everything that can be checked on this machine is
    checked before the results folder is created, so bad input exits 2 with nothing written and no
    host touched; `replays` adds what only a run replays (the dataset, `--cells`)."""
    from kvoffload.config import load_lab
    from kvoffload.orchestrate.campaign.pools import CellPools
    from kvoffload.orchestrate.campaign.runner import CampaignRunner
    from kvoffload.orchestrate.results import CampaignResults

    lab = load_lab(args.inventory, args.campaign)
    check_sim_profile(lab.campaign, lab.where)
    check_host_addresses(lab.inventory)
    for warning in check_engine_pins(lab):
        log.warning("%s", warning)
    check_folder_flag(args.results, "--results")
    check_folder_flag(args.wheel_cache, "--wheel-cache")
    hosts_python = hosts_python_flag(args.hosts_python)
    sessions = None
    if replays:
        _only(args, lab)
        sessions = load_campaign_dataset(lab.campaign, lab.dataset_path, lab.where)
    results = CampaignResults.open(args.results, lab.campaign.name, fresh=fresh)
    display = _Display(lab.campaign.name, len(lab.cells))
    pools = CellPools(lab, sessions)
    runner = CampaignRunner(
        lab,
        _inventory_file(args),
        results,
        display,
        wheel_cache=args.wheel_cache,
        offline=not args.no_wheelhouse,
        hosts_python=hosts_python,
        expected_requests=pools.expected,
        probe_payload=pools.probe,
    )
    return lab, results, display, runner


def _inventory_file(args: argparse.Namespace) -> Path:
    """The inventory file: INVENTORY, or the hosts.yml of an INVENTORY folder."""
    inventory: Path = args.inventory
    return inventory / "hosts.yml" if inventory.is_dir() else inventory


def _only(args: argparse.Namespace, lab: LabConfig) -> list[str] | None:
    """`--cells` as a list of cell ids (None: every cell); an unknown id is an error."""
    only = [c.strip() for c in args.cells.split(",")] if args.cells else None
    if only:
        unknown = sorted(set(only) - {c.id for c in lab.cells})
        if unknown:
            raise UserError(
                f"--cells: unknown cell id(s) {', '.join(unknown)}; `kvoffload-lab plan` lists them"
            )
    return only


def _stop_on_signals() -> None:
    """Ctrl-C and SIGTERM stop a campaign: a running playbook is canceled (ansible-playbook runs in its
    own session, so it never sees the terminal's Ctrl-C), then the cell is torn down and marked."""
    from kvoffload.playbook import request_stop

    def handler(_signum: int, _frame: object) -> None:
        if not request_stop():
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def run(args: argparse.Namespace) -> int:
    """run a campaign end to end: provision, every cell, report

    Provision the hosts once, then for each cell of the campaign: deploy (lmcache-server, vLLM replicas,
    Caddy), check the cold start, replay with metrics sampling, collect, tear down. Results go to
    RESULTS/<campaign>/ and are never overwritten; cells already DONE are skipped, so running again resumes.
    Ctrl-C tears the current cell down and marks it interrupted. At the end the tables and the report are
    written.
    """
    lab, results, display, runner = _runner(args, fresh=args.fresh, replays=True)
    only = _only(args, lab)
    t0 = time.monotonic()
    beside = None
    if args.watch:
        beside = start_beside(results.root, args.watch_bind, args.watch_port)
        print(f"watch: {beside.url} (the live page, while the run works)", file=sys.stderr, flush=True)
    _stop_on_signals()
    try:
        return _run(args, lab, results, display, runner, only, t0)
    finally:
        if beside is not None:
            beside.stop()


def _run(
    args: argparse.Namespace, lab: Any, results: Any, display: _Display, runner: Any, only: Any, t0: float
) -> int:
    from kvoffload.playbook import PlaybookFailed

    try:
        with display:
            outcome = runner.run(only=only, provision=not args.skip_provision)
    except KeyboardInterrupt:
        print(
            "interrupted: the current cell was torn down and marked interrupted; "
            f"run again to resume ({results.root})",
            file=sys.stderr,
        )
        return 130
    except PlaybookFailed as exc:
        print(f"kvoffload-lab: {exc}", file=sys.stderr)
        return 1
    print(
        f"campaign {lab.campaign.name}: {len(outcome.done)} cells done, {len(outcome.skipped)} already done, "
        f"{len(outcome.failed)} failed, {time.monotonic() - t0:.0f} s",
        file=sys.stderr,
    )
    for cell_id, why in outcome.failed.items():
        print(f"  {cell_id}: {why}", file=sys.stderr)
    if not args.no_report:
        from kvoffload.report import findings_text, write_report

        report = write_report(results.root)
        # the report's first sections, so that the end of a run answers without opening a file
        if report.decision_lines:
            print("\n".join(report.decision_lines) + "\n")
        print(findings_text(report.finding_groups, report.turn_statements))
        print(f"report: {report.path}")
    return 0 if not outcome.failed else 1


def provision(args: argparse.Namespace) -> int:
    """provision the hosts (drivers, NVMe, packages); idempotent

    Run the preflight and provision playbooks on every host; a second run changes nothing.
    """
    _lab, _results, display, runner = _runner(args)
    with display:
        result = runner.provision(check=args.check)
    per_host = ", ".join(f"{h}={n}" for h, n in result.changed.items())
    print(f"provisioned: {result.total_changed} changed ({per_host})")
    return 0


def teardown(args: argparse.Namespace) -> int:
    """stop every kvoffload unit, clear the lmcache L1 and wipe the L2 folder

    Stop the services a cell deployed (vLLM replicas, lmcache-server, Caddy) on every host, wipe the L2 folder
    and give the hosts their periodic disk jobs back. Writes no results folder and builds no wheelhouse:
    stopping units installs nothing.
    """
    from kvoffload.config import load_lab
    from kvoffload.orchestrate.campaign.teardown import teardown_lab

    lab = load_lab(args.inventory, args.campaign)
    display = _Display(lab.campaign.name, len(lab.cells))
    with display:
        teardown_lab(lab, _inventory_file(args), display)
    print("torn down")
    return 0
