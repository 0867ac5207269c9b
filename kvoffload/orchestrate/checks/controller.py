"""Checks the lab commands (`plan`, `run`, `demo`, `doctor`) make on the controller, before any host.

Orchestration layer, below the CLI (which calls them before it creates a results folder).

What the config models cannot know on their own (they read only the YAML): that the dataset is on
this machine, loads and yields virtual users at every num_rounds, that every host has an address this
machine can reach it by, that a simulator profile name is one we ship, that a folder given as a flag
is not a file, that an engine set's pins agree on one torch. Every failure is a `UserError` naming the
file and the key, or the flag. Reads local files and asks this machine's resolver (host names without
an IPv4 ansible_host, docs/contracts.md "Host addresses"); never a host.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kvoffload.errors import UserError

if TYPE_CHECKING:
    from kvoffload.config import Campaign, Inventory, LabConfig
    from kvoffload.datasets import Session

Where = Callable[[str], str]


def campaign_where(campaign_file: Path | str, key: str) -> Where:
    """`<file>: <key path>` of a campaign key, for a campaign under `key` ('' for a file's top level)."""
    return lambda name: f"{campaign_file}: {key + '.' if key else ''}{name}"


def check_folder_flag(path: Path, flag: str) -> None:
    """A folder the command creates or fills must not be an existing file."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path}: exists and is not a folder; give a folder (created if missing)")


def check_sim_profile(campaign: Campaign, where: Where) -> None:
    """A simulator profile given by name must be a shipped one (a path is resolved on the hosts)."""
    name = campaign.sim_profile
    if campaign.engine != "sim" or name is None or "/" in name or name.endswith((".yaml", ".yml")):
        return
    from kvoffload.sim.profile import shipped_profiles

    shipped = shipped_profiles()
    if name not in shipped:
        raise UserError(
            f"{where('sim_profile')}: unknown simulator profile {name!r}; shipped profiles are "
            f"{', '.join(shipped)} (or give the path of a profile YAML on the vLLM hosts)"
        )


def check_engine_pins(lab: LabConfig) -> list[str]:
    """The engine set of every node resolves (kvoffload/engines/lab.py: a name that exists, a build
    that fits the node and the GPU vendor, a source for a set that is on no public index) and its pins
    agree on one torch (kvoffload/engines/pins.py): else a UserError naming the file, the key (both pins
    for a conflict), before the wheelhouse is built or anything is installed. Returns warnings: what
    could not be checked (a release the table does not know, a pin that is not exact)."""
    from kvoffload.engines.lab import lab_sets
    from kvoffload.engines.pins import PinSet, check_engine_set

    warnings: list[str] = []
    for found, _nodes in lab_sets(lab):
        pins = PinSet(found.spec.build, tuple(found.spec.requirements), f"{found.where}.requirements")
        warnings += check_engine_set(pins)
    return warnings


def load_campaign_dataset(campaign: Campaign, dataset_path: Path, where: Where) -> list[Session]:
    """The campaign's dataset, loaded as the replay will; it must yield users at every num_rounds."""
    from kvoffload.datasets import load_dataset

    check_dataset_path(campaign, dataset_path, where)
    try:
        sessions = load_dataset(campaign.dataset.code, dataset_path)
    except UserError as exc:
        raise UserError(f"{where('dataset')} (code {campaign.dataset.code}): {exc}") from exc
    longest = max(len(s.calls) for s in sessions)
    for i, rounds in enumerate(campaign.num_rounds):
        if rounds > longest:
            raise UserError(
                f"{where(f'num_rounds[{i}]')}: {rounds} yields no virtual users from dataset {dataset_path} "
                f"(its longest session has {longest} calls)"
            )
    return sessions


def check_dataset_path(campaign: Campaign, dataset_path: Path, where: Where) -> None:
    """`run` ships the dataset from this machine to the client hosts, so it must be here: a path that
    does not exist is bad input for `plan` as for `run` (else `plan` would estimate replays of nothing)."""
    if dataset_path.exists():
        return
    given = campaign.dataset.path
    relative = "" if Path(given).is_absolute() else f" ({given!r}, from the folder of the file that sets it)"
    raise UserError(
        f"{where('dataset.path')}: {dataset_path}{relative} does not exist on this machine: `run` ships the "
        "dataset from here to the client hosts; put the dataset file or folder there, or give its path"
    )


# How long `plan` and `run` wait for this machine's resolver (all names at once): a name that takes
# longer would fail Ansible's ssh and the replay's metric URLs the same way.
RESOLVE_TIMEOUT_S = 5.0


def lookup(name: str) -> None:
    """Resolve `name` as ssh and the client's metric URLs will (raises OSError when it does not)."""
    socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)


def unresolved(names: Sequence[str], timeout_s: float = RESOLVE_TIMEOUT_S) -> dict[str, str]:
    """The names this machine does not resolve, each with why; all asked at once, for `timeout_s` in all
    (getaddrinfo has no timeout of its own: a name still unanswered then counts as unresolved)."""
    answers: dict[str, BaseException | None] = {}

    def ask(name: str) -> None:
        try:
            lookup(name)
        except BaseException as exc:  # handed to the caller's thread below
            answers[name] = exc
        else:
            answers[name] = None

    threads = [threading.Thread(target=ask, args=(n,), name=f"resolve-{n}", daemon=True) for n in names]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    out: dict[str, str] = {}
    for name in names:
        if name not in answers:
            out[name] = f"no answer from this machine's resolver in {timeout_s:g} s"
            continue
        exc = answers[name]
        if exc is None:
            continue
        if not isinstance(exc, OSError):
            raise exc
        out[name] = exc.strerror or str(exc)  # gaierror: "Name or service not known"
    return out


def _ipv4(address: str) -> bool:
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        return False
    return True


def check_host_addresses(inventory: Inventory) -> None:
    """Every host of the inventory has an address (docs/contracts.md "Host addresses"): its
    `ansible_host`, else its inventory name, an IPv4 address or a name this machine resolves. Ansible
    reaches a host there (preflight runs on every host) and the client host scrapes its metrics there,
    so a host without one would fail `run` after the other hosts were provisioned."""
    problems: list[str] = []
    names: dict[str, list[str]] = {}  # address to resolve -> the hosts it is the address of
    for host in inventory.hosts:
        address = host.address
        if host.vars.ansible_host is None and ":" in address:
            problems.append(
                f"{inventory.file}: host {host.name}: ansible_host is missing, and the inventory name is "
                "an IPv6 literal, which metric targets and Caddy upstreams (address:port) cannot carry: "
                "give the host an IPv4 address or a host name as its ansible_host"
            )
        elif not _ipv4(address):
            names.setdefault(address, []).append(host.name)
    failed = unresolved(list(names)) if names else {}
    for address, why in failed.items():
        for name in names[address]:
            host = inventory.host(name)
            if host.vars.ansible_host is None:
                problems.append(
                    f"{inventory.file}: host {name}: ansible_host is missing, and the inventory name "
                    f"{name!r} is no IPv4 address and does not resolve on this machine ({why}): give the "
                    "host's address as its ansible_host (an IPv4 address, or a name that resolves here "
                    "and on the lab's hosts)"
                )
                continue
            file, key = host.var_sources.get("ansible_host", (inventory.file, f"host {name}: ansible_host"))
            problems.append(
                f"{file}: {key}: {address!r} does not resolve on this machine ({why}): give the host's "
                "IPv4 address, or a name that resolves here and on the lab's hosts"
            )
    if problems:
        raise UserError("\n".join(problems))
