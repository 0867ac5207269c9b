"""`kvoffload-lab plan INVENTORY --emit-extravars CELL_ID`: one cell's extravars for plain Ansible.

Writes to stdout, as YAML, exactly the extravars `run` passes to that cell's deploy, replay, collect
and teardown playbooks: the same function (`kvoffload.orchestrate.cell.deployment.cell_extravars`), the same
node (the schedule `plan` shows), the same cell folder under `--results` and the same wheels (this
package's wheel and, unless `--no-wheelhouse`, the wheelhouse, both built in `--wheel-cache` as `run`
builds them, for the Python the hosts report unless `--hosts-python` is given: asking them is the one
read-only playbook it runs). So `ansible-playbook -i INVENTORY playbooks/site.yml -e @cell.yml` runs
the cell `run` would run. It changes nothing on any host and creates no results folder; stdout holds
the YAML only.

`plan INVENTORY --finish-cell CELL_ID` then completes the folder the playbooks wrote (cell.json, DONE;
kvoffload/orchestrate/cell/plain.py), so that `report` reads the cell and `plan` counts it DONE.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from shlex import quote
from typing import TYPE_CHECKING, Any

import yaml

from kvoffload.cli.args import DEFAULT_WHEEL_CACHE, hosts_python_flag
from kvoffload.contracts.layout import CampaignPaths
from kvoffload.errors import UserError
from kvoffload.orchestrate.checks.controller import check_folder_flag

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvoffload.config.load import LabConfig
    from kvoffload.orchestrate.installs.wheelhouse import Wheels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flag and the wheel options `run` has (they decide the wheel paths in the extravars)."""
    group = parser.add_argument_group("plain Ansible")
    group.add_argument(
        "--emit-extravars",
        metavar="CELL_ID",
        default=None,
        help=(
            "write the extravars `run` passes for this cell as YAML to stdout (nothing else), for "
            "`ansible-playbook -e @cell.yml`; builds the wheels as `run` does"
        ),
    )
    group.add_argument(
        "--finish-cell",
        metavar="CELL_ID",
        default=None,
        help=(
            "after `ansible-playbook playbooks/site.yml -e @cell.yml`: write the cell's cell.json, and DONE "
            "when its results are whole, as `run` does, so that `report` reads the cell and `plan` counts "
            "it DONE"
        ),
    )
    group.add_argument(
        "--wheel-cache",
        type=Path,
        default=DEFAULT_WHEEL_CACHE,
        help=f"with --emit-extravars: as for `run` (default {DEFAULT_WHEEL_CACHE})",
    )
    group.add_argument("--no-wheelhouse", action="store_true", help="with --emit-extravars: as for `run`")
    group.add_argument(
        "--hosts-python", default=None, metavar="X.Y.Z", help="with --emit-extravars: as for `run`"
    )


def cell_node(lab: LabConfig, cell_id: str, results: Path, schedule: Callable[..., Any]) -> str:
    """The node `run` gives the cell: the schedule of the cells still to run (all, if it is DONE)."""
    campaign = CampaignPaths(results / lab.campaign.name)
    todo = [c for c in lab.cells if not campaign.cell(c.id).done.is_file()]
    if cell_id not in {c.id for c in todo}:
        todo = list(lab.cells)
    where, _, _ = schedule(lab, todo, lab.dataset_path.exists())
    return str(where[cell_id])


def build(lab: LabConfig, args: argparse.Namespace) -> Wheels:
    """The wheels `run` builds for this lab (CampaignRunner.prepare_wheelhouse)."""
    from kvoffload.engines.lab import wheel_sets
    from kvoffload.orchestrate.installs import wheelhouse

    check_folder_flag(args.wheel_cache, "--wheel-cache")
    hosts_python = hosts_python_flag(args.hosts_python)
    if hosts_python is None and not args.no_wheelhouse:
        hosts_python = _learn_hosts_python(lab)
    return wheelhouse.build_wheels(
        args.wheel_cache,
        offline=not args.no_wheelhouse,
        engine_sets=wheel_sets(lab),
        hosts_python=hosts_python or wheelhouse.DEFAULT_HOSTS_PYTHON,  # unread without a wheelhouse
    )


