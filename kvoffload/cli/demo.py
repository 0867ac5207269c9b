"""`kvoffload-lab demo`: the main job on this machine, end to end, with nothing but root and Debian 12.

Brings up the virtual lab (a client host and, by default, two nodes, each with two replicas, its
lmcache-server, Caddy and a loop-device NVMe), runs a shipped campaign (its comparison groups in
parallel, one per node), writes the report and tears the lab down, also on failure or Ctrl-C.

- `--engine sim` (default; `make demo` runs exactly this): the simulator, gpu, cpu and nvme tiers at two
  concurrencies that overflow GPU KV (gpu crosses the latency target between them), each held for more
  than a session by 64 recorded tau2-bench users and run twice, so the decision rests on held loads
  and two runs.
- `--engine vllm`: REAL vLLM (its CPU build) and the REAL LMCache server (CPU mode) serving a tiny
  random-weight Llama the project builds itself, on every tier: it proves the roles, flags, endpoints
  and metric names on real software (function, not timing). The first run downloads about 1 GB of
  wheels into the wheel cache; later runs reuse them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvoffload.cli.args import add_command, add_results_argument
from kvoffload.orchestrate.checks.controller import (
    campaign_where,
    check_folder_flag,
    check_sim_profile,
    load_campaign_dataset,
)

DEMO_CAMPAIGNS = {
    "sim": Path("inventories/local/campaign-demo.yml"),
    "vllm": Path("inventories/local/campaign-vllm.yml"),
}
DEMO_INVENTORY = Path("inventories/local/hosts.yml")
DEFAULT_NODES = 2  # the demo's two comparison groups run at once, one per node


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "demo",
        help="lab up -> demo campaign (simulator, 3 tiers) -> report -> lab down (root)",
        func=demo,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the module docstring, laid out by hand
    )
    p.add_argument(
        "--engine",
        choices=sorted(DEMO_CAMPAIGNS),
        default="sim",
        help="sim: the simulator (default); vllm: real vLLM (CPU build) and real LMCache (CPU mode)",
    )
    p.add_argument(
        "--campaign",
        type=Path,
        help=f"campaign file (default {DEMO_CAMPAIGNS['sim']}; with --engine vllm {DEMO_CAMPAIGNS['vllm']})",
    )
    add_results_argument(p)
    p.add_argument(
        "--nodes",
        type=int,
        choices=range(1, 5),
        default=DEFAULT_NODES,
        metavar="N",
        help=f"nodes of the virtual lab, 1-4 (default {DEFAULT_NODES}); the campaign's comparison groups "
        "run on them in parallel",
    )
    p.add_argument(
        "--keep-lab", action="store_true", help="leave the lab up afterwards (`lab down` stops it)"
    )
    p.add_argument(
        "--resume", action="store_true", help="resume the last demo campaign instead of a fresh one"
    )
    p.add_argument(
        "--watch",
        action="store_true",
        help="serve the live page beside the campaign on 127.0.0.1:8765 (see `run --watch`); prints its URL",
    )


def demo(args: argparse.Namespace) -> int:
    from kvoffload.cli.main import main as kvoffload_lab
    from kvoffload.lab.lifecycle import UpOptions, down, require_root, status, up

    campaign = args.campaign or DEMO_CAMPAIGNS[args.engine]
    _check_campaign(campaign, args.results)
    require_root()
    if args.engine == "vllm":
        from kvoffload.lab.paths import cache_root
        from kvoffload.lab.tinymodel import build_tiny_model

        model = build_tiny_model(cache_root() / "models" / "tiny-llama")
        print(f"demo: tiny random-weight Llama in {model}", file=sys.stderr)
    hosts = args.nodes + 1
    current = status()
    if not current.healthy or len(current.hosts) != hosts:
        down()  # a half-up lab from an earlier failure, or one of another size: start clean
    print(
        f"demo: bringing up the virtual lab ({hosts} systemd-nspawn hosts: the client and "
        f"{args.nodes} node(s))...",
        file=sys.stderr,
    )
    up(UpOptions(hosts=hosts, nodes=args.nodes, inventory=DEMO_INVENTORY))
    try:
        # `kvoffload-lab run` on the virtual lab's inventory, as a user would type it (run's defaults
        # otherwise: the wheel cache, a wheelhouse for the Python the lab's hosts report, every cell)
        run = ["run", str(DEMO_INVENTORY), "--campaign", str(campaign), "--results", str(args.results)]
        run += [] if args.resume else ["--fresh"]
        run += ["--watch"] if args.watch else []
        return kvoffload_lab(["-v", *run] if args.verbose else run)
    finally:
        if not args.keep_lab:
            print("demo: tearing the virtual lab down", file=sys.stderr)
            down()


def _check_campaign(campaign_file: Path, results: Path) -> None:
    """The campaign file, its dataset and --results, checked before the lab is touched: the lab's
    inventory exists only once it is up, so the rules that need it wait for `run`."""
    from kvoffload.config import campaign_dataset_path, load_campaign

    campaign, key = load_campaign(campaign_file)
    where = campaign_where(campaign_file, key)
    check_sim_profile(campaign, where)
    load_campaign_dataset(campaign, campaign_dataset_path(campaign, campaign_file), where)
    check_folder_flag(results, "--results")
