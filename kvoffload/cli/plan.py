"""`kvoffload-lab plan INVENTORY [--campaign FILE]`: what `run` would do, without touching a host.

With `--emit-extravars CELL_ID` it writes that cell's extravars instead, and with `--finish-cell
CELL_ID` it completes the results of that cell's plain Ansible run (kvoffload/cli/cellvars.py).

Prints the resolved cells with the engine / lmcache / Caddy profile each uses, the dataset's
virtual-user ceiling per num_rounds (with a warning for every cell whose concurrency exceeds it), a
warning for every offload tier whose L1 pool exceeds the memory of an lmcache-server host (as the last
doctor record in the results folder gives it), and which cells are already DONE in the results folder
and would be skipped. Bad input exits 2, a
dataset that is not on this machine or does not load included, a host without an address (one this
machine resolves) too, and so does an engine set whose pins need two torches
(kvoffload/engines/pins.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvoffload.cli import cellvars
from kvoffload.cli.args import add_command
from kvoffload.contracts.layout import CampaignPaths
from kvoffload.datasets import virtual_users
from kvoffload.orchestrate.checks.controller import (
    check_dataset_path,
    check_engine_pins,
    check_folder_flag,
    check_host_addresses,
    check_sim_profile,
    load_campaign_dataset,
)

if TYPE_CHECKING:
    from kvoffload.tiers import Tier


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "plan", _plan)
    parser.add_argument(
        "inventory", type=Path, nargs="?", default=None, help="Ansible YAML inventory (hosts.yml)"
    )
    parser.add_argument(
        "--explain",
        metavar="KEY",
        default=None,
        help="print one campaign or inventory key's type, default, meaning and example (e.g. "
        "knee_search.resolution, vllm_replicas[].gpus) and exit; needs no inventory",
    )
    parser.add_argument(
        "--campaign", type=Path, default=None, help="campaign file (default: all.vars.kvoffload_campaign)"
    )
    parser.add_argument(
        "--results", type=Path, default=Path("results"), help="results root (default: results/)"
    )
    cellvars.add_arguments(parser)


def held_level_warnings(campaign: Any, ceilings: dict[int, int] | None) -> list[str]:
    """One warning per concurrency and num_rounds above the level its users can hold: a closed loop
    holds a level for a session only while a user waits to replace each that finishes (docs/metrics.md
    "Steady window"), so with U users (the dataset's at that num_rounds, at most max_sessions; the isl
    filter can only lower it) a level above U // 2 is measured during its start and drain only. With an
    `slo` such a level is not judged."""
    from kvoffload.orchestrate.campaign.knee import held_level

    out = []
    for rounds in campaign.num_rounds:
        bounds = [b for b in ((ceilings or {}).get(rounds), campaign.max_sessions) if b is not None]
        if not bounds:
            continue
        users = min(bounds)
        held = held_level(users)
        for c in sorted(c for c in campaign.concurrency if held < c <= users):
            decision = " and the decision will not judge it" if campaign.slo is not None else ""
            out.append(
                f"concurrency {c} (num_rounds {rounds}): at most {users} users replay it, and a closed loop "
                f'holds at most {held} sessions at once for a session (docs/metrics.md "Steady window"): '
                f"its load would not be held{decision}; raise max_sessions (or use a larger dataset) to at "
                f"least {2 * c}, or lower the concurrency to {held}"
            )
    return out


def _ceilings(lab: Any) -> tuple[dict[int, int] | None, str | None, list[Any]]:
    """Virtual users per num_rounds of the campaign; a dataset that is not on this machine (`run` ships
    it from here) or does not load exits 2. Also the sessions, for the token table."""
    path = lab.dataset_path
    sessions = load_campaign_dataset(lab.campaign, path, lab.where)
    code = lab.campaign.dataset.code
    return {n: len(virtual_users(sessions, code, n)) for n in lab.campaign.num_rounds}, None, sessions


def _knee_load_warnings(lab: Any, sessions: list[Any], tokenizer: Any, known: bool) -> list[str]:
    """`knee_search.max_concurrency` beyond the load the campaign can produce: the virtual users a cell
    replays (the dataset's at this num_rounds, less those the isl filter drops, cut at max_sessions).
    The ramp stops at the level those users hold (half of them: kvoffload/orchestrate/campaign/knee.py
    `held_level`); plan says so before the campaign runs."""
    from kvoffload.orchestrate.campaign.knee import held_level
    from kvoffload.replay.users import select_users

    campaign = lab.campaign
    knee = campaign.knee_spec()
    assert knee is not None
    out = []
    if not known:
        held = None if campaign.max_sessions is None else held_level(campaign.max_sessions)
        if held is not None and knee.max_concurrency > held:
            out.append(
                f"knee_search.max_concurrency {knee.max_concurrency} exceeds the {held} sessions "
                f"max_sessions {campaign.max_sessions} can hold: the ramp stops at {held}, beyond it no load "
                "is held"
            )
        return out
    for rounds in campaign.num_rounds:
        for isl in campaign.isl:
            pool = select_users(sessions, campaign.dataset.code, rounds, isl=isl, tokenizer=tokenizer,
                                max_sessions=campaign.max_sessions)  # fmt: skip
            users = len(pool.users)
            held = held_level(users)
            if knee.max_concurrency > held:
                cut = f", max_sessions {campaign.max_sessions}" if campaign.max_sessions is not None else ""
                out.append(
                    f"knee_search.max_concurrency {knee.max_concurrency} exceeds the {held} sessions the "
                    f"{users} virtual users a cell replays at num_rounds {rounds}, isl {isl} hold "
                    f"({pool.available} in the dataset, {pool.dropped_by_isl} dropped by the isl "
                    f"filter{cut}): the ramp stops at {held}, beyond it no load is held"
                )
    return out


def _tokenizer(lab: Any) -> Any:
    """What counts tokens for the isl filter, as `run` loads it: the model folder's tokenizer.json, the
    Hugging Face cache's for a hub id, else the approximate fallback."""
    from kvoffload.tokenizer import load_tokenizer

    return load_tokenizer(str(lab.model_folder) if lab.model_folder is not None else lab.campaign.model)


def _token_table(lab: Any, sessions: list[Any], tokenizer: Any) -> Any:
    """Input tokens per round of the campaign's longest users."""
    from rich.table import Table

    from kvoffload.datasets.tokens import round_tokens

    rounds = max(lab.campaign.num_rounds)
    title = f"input tokens per round (users of {rounds} rounds; a cell's isl bounds the last)"
    table = Table(title=title, min_width=len(title))
    for column in ("round", "calls", "p50", "p90", "p99", "max"):
        table.add_column(column, justify="right")
    for row in round_tokens(sessions, tokenizer, lab.campaign.dataset.code, rounds, rounds):
        table.add_row(*(str(v) for v in (row.round, row.calls, row.p50, row.p90, row.p99, row.max)))
    return table


def _lmcache_column(cell: Any) -> str:
    if cell.lmcache_profile is None:
        return "-"
    l1 = cell.lmcache_l1_size_gb
    return cell.lmcache_profile if l1 is None else f"{cell.lmcache_profile} (L1 {l1:g} GB)"


def _caddy_policy(tier: Tier, replicas: int) -> str:
    if replicas < 2:
        return "- (1 replica, no lb)"
    from kvoffload.profiles.resolve import caddy_profile

    return caddy_profile(tier).lb_policy


def _schedule(
    lab: Any, todo: list[Any], weighted: bool
) -> tuple[dict[str, str], dict[str, str], dict[str, int]]:
    """The node, cold-start method and position of every cell to run, as `run` will schedule them
    (weighted by the requests each cell sends when the dataset is on this machine)."""
    from kvoffload.orchestrate.campaign.schedule import schedule
    from kvoffload.orchestrate.cell.deployment import cold_start_methods

    cost = None
    if weighted:
        from kvoffload.orchestrate.campaign.pools import CellPools

        cost = CellPools(lab).expected
    where: dict[str, str] = {}
    method: dict[str, str] = {}
    order: dict[str, int] = {}
    for plan in schedule(todo, [n.name for n in lab.nodes], cost, lab.campaign.repeat_order):
        for i, (cell, how) in enumerate(
            zip(plan.cells, cold_start_methods(lab, plan.cells, plan.node), strict=True)
        ):
            where[cell.id], method[cell.id], order[cell.id] = plan.node, how, i
    return where, method, order


def _gpu_room_warnings(lab: Any) -> list[str]:
    """Per offload tier: whether --gpu-memory-utilization leaves room for lmcache-server's GPU memory."""
    from kvoffload.profiles.resolve import engine_profile, gpu_room_warning

    campaign = lab.campaign
    # The simulator's cache server holds no GPU memory; with the KV cache sized in bytes vLLM ignores
    # the utilization.
    if campaign.engine != "vllm" or campaign.kv_cache_memory_bytes is not None:
        return []
    found = []
    for tier in campaign.tiers:
        args = [*engine_profile(campaign.gpu_vendor, tier).args, *campaign.extra_engine_args]
        warning = gpu_room_warning(tier, args, None)
        if warning is not None:
            found.append(warning)
    return found


def _l1_memory_warnings(lab: Any, root: Path, console: Any) -> list[str]:
    """Per offload tier: whether its L1 pool fits the memory of the lmcache-server hosts, as the newest
    doctor record under the campaign's results folder gives it (the inventory does not say; the
    report bounds capacity and cost by cell.json's hosts after the run). Hosts no record sizes are
    named, with how to record them."""
    from kvoffload.orchestrate.checks.doctor import l1_memory_warnings, recorded_memory

    warnings, unknown = l1_memory_warnings(lab, recorded_memory(root))
    if unknown:
        console.print(
            f"L1 pools against host memory: not checked on {', '.join(unknown)} (no doctor record under "
            f"{root}: `kvoffload-lab doctor` records each host's memory, as `run` does before its first "
            "cell)",
            highlight=False,
        )
    return warnings


def _engine_set_lines(lab: Any) -> list[str]:
    """Per engine set the nodes install (kvoffload/engines/lab.py): its name, build and nodes, then each
    requirement and where its wheel comes from (index URL, folder or wheel file)."""
    from kvoffload.engines.lab import lab_sets, requirement_sources

    lines = []
    for found, nodes in lab_sets(lab):
        kind = "built-in" if found.builtin else f"defined at {found.where}"
        lines.append(f"engine set {found.name} (build {found.spec.build}, {kind}) on {', '.join(nodes)}:")
        lines += [f"  {req} from {where}" for req, where in requirement_sources(found)]
        if found.source_where is not None:
            lines.append(f"  (source from {found.source_where})")
    return lines


def _plan(args: argparse.Namespace) -> int:
    """validate an inventory + campaign and show the cells `run` would execute

    Validate the inventory and campaign (exit 2 naming file and key on bad input) and print the resolved
    cells, their profiles, the dataset's virtual-user ceilings and what is already DONE.
    """
    from rich.console import Console
    from rich.table import Table

    from kvoffload.config import load_lab

    if args.explain is not None:
        from kvoffload.cli.keydoc import explain

        Console(highlight=False).print(explain(args.explain), markup=False, soft_wrap=True)
        return 0
    if args.inventory is None:
        from kvoffload.errors import UserError

        raise UserError("plan: give an inventory (hosts.yml); only `plan --explain KEY` needs none")
    lab = load_lab(args.inventory, args.campaign)
    check_folder_flag(args.results, "--results")
    check_sim_profile(lab.campaign, lab.where)
    check_host_addresses(lab.inventory)
    # before --emit-extravars too: a plain Ansible run installs the same engine set
    engine_warnings = check_engine_pins(lab)
    if args.emit_extravars is not None:
        return cellvars.emit(lab, args, _schedule)
    if args.finish_cell is not None:
        return cellvars.finish(lab, args)
    check_dataset_path(lab.campaign, lab.dataset_path, lab.where)  # before the first line printed
    campaign = lab.campaign
    console = Console()
    if not console.is_terminal:
        # Piped or captured output: do not squeeze the cell table into 80 columns.
        console = Console(width=160)
    console.print(
        f"[bold]campaign[/] {campaign.name}: model {campaign.model}, engine {campaign.engine}"
        + (f" ({campaign.sim_profile})" if campaign.sim_profile else "")
        + f", gpu vendor {campaign.gpu_vendor}, cold start by {campaign.cold_start}"
    )
    for node in lab.nodes:
        lmcache, lb = lab.node_lmcache(node), lab.node_lb(node)
        console.print(
            f"node {node.name}: {len(node.replicas)} replica(s); "
            f"lmcache: {lmcache.name if lmcache else '-'}; lb: {lb.name if lb else '-'}"
        )
    for line in _engine_set_lines(lab):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(f"dataset: {campaign.dataset.code} at {lab.dataset_path}")
    from kvoffload.tokenizer import describe

    tokenizer = _tokenizer(lab)
    console.print(f"tokens (isl, token table) counted by {describe(tokenizer)}")

    ceilings, why, sessions = _ceilings(lab)
    if ceilings is None:
        console.print(f"[yellow]warning:[/] {why}")
    else:
        table = Table(title="virtual-user ceiling (before the isl depth filter)")
        table.add_column("num_rounds", justify="right")
        table.add_column("virtual users", justify="right")
        for rounds, users in ceilings.items():
            table.add_row(str(rounds), str(users))
        console.print(table)
        console.print(_token_table(lab, sessions, tokenizer))

    results = CampaignPaths(args.results / campaign.name)
    done_root = results.cells_dir
    todo = [c for c in lab.cells if not results.cell(c.id).done.is_file()]
    where, method, order = _schedule(lab, todo, ceilings is not None)
    cells = Table(title=f"cells of {campaign.name} ({len(lab.cells)}), in run order per node")
    for column in (
        "node",
        "#",
        "id",
        "tier",
        "conc",
        "rounds",
        "isl",
        "osl",
        "rep",
        "engine",
        "lmcache",
        "caddy",
        "cold start",
        "status",
    ):
        cells.add_column(column, no_wrap=True)
    warnings = []
    done = 0
    ranked = sorted(lab.cells, key=lambda c: (where.get(c.id, ""), order.get(c.id, -1)))
    for cell in ranked:
        is_done = cell.id not in where
        done += is_done
        node = lab.node(where[cell.id]) if not is_done else lab.nodes[0]
        cells.add_row(
            where.get(cell.id, "-"),
            str(order[cell.id] + 1) if cell.id in order else "-",
            cell.id,
            cell.tier,
            str(cell.concurrency),
            str(cell.num_rounds),
            str(cell.isl),
            str(cell.osl),
            str(cell.repeat),
            cell.engine_profile,
            _lmcache_column(cell),
            _caddy_policy(cell.tier, len(node.replicas)),
            method.get(cell.id, "-"),
            "[green]DONE (skip)[/]" if is_done else "to run",
        )
        ceiling = ceilings.get(cell.num_rounds) if ceilings else None
        if ceiling is not None and cell.concurrency > ceiling:
            warnings.append(
                f"cell {cell.id} ({cell.tier}, concurrency {cell.concurrency}, num_rounds "
                f"{cell.num_rounds}): concurrency exceeds the dataset's {ceiling} virtual users; "
                f"the extra {cell.concurrency - ceiling} slots add no load"
            )
        elif campaign.max_sessions is not None and cell.concurrency > campaign.max_sessions:
            warnings.append(
                f"cell {cell.id} ({cell.tier}, concurrency {cell.concurrency}): concurrency exceeds "
                f"max_sessions {campaign.max_sessions}; the extra slots add no load"
            )
    warnings += held_level_warnings(campaign, ceilings)
    console.print(cells)
    from kvoffload.orchestrate.installs.client_plan import client_plan

    pool = client_plan(lab, where, lab.cells, results)
    for line in pool.lines():
        console.print(line)
    warnings += pool.warnings
    knee = campaign.knee_spec()
    if knee is not None:
        limits = []
        p95, hit_rate = campaign.knee_limits()
        if p95 is not None:
            limits.append(f"later-round p95 TTFT exceeds {p95:g} s")
        if hit_rate is not None:
            limits.append(f"the later-round hit rate falls below {100 * hit_rate:g} %")
        if campaign.slo is not None and campaign.slo.ttft_p50_s is not None:
            limits.append(f"later-round p50 TTFT exceeds {campaign.slo.ttft_p50_s:g} s")
        if campaign.slo is not None and campaign.slo.tpot_p95_s is not None:
            limits.append(f"later-round p95 TPOT exceeds {campaign.slo.tpot_p95_s:g} s")
        console.print(
            f"knee search: then, per tier on node {lab.nodes[0].name}, concurrency grows x{knee.factor:g} "
            f"from the measured cells (up to {knee.max_concurrency}) until {' or '.join(limits)}, and "
            f"bisects to a bracket of {knee.resolution}; its cells are decided as it goes"
        )
        warnings += _knee_load_warnings(lab, sessions, tokenizer, ceilings is not None)
    warnings += _gpu_room_warnings(lab)
    warnings += _l1_memory_warnings(lab, results.root, console)
    if campaign.slo is not None:
        from kvoffload.config.slo import missing_prices

        warnings += missing_prices(lab.prices, list(campaign.tiers))
    warnings += engine_warnings
    for line in warnings:
        console.print(f"[yellow]warning:[/] {line}")
    console.print(f"{len(lab.cells) - done} cell(s) to run, {done} already DONE under {done_root}")
    if todo:
        console.print(_estimate_table(lab, todo, results.root, ceilings is not None))
    return 0


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _estimate_table(lab: Any, todo: list[Any], results: Path, known: bool) -> Any:
    """How long `run` will take, per node and in total (kvoffload/orchestrate/campaign/estimate.py)."""
    from rich.table import Table

    from kvoffload.orchestrate.campaign.estimate import PHASES
    from kvoffload.orchestrate.campaign.estimate_inputs import campaign_estimate

    requests = users = None
    if known:
        from kvoffload.orchestrate.campaign.pools import CellPools

        pools = CellPools(lab)
        requests, users = pools.expected, pools.users
    e = campaign_estimate(lab, todo, results, requests, users)
    sources = e.priors.sources
    names = {
        "install": "install",
        "engine_start": "engine starts",
        "replay": "replays",
        "overhead": "overhead",
    }
    title = (
        f"estimated wall time: {_minutes(e.total_s)} (the run's start {_minutes(e.priors.campaign_s)}, "
        "then the slowest node)"
    )
    table = Table(title=title, title_justify="left", caption_justify="left")
    for column in ("node", "cells", *[names[p] for p in PHASES], "node total"):
        table.add_column(column, justify="left" if column == "node" else "right")
    for node, total in e.nodes.items():
        mine = [c for c in e.cells if e.where[c] == node]
        sums = [sum(e.cells[c][p] for c in mine) for p in PHASES]
        table.add_row(node, str(len(mine)), *[_minutes(v) for v in sums], _minutes(total))
    knee = e.knee
    table.caption = (
        f"from: install {sources['install_s']} ({e.priors.install_s:.0f} s a node), engine start "
        f"{sources['engine_start_s']} ({e.priors.engine_start_s:.0f} s), a request "
        f"{sources['request_s']} ({e.priors.request_s:.2f} s alone), overhead {sources['cell_overhead_s']} "
        f"({e.priors.cell_overhead_s:.0f} s a cell), the run's start {sources['campaign_s']}; replays: "
        f"{e.basis}, x{e.priors.replay_scale:.2f} ({sources['replay_scale']})"
        + (
            f"; knee search, not in the total: up to {knee.cells} more cell(s), {_minutes(knee.total_s)} "
            "(its worst case over every place the knee could be)"
            if knee is not None
            else ""
        )
    )
    return table