def _learn_hosts_python(lab: LabConfig) -> str:
    """The Python the hosts report, as `run` asks them; the playbook's artifacts go to a scratch folder
    (no results folder is created)."""
    from kvoffload.orchestrate.installs import host_python
    from kvoffload.playbook import PlaybookRunner

    with tempfile.TemporaryDirectory(prefix="kvoffload-host-python-") as scratch:
        runner = PlaybookRunner(Path(lab.inventory.file), Path(scratch))
        return host_python.learn_hosts_python(runner)


def emit(lab: LabConfig, args: argparse.Namespace, schedule: Callable[..., Any]) -> int:
    """Write the cell's extravars to stdout; an unknown cell id is bad input (exit 2)."""
    from kvoffload.orchestrate.cell.deployment import cell_extravars
    from kvoffload.orchestrate.results import CampaignResults

    cells = {c.id: c for c in lab.cells}
    cell = cells.get(args.emit_extravars)
    if cell is None:
        raise UserError(
            f"--emit-extravars {args.emit_extravars}: no such cell in campaign {lab.campaign.name} "
            f"(`plan` lists them: {', '.join(list(cells)[:4])}{', ...' if len(cells) > 4 else ''})"
        )
    node = cell_node(lab, cell.id, args.results, schedule)
    # The folder `run` gives the cell (CampaignResults.open resolves the base), without creating it.
    cell_dir = CampaignResults(args.results.resolve() / lab.campaign.name).cell_dir(cell)
    variables = cell_extravars(lab, cell, cell_dir, build(lab, args), node)
    # In a lab of several nodes or client hosts the cell's playbooks run on its node's hosts and its
    # client host only, as in `run` (the extravars, Caddy's upstreams say, are that node's).
    # The commands to copy into a shell: every path and host name quoted for it.
    campaign_flag = f" --campaign {quote(str(args.campaign))}" if args.campaign is not None else ""
    limit = ""
    if lab.multi_node or len(lab.clients) > 1:
        host = lab.node(node)
        limit = " --limit " + quote(",".join([*lab.node_hosts(host), lab.client_of(host).name]))
    inventory, results = quote(str(args.inventory)), quote(str(args.results))
    sys.stdout.write(
        f"# kvoffload-lab extravars of cell {cell.id} on node {node}; run it with\n"
        f"#   ansible-playbook -i {inventory} playbooks/site.yml -e @THIS_FILE{limit}\n"
        f"# then complete the cell's results (cell.json, DONE) with\n"
        f"#   kvoffload-lab plan {inventory}{campaign_flag} --results {results} "
        f"--finish-cell {cell.id}\n"
    )
    sys.stdout.write(yaml.safe_dump(variables, sort_keys=True, default_flow_style=False, width=1000))
    return 0


def finish(lab: LabConfig, args: argparse.Namespace) -> int:
    """Complete a plain run's cell folder (kvoffload/orchestrate/cell/plain.py): 0 when the cell is DONE, 1
    when its results are incomplete (cell.json says why), 2 on bad input."""
    from kvoffload.orchestrate.cell.plain import finish_cell

    cells = {c.id: c for c in lab.cells}
    cell = cells.get(args.finish_cell)
    if cell is None:
        raise UserError(f"--finish-cell {args.finish_cell}: no such cell in campaign {lab.campaign.name}")
    done = finish_cell(lab, cell, args.results)
    if done.error:
        sys.stderr.write(f"cell {cell.id}: {done.error} (cell.json written, no DONE): {done.cell_dir}\n")
        return 1
    validity = "" if done.valid else " (invalid: a replica or lmcache-server faulted; cell.json says which)"
    sys.stdout.write(f"cell {cell.id}: DONE{validity}: {done.cell_dir}\n")
    return 0
