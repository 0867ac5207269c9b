"""`kvoffload-lab demo`: the main job on this machine, end to end, with nothing but root and Debian 12.

Brings up the 3-host virtual lab (client+lb, two simulated replicas, lmcache-server and a loop-device
NVMe on the first replica host), runs the shipped demo campaign (gpu, cpu and nvme tiers, a
concurrency that fits GPU KV and one that overflows it, recorded tau2-bench conversations), writes the
report and tears the lab down, also on failure or Ctrl-C. `make demo` runs exactly this.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

DEMO_CAMPAIGN = Path("inventories/local/campaign-demo.yml")
DEMO_INVENTORY = Path("inventories/local/hosts.yml")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="lab up -> demo campaign (simulator, 3 tiers) -> report -> lab down (root)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--campaign", type=Path, default=DEMO_CAMPAIGN, help=f"campaign file (default {DEMO_CAMPAIGN})"
    )
    p.add_argument(
        "--results", type=Path, default=Path("results"), help="results base folder (default ./results)"
    )
    p.add_argument(
        "--keep-lab", action="store_true", help="leave the lab up afterwards (`lab down` stops it)"
    )
    p.add_argument(
        "--resume", action="store_true", help="resume the last demo campaign instead of a fresh one"
    )
    p.set_defaults(func=demo)


def demo(args: argparse.Namespace) -> int:
    from kvoffload.cli.run import DEFAULT_WHEEL_CACHE
    from kvoffload.cli.run import run as run_campaign
    from kvoffload.lab.lifecycle import UpOptions, down, require_root, status, up

    require_root()
    if not status().healthy:
        down()  # a half-up lab from an earlier failure: start clean
    print("demo: bringing up the virtual lab (3 systemd-nspawn hosts)...", file=sys.stderr)
    up(UpOptions(hosts=3, inventory=DEMO_INVENTORY))
    try:
        run_args = argparse.Namespace(
            inventory=DEMO_INVENTORY,
            campaign=args.campaign,
            results=args.results,
            wheel_cache=DEFAULT_WHEEL_CACHE,
            no_wheelhouse=False,
            cells=None,
            fresh=not args.resume,
            skip_provision=False,
            no_report=False,
        )
        return run_campaign(run_args)
    finally:
        if not args.keep_lab:
            print("demo: tearing the virtual lab down", file=sys.stderr)
            down()
