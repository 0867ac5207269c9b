"""`kvoffload-lab lab up|down|status|image|tiny-model`: the virtual lab of nspawn hosts on this machine.

Thin layer over `kvoffload.lab.lifecycle` (and `kvoffload.lab.tinymodel`, the real-engine lane's model):
parses flags, renders results with rich. The lab is for the demo and the lab tests; real labs are
described by an inventory and never touched by this command.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvoffload.cli.args import add_actions, add_command
from kvoffload.errors import UserError


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "lab",
        help="bring a virtual lab of systemd hosts up or down on this machine (root)",
        description="""
            A virtual lab: Debian 12 systemd-nspawn hosts on a private bridge, with ssh keys, a loop
            device as the lmcache host's NVMe, and an Ansible inventory for them. State lives in
            $KVOFFLOAD_LAB_STATE or <cache>/state; images in <cache>/images, where <cache> is
            $KVOFFLOAD_LAB_CACHE or /var/cache/kvoffload-lab.
            """,
    )
    sub = add_actions(parser, "lab_command")
    up = add_command(sub, "up", _up)
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
    add_command(sub, "down", _down)
    add_command(sub, "status", _status)
    image = add_command(sub, "image", _image)
    image.add_argument("--rebuild", action="store_true", help="rebuild even if a cached image matches")
    image.add_argument("--podman", action="store_true", help="import it into podman for molecule")
    tiny = add_command(sub, "tiny-model", _tiny_model)
    tiny.add_argument("out", type=Path, metavar="OUT", help="model folder to write (replaced only if ours)")
    tiny.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")


# The flags of `lab up`, each the UpOptions field of its name.
_UP_FLAGS = ("hosts", "nodes", "clients", "bridge", "subnet", "prefix", "inventory", "nvme_size_mb")


def _up(args: argparse.Namespace) -> int:
    """build the image if needed and boot the hosts; writes the inventory

    Boot a virtual lab on this machine (root, Debian): systemd-nspawn hosts on a private bridge, the first
    --clients the client hosts, the next --nodes each a node with 2 replicas and a loop-device NVMe. The base
    image is built once and cached. Writes an Ansible inventory (--inventory) for `plan`, `run` and
    `teardown`; `lab down` stops everything it started.
    """
    from kvoffload.lab.lifecycle import UpOptions, check_options, up

    if args.nvme_size_mb < 320:
        raise UserError("--nvme-size-mb: at least 320 (mkfs.xfs refuses smaller devices)")
    options = UpOptions(**{flag: getattr(args, flag) for flag in _UP_FLAGS})
    check_options(options)  # before `up` looks at (or pings) an existing lab, and without root
    result = up(options)
    _print_status(result)
    print(f"inventory: {result.inventory}")
    return 0


def _down(args: argparse.Namespace) -> int:
    """stop every lab host by PID, detach the loop device, delete the bridge"""
    from kvoffload.lab.lifecycle import down

    print("lab torn down" if down() else "no lab recorded: nothing to do")
    return 0


def _status(args: argparse.Namespace) -> int:
    """show the lab's hosts; exit 0 only when all answer over ssh"""
    from kvoffload.lab.lifecycle import status

    result = status()
    if not result.hosts:
        print(f"no lab is up (state dir {result.state_dir})")
        return 1
    _print_status(result)
    return 0 if result.healthy else 1


def _image(args: argparse.Namespace) -> int:
    """build (or reuse) the cached base image; --podman also imports it"""
    from kvoffload.lab.image import ensure_base_image, ensure_podman_image

    image = ensure_base_image(rebuild=args.rebuild)
    print(f"base image {image.key}: {image.rootfs}")
    if args.podman:
        print(f"podman image: {ensure_podman_image(image)}")
    return 0


def _tiny_model(args: argparse.Namespace) -> int:
    """build (or reuse) a tiny random-weight Llama folder for the real-engine lane; prints its path

    Writes a Hugging Face model folder that real vLLM can serve, with no download: the reference tiny Llama
    architecture, a byte-level BPE tokenizer trained on the shipped conversations (data/) and random bfloat16
    weights. A folder already built from the same inputs is reused.
    """
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
