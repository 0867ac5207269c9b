"""`kvoffload-lab lab up|down|status|image|tiny-model`: the virtual lab of nspawn hosts on this machine.

Thin layer over `kvoffload.lab.lifecycle` (and `kvoffload.lab.tinymodel`, the real-engine lane's model):
parses flags, renders results with rich. The lab is for the demo and the lab tests; real labs are
described by an inventory and never touched by this command.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from kvoffload.errors import UserError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "lab",
        help="bring a virtual lab of systemd hosts up or down on this machine (root)",
        description=(
            "A virtual lab: Debian 12 systemd-nspawn hosts on a private bridge, with ssh keys, a loop "
            "device as the lmcache host's NVMe, and an Ansible inventory for them. State lives in "
            "$KVOFFLOAD_LAB_STATE or <cache>/state; images in <cache>/images, where <cache> is "
            "$KVOFFLOAD_LAB_CACHE or /var/cache/kvoffload-lab."
        ),
    )
    sub = parser.add_subparsers(dest="lab_command", metavar="ACTION", required=True)
    up = sub.add_parser(
        "up",
        help="build the image if needed and boot the hosts; writes the inventory",
        description=(
            "Boot a virtual lab on this machine (root, Debian): systemd-nspawn hosts on a private bridge, "
            "the first --clients the client hosts, the next --nodes each a node with 2 replicas and a "
            "loop-device NVMe. "
            "The base image is built once and cached. Writes an Ansible inventory (--inventory) for "
            "`plan`, `run` and `teardown`; `lab down` stops everything it started."
        ),
    )
    up.add_argument(
        "--hosts", type=int, default=2, help="number of hosts (default 2: the client, a node with 2 replicas)"
    )
    up.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="how many of the hosts after the client are nodes, each with 2 replicas, its own "
        "lmcache-server, Caddy and loop-device NVMe (default 1); a campaign runs its comparison "
        "groups on the nodes in parallel",
    )
    up.add_argument(
        "--clients",
        type=int,
        default=1,
        help="how many of the first hosts are client hosts (default 1); the nodes after them are shared "
        "out among them, each node replayed from one client host",
    )
    up.add_argument("--bridge", default="kvlab0", help="name of the private bridge (default kvlab0)")
    up.add_argument(
        "--subnet", default="10.213.0.0/24", help="private /24 of the lab (default 10.213.0.0/24)"
    )
    up.add_argument("--prefix", default="kvlab", help="host name prefix: <prefix>1..N (default kvlab)")
    up.add_argument(
        "--inventory",
        type=Path,
        default=Path("inventories/local/hosts.yml"),
        help="where to write the lab's inventory (default inventories/local/hosts.yml)",
    )
    up.add_argument("--nvme-size-mb", type=int, default=512, help="size of the loop-device NVMe (MiB)")
    up.set_defaults(func=_up)
    down = sub.add_parser(
        "down", help="stop every lab host by PID, detach the loop device, delete the bridge"
    )
    down.set_defaults(func=_down)
    status = sub.add_parser("status", help="show the lab's hosts; exit 0 only when all answer over ssh")
    status.set_defaults(func=_status)
    image = sub.add_parser("image", help="build (or reuse) the cached base image; --podman also imports it")
    image.add_argument("--rebuild", action="store_true", help="rebuild even if a cached image matches")
    image.add_argument("--podman", action="store_true", help="import it into podman for molecule")
    image.set_defaults(func=_image)
    tiny = sub.add_parser(
        "tiny-model",
        help="build (or reuse) a tiny random-weight Llama folder for the real-engine lane; prints its path",
        description=(
            "Writes a Hugging Face model folder that real vLLM can serve, with no download: the reference "
            "tiny Llama architecture, a byte-level BPE tokenizer trained on the shipped conversations "
            "(data/) and random bfloat16 weights. A folder already built from the same inputs is reused."
        ),
    )
    tiny.add_argument("out", type=Path, metavar="OUT", help="model folder to write (replaced only if ours)")
    tiny.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    tiny.set_defaults(func=_tiny_model)


def _up(args: argparse.Namespace) -> int:
    from kvoffload.lab.lifecycle import UpOptions, up

    if args.nvme_size_mb < 320:
        raise UserError("--nvme-size-mb: at least 320 (mkfs.xfs refuses smaller devices)")
    _check_up_flags(args)
    result = up(
        UpOptions(
            hosts=args.hosts,
            nodes=args.nodes,
            clients=args.clients,
            bridge=args.bridge,
            subnet=args.subnet,
            prefix=args.prefix,
            inventory=args.inventory,
            nvme_size_mb=args.nvme_size_mb,
        )
    )
    _print_status(result)
    print(f"inventory: {result.inventory}")
    return 0


def _check_up_flags(args: argparse.Namespace) -> None:
    """The flags `up` would refuse, checked before it looks at (or pings) an existing lab; the same
    rules as `lifecycle.up`, which also guards callers other than this command."""
    from kvoffload.lab.inventory import shape_problem
    from kvoffload.lab.network import plan_addresses

    if not 1 <= args.hosts <= 32:
        raise UserError(f"--hosts {args.hosts}: choose between 1 and 32 hosts")
    problem = shape_problem(args.hosts, args.nodes, args.clients)
    if problem is not None:
        raise UserError(problem)
    # nspawn names the host side of each veth "vb-<machine>", and link names stop at 15 characters.
    if len(f"vb-{args.prefix}{args.hosts}") > 15 or not args.prefix.isalnum():
        raise UserError(f"--prefix {args.prefix}: use up to 10 letters/digits")
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", args.bridge):
        raise UserError(f"--bridge {args.bridge!r}: a network link name of 1-15 letters, digits, . _ -")
    plan_addresses(args.subnet, args.hosts)  # raises naming --subnet
    if args.inventory.is_dir():
        raise UserError(f"--inventory {args.inventory}: is a folder; give the hosts.yml file to write")


def _down(args: argparse.Namespace) -> int:
    from kvoffload.lab.lifecycle import down

    print("lab torn down" if down() else "no lab recorded: nothing to do")
    return 0


def _status(args: argparse.Namespace) -> int:
    from kvoffload.lab.lifecycle import status

    result = status()
    if not result.hosts:
        print(f"no lab is up (state dir {result.state_dir})")
        return 1
    _print_status(result)
    return 0 if result.healthy else 1


def _image(args: argparse.Namespace) -> int:
    from kvoffload.lab.image import ensure_base_image, ensure_podman_image

    image = ensure_base_image(rebuild=args.rebuild)
    print(f"base image {image.key}: {image.rootfs}")
    if args.podman:
        print(f"podman image: {ensure_podman_image(image)}")
    return 0


def _tiny_model(args: argparse.Namespace) -> int:
    from kvoffload.lab.tinymodel import build_tiny_model

    if args.seed < 0:
        raise UserError(f"--seed {args.seed}: must be 0 or more")
    print(build_tiny_model(args.out, seed=args.seed))
    return 0


def _print_status(result: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"virtual lab on bridge {result.bridge} ({'up' if result.bridge_up else 'DOWN'})")
    for column in ("host", "address", "groups", "pid", "running", "ssh"):
        table.add_column(column)
    for host in result.hosts:
        table.add_row(
            host.name,
            host.ip,
            ",".join(host.groups),
            str(host.pid or "-"),
            "yes" if host.running else "NO",
            "yes" if host.ssh else "NO",
        )
    console = Console()
    console.print(table)
    if result.loop_device:
        console.print(f"NVMe stand-in: {result.loop_device}")
