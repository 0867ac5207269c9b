"""`kvoffload-lab doctor INVENTORY`: is each node ready for a campaign? One table per host, doctor.json.

Thin: the probe, the checks and the verdicts live in kvoffload/doctor and
kvoffload/orchestrate/checks/doctor.py;
this module parses flags, renders the tables and picks the exit code (1 when a host fails a check).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvoffload.cli.args import DEFAULT_WHEEL_CACHE, add_command, add_lab_arguments, hosts_python_flag
from kvoffload.orchestrate.checks.controller import check_folder_flag

if TYPE_CHECKING:
    from kvoffload.config import LabConfig
    from kvoffload.doctor.checks import NodeReport
    from kvoffload.orchestrate.checks.doctor import Smoke

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def register(sub: Any) -> None:
    p = add_command(sub, "doctor", doctor)
    add_lab_arguments(p)
    p.add_argument(
        "--hosts-python",
        default=None,
        metavar="X.Y.Z",
        help=(
            "the Python the wheelhouse is built for, as `run` takes it (default: as `run`, the one the "
            "hosts report; hosts that report different ones fail)"
        ),
    )
    p.add_argument("--no-wheelhouse", action="store_true", help="as `run`: hosts install from their index")
    p.add_argument(
        "--no-smoke",
        action="store_true",
        help="leave out the vLLM/LMCache pair's smoke check (it installs and loads the model: minutes)",
    )
    p.add_argument(
        "--no-pair-check",
        action="store_true",
        help=(
            "leave out the cell-free pair check (LMCache's server and bench as two sandboxed transient "
            "units: seconds, no model; it needs the engine venv, which the smoke check installs)"
        ),
    )
    p.add_argument(
        "--wheel-cache",
        type=Path,
        default=None,
        help="as `run`: where the wheelhouse the smoke check installs from is built",
    )
    p.add_argument("--json", action="store_true", help="print doctor.json instead of the tables")


def doctor(args: argparse.Namespace) -> int:
    """check every host before a campaign: GPU, driver, fabric, NUMA, memory for L1, L2, engines

    Run a probe on every host of the inventory and check what a campaign needs: /dev/nvidia-uvm and the
    driver, Fabric Manager and the fabric state, persistence mode, GPU clocks, PCIe links, NUMA placement of
    the GPUs and the NVMe, host Python against the wheelhouse, memory for L1, the L2 mount (file system,
    O_DIRECT, a short throughput probe, TRIM), CUDA init in a unit-like sandbox, a pinned allocation, CUDA IPC
    between two processes, the engine set's versions and LMCache's connector module. Then, for a vllm
    campaign, on each node with an lmcache-server, in parallel, the smoke check of the vLLM/LMCache pair: it
    installs the node's software and model as `run` does (idempotent), starts lmcache-server and one replica
    through the cell's roles and units, checks that the replica registered, sends one prompt twice (the
    replica's own prefix cache emptied in between) and reads a store and a retrieve from the servers'
    counters, then stops them (--no-smoke leaves it out: then nothing on the hosts changes). After it, the
    cell-free pair check (seconds, no model): LMCache's own `lmcache server` and `lmcache bench server` as two
    transient systemd units with the engine units' [Service] keys, storing, retrieving and checksumming KV
    through L1 (and L2 on an nvme host), comparing the server's live metric names with the analysis's
    (--no-pair-check leaves it out). Prints a table per host, writes RESULTS/<campaign>/doctor.json, exits 1
    when a host fails a check.
    """
    from kvoffload.config import load_lab
    from kvoffload.orchestrate.checks.cellfree import PairCellFree
    from kvoffload.orchestrate.checks.doctor import DOCTOR_DIR, DOCTOR_JSON, doctor_json, run_doctor
    from kvoffload.playbook import PlaybookRunner

    hosts_python_flag(args.hosts_python)
    lab = load_lab(args.inventory, args.campaign)
    check_folder_flag(args.results, "--results")
    root = args.results.resolve() / lab.campaign.name
    inventory = args.inventory / "hosts.yml" if args.inventory.is_dir() else args.inventory
    runner = PlaybookRunner(inventory, root / "ansible")
    reports = run_doctor(
        lab,
        runner,
        root / DOCTOR_DIR,
        hosts_python=None if args.no_wheelhouse else args.hosts_python,
        learn_python=not args.no_wheelhouse,
        smoke=_smoke(args, lab, inventory),
        pair_check=None
        if args.no_pair_check or lab.campaign.engine != "vllm"
        else PairCellFree(runner, root / DOCTOR_DIR),
    )
    record = doctor_json(reports, lab.campaign.name)
    (root / DOCTOR_JSON).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(record, indent=1))
    else:
        render(reports, root / DOCTOR_JSON)
    return 1 if any(r.failed for r in reports) else 0


def _smoke(args: argparse.Namespace, lab: LabConfig, inventory: Path) -> Smoke | None:
    """The pair's round trip, on a campaign runner as `run` builds it (wheelhouse, provision, roles);
    None for the simulator (no pair to check) or with --no-smoke."""
    if args.no_smoke or lab.campaign.engine != "vllm":
        return None
    from kvoffload.orchestrate.campaign.runner import CampaignRunner
    from kvoffload.orchestrate.checks.doctor import DOCTOR_DIR
    from kvoffload.orchestrate.checks.round_trip import PairSmoke
    from kvoffload.orchestrate.results import CampaignResults

    wheel_cache = args.wheel_cache or DEFAULT_WHEEL_CACHE
    check_folder_flag(wheel_cache, "--wheel-cache")
    results = CampaignResults.open(args.results, lab.campaign.name)
    runner = CampaignRunner(
        lab,
        inventory,
        results,
        _SmokeProgress(),
        wheel_cache=wheel_cache,
        offline=not args.no_wheelhouse,
        hosts_python=args.hosts_python,
    )
    return PairSmoke(runner, results.root / DOCTOR_DIR / "smoke")


class _SmokeProgress:
    """The smoke check's campaign-runner phases (wheelhouse, preflight, provision) as log lines on
    stderr; it runs no cell, so there is nothing else to show before the tables."""

    def phase(self, cell: object, index: int, total: int, phase: str) -> None:
        logging.getLogger("kvoffload.doctor").info("smoke check: %s", phase)

    def task(self, name: str) -> None:
        return None

    def replay(self, done: int, expected: int) -> None:
        return None

    def cell_done(self, cell: object, status: str, seconds: float) -> None:
        return None


def render(reports: list[NodeReport], saved: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for report in reports:
        status = str(report.status)
        table = Table(
            title=f"{report.host}: [{_STYLE[status]}]{status}[/]", title_justify="left", expand=False
        )
        table.add_column("check", no_wrap=True)
        table.add_column("status", no_wrap=True)
        table.add_column("detail")
        table.add_column("fix")
        for c in report.checks:
            s = str(c.status)
            table.add_row(c.name, f"[{_STYLE[s]}]{s}[/]", c.detail, c.fix)
        console.print(table)
    failed = [r.host for r in reports if r.failed]
    console.print(f"saved {saved}")
    if failed:
        console.print(f"[bold red]not ready:[/] {', '.join(failed)}")
