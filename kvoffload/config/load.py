"""Reading an inventory (and optionally a campaign file) into one validated `LabConfig`.

The only module of `kvoffload.config` that reads files (the inventory, the group_vars/ and host_vars/
folders beside it, a campaign file). The campaign comes from `--campaign FILE` when given, else from
the inventory's `all.vars.kvoffload_campaign`. Rules that tie the campaign to the inventory (tiers
need an lmcache host, nvme needs an NVMe device there, offload tiers need every replica on the lmcache
host, 2+ replicas need an lb host, no two replicas on one address and port or one GPU) are checked here,
before any host is touched, and name the key in each file. YAML is read strictly: text that is not
UTF-8 and a key written twice in one mapping are errors naming the line (PyYAML would keep the last
value silently); ansible-vault values (`!vault`, or a vars file encrypted whole) pass through unread.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kvoffload.config.ansible_inventory import read_ansible_inventory
from kvoffload.config.campaign import Campaign
from kvoffload.config.cells import Cell, resolve_cells
from kvoffload.config.clients import assign_clients, client_problems
from kvoffload.config.errors import ConfigError, KeyedError, format_validation_error
from kvoffload.config.inventory import (
    CAMPAIGN_VAR,
    GROUPS,
    SHARED_GPU_FIX,
    Host,
    Inventory,
    build_inventory,
    check_yaml_layout,
)
from kvoffload.config.slo import PRICES_VAR, Prices, lab_prices


@dataclass(frozen=True)
class LabConfig:
    """A validated inventory + campaign and the campaign's cells."""

    inventory: Inventory
    campaign: Campaign
    campaign_file: str
    campaign_key: str
    dataset_path: Path
    cells: tuple[Cell, ...]
    # The campaign's model as a folder on the controller (shipped to the hosts), or None for a hub id.
    model_folder: Path | None = None
    # issue 42: the run's prices (the campaign's, or the nodes' kvoffload_prices) and where they are written
    prices: Prices | None = None
    prices_source: str | None = None

    def where(self, key: str) -> str:
        """`<campaign file>: <key path>` of a campaign key, as config errors spell it."""
        return f"{self.campaign_file}: {self.campaign_key + '.' if self.campaign_key else ''}{key}"

    @property
    def served_model_name(self) -> str:
        """The name requests carry: the folder's name for a shipped model, else the hub id."""
        return self.model_folder.name if self.model_folder is not None else self.campaign.model

    @property
    def replicas(self) -> list[tuple[Host, int]]:
        """(host, replica index) of every vLLM replica, in inventory order."""
        return [(host, r.index) for host in self.inventory.group("vllm") for r in host.replicas]

    @property
    def lmcache_host(self) -> Host | None:
        """The first node's lmcache host (`node_lmcache` for a given node)."""
        return self.node_lmcache(self.nodes[0]) if self.nodes else None

    @property
    def lb_host(self) -> Host | None:
        """The first node's Caddy host (`node_lb` for a given node)."""
        return self.node_lb(self.nodes[0]) if self.nodes else None

    @property
    def nodes(self) -> list[Host]:
        """The nodes: every host of group vllm, in inventory order. A run is node-local
        (docs/architecture.md section 3): a cell runs on one node, with that node's lmcache-server
        and Caddy."""
        return self.inventory.group("vllm")

    @property
    def multi_node(self) -> bool:
        return len(self.nodes) > 1

    def node(self, name: str) -> Host:
        return next(h for h in self.nodes if h.name == name)

    def node_lmcache(self, node: Host) -> Host | None:
        """Where `node`'s lmcache-server runs: the lmcache host of a one-node lab; with several nodes,
        the node itself when it is in group lmcache."""
        members = self.inventory.group("lmcache")
        if not self.multi_node:
            return members[0] if members else None
        return node if node in members else None

    def node_lb(self, node: Host) -> Host | None:
        """Where `node`'s Caddy runs: the lb host of a one-node lab; with several nodes, the node
        itself when it is in group lb."""
        members = self.inventory.group("lb")
        if not self.multi_node:
            return members[0] if members else None
        return node if node in members else None

    def node_hosts(self, node: Host) -> list[str]:
        """Inventory names of the hosts a cell on `node` deploys to (the node, its lmcache and lb)."""
        names = [node.name]
        for host in (self.node_lmcache(node), self.node_lb(node)):
            if host is not None and host.name not in names:
                names.append(host.name)
        return names

    @property
    def clients(self) -> list[Host]:
        """The client hosts (group client), in inventory order."""
        return self.inventory.group("client")

    @property
    def client_assignment(self) -> dict[str, str]:
        """node name -> the client host that replays its cells (kvoffload/config/clients.py)."""
        return assign_clients(self.nodes, self.clients)

    def client_of(self, node: Host) -> Host:
        """The client host that replays `node`'s cells."""
        return self.inventory.host(self.client_assignment[node.name])


VAULT_HEADER = "$ANSIBLE_VAULT;"


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key written twice in one mapping: PyYAML silently keeps the last one,
    so a host or group listed twice would lose its first definition without a word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            # `<<: *anchor` merges are meant to be overridden; only keys written out count.
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r} (first written on line {seen[key]})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _ansible_tagged(loader: yaml.SafeLoader, node: yaml.Node) -> str:
    """`!vault |` (an ansible-vault secret) and `!unsafe` values: kept as their text. Only Ansible
    can decrypt a secret, and this tool never reads one (the HF token goes to the hosts as is)."""
    return str(loader.construct_scalar(node)) if isinstance(node, yaml.ScalarNode) else ""


for _tag in ("!vault", "!unsafe"):
    _UniqueKeyLoader.add_constructor(_tag, _ansible_tagged)


def read_yaml(path: Path) -> Any:
    """Parse a YAML file; unreadable or malformed files raise `ConfigError` naming file and line."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            [f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}): is this the YAML file?"]
        ) from exc
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        if isinstance(exc, yaml.reader.ReaderError):
            # Control characters: the reader knows the offset only.
            where = f":{text[: exc.position].count(chr(10)) + 1}"
            problem = f"unacceptable character #x{exc.character:04x} (binary data?)"
        else:
            problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{path}{where}: invalid YAML: {problem}"]) from exc


def _var_files(folder: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """`group_vars/` or `host_vars/` beside an inventory: NAME.yml, NAME.yaml or NAME/*.yml, by NAME."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    if not folder.is_dir():
        return found
    for entry in sorted(folder.iterdir()):
        if entry.is_dir():
            files = sorted(p for p in entry.iterdir() if p.suffix in {".yml", ".yaml"})
            name = entry.name
        elif entry.suffix in {".yml", ".yaml"}:
            files, name = [entry], entry.stem
        else:
            continue
        for file in files:
            values = read_yaml(file)
            if values is None or (isinstance(values, str) and values.startswith(VAULT_HEADER)):
                continue  # empty, or encrypted whole by ansible-vault: only Ansible reads it
            if not isinstance(values, dict):
                raise ConfigError([f"{file}: (top level): a vars file must be a mapping of variables"])
            # Several files of one name (a folder) merge in name order; problems name the last one.
            previous = found.get(name, ("", {}))[1]
            found[name] = (str(file), {**previous, **values})
    return found


YAML_SUFFIXES = (".yml", ".yaml")


def load_inventory(path: Path | str) -> Inventory:
    """Read an inventory file as Ansible does (YAML or INI; a folder means its hosts.yml), with the
    group_vars/ and host_vars/ folders beside it, and validate it."""
    path = Path(path)
    if path.is_dir():
        path = path / "hosts.yml"
    is_yaml = path.suffix in YAML_SUFFIXES
    if is_yaml:
        # Our own reading first: its errors name the line, the column and the key as written.
        check_yaml_layout(read_yaml(path), str(path))
    elif not path.is_file():
        read_yaml(path)  # the same "cannot read" message as for a YAML file
    return build_inventory(
        str(path),
        read_ansible_inventory(path),
        group_files=_var_files(path.parent / "group_vars"),
        host_files=_var_files(path.parent / "host_vars"),
        inline_checked=is_yaml,
    )


def _check_inventory(inv: Inventory, campaign: Campaign, tiers_at: str) -> None:
    """The rules between groups, host vars and the campaign; all problems at once."""
    problems: list[str] = []
    f = inv.file
    problems += client_problems(inv)
    vllm = inv.group("vllm")
    if not vllm:
        problems.append(f"{f}: all.children.vllm: needs at least one host running vLLM replicas")
    for host in vllm:
        if not host.replicas:
            problems.append(
                f"{f}: host {host.name} (group vllm): vllm_replicas is missing or empty: "
                'give it e.g. [{index: 0, gpus: "0"}]'
            )
    # Two inventory names for one address (a host written twice) would start two replicas on one port.
    listening: dict[tuple[str, int], str] = {}
    for host in vllm:
        for i, replica in enumerate(host.replicas):
            owner = listening.setdefault((host.address, replica.index), host.name)
            if owner != host.name:
                problems.append(
                    f"{f}: host {host.name} (group vllm): vllm_replicas[{i}] (index {replica.index}) would "
                    f"listen on the same address {host.address} and port as a replica of host {owner}: "
                    "list each machine once, or give the replicas different indexes"
                )
    problems += _shared_gpu_problems(inv)
    offload = [t for t in campaign.tiers if t != "gpu"]
    if len(vllm) > 1:
        problems += _node_problems(inv, campaign, tiers_at, offload)
        if problems:
            raise ConfigError(problems)
        return
    for group in ("lmcache", "lb"):
        members = inv.group(group)
        if len(members) > 1:
            names = ", ".join(h.name for h in members)
            problems.append(
                f"{f}: all.children.{group}: at most one host with one node in vllm, has {len(members)} "
                f"({names}); with several nodes each node is its own {group} host"
            )
    lmcache = inv.group("lmcache")
    if offload and not lmcache:
        problems.append(
            f"{f}: all.children.lmcache: tiers {', '.join(offload)} ({tiers_at}) need "
            "exactly one host in group lmcache"
        )
    if "nvme" in campaign.tiers and len(lmcache) == 1 and not lmcache[0].nvme_devices:
        problems.append(
            f"{f}: host {lmcache[0].name}: nvme_storage_devices is empty, but {tiers_at} has "
            "nvme: list the NVMe device for the L2 cache on the lmcache host"
        )
    if offload and len(lmcache) == 1:
        # LMCache's MP server maps each replica's KV through CUDA IPC, found by GPU UUID: a replica on
        # another host fails ("Device UUID ... not found"), so a cpu/nvme run is node-local.
        away = [h.name for h in vllm if h.replicas and h.name != lmcache[0].name]
        if away:
            problems.append(
                f"{f}: all.children.vllm: tiers {', '.join(offload)} ({tiers_at}) need every vLLM "
                f"replica on the lmcache host {lmcache[0].name} (LMCache shares KV through CUDA IPC "
                f"inside one node), but {', '.join(away)} also has vllm_replicas: move the replicas "
                "to the lmcache host, or drop the cpu and nvme tiers"
            )
    replicas = sum(len(h.replicas) for h in vllm)
    if replicas >= 2 and not inv.group("lb"):
        problems.append(f"{f}: all.children.lb: {replicas} vLLM replicas need one host in group lb (Caddy)")
    if problems:
        raise ConfigError(problems)


def _shared_gpu_problems(inv: Inventory) -> list[str]:
    """Replicas of one machine listed under two inventory names (one address) that share a GPU: each
    host's own replicas were checked when its variables were read (inventory.py), not across names."""
    problems: list[str] = []
    owners: dict[tuple[str, str], tuple[str, int]] = {}
    for host in inv.group("vllm"):
        for i, replica in enumerate(host.replicas):
            for gpu in replica.gpus.split(","):
                owner, j = owners.setdefault((host.address, gpu), (host.name, i))
                if owner != host.name:
                    problems.append(
                        f"{inv.file}: host {host.name} (group vllm): vllm_replicas[{i}].gpus: GPU {gpu} is "
                        f"also given to vllm_replicas[{j}] of host {owner}, the same machine "
                        f"({host.address}): {SHARED_GPU_FIX}, and list each machine once"
                    )
    return problems


def _node_problems(inv: Inventory, campaign: Campaign, tiers_at: str, offload: Sequence[str]) -> list[str]:
    """Rules of a lab of several nodes: each node runs its own lmcache-server and Caddy (a run is
    node-local), so the lmcache and lb groups hold nodes only, and every node is in them as needed."""
    f = inv.file
    problems: list[str] = []
    nodes = inv.group("vllm")
    for group in ("lmcache", "lb"):
        away = [h.name for h in inv.group(group) if h not in nodes]
        if away:
            problems.append(
                f"{f}: all.children.{group}: {', '.join(away)} is not a node (group vllm): with several "
                f"nodes each node runs its own {group} service, so list nodes only"
            )
    for node in nodes:
        if offload and "lmcache" not in node.groups:
            problems.append(
                f"{f}: host {node.name} (group vllm): tiers {', '.join(offload)} ({tiers_at}) need "
                "every node in group lmcache (its replicas share KV with a server on the same node)"
            )
        if "nvme" in campaign.tiers and not node.nvme_devices:
            problems.append(
                f"{f}: host {node.name}: nvme_storage_devices is empty, but {tiers_at} has nvme: "
                "every node needs the NVMe device for its L2 cache"
            )
        if len(node.replicas) >= 2 and "lb" not in node.groups:
            problems.append(
                f"{f}: host {node.name} (group vllm): {len(node.replicas)} replicas need Caddy on the "
                "node: add it to group lb"
            )
    return problems


def is_model_path(model: str) -> bool:
    """A model written as a path (absolute, ./ or ../, or ~) rather than a Hugging Face hub id."""
    return model.startswith(("/", "./", "../", "~")) or model in {".", ".."}


def _model_folder(model: str, campaign_file: Path, key: str) -> Path | None:
    """The controller folder of a model given as a path; a hub id gives None."""
    where = f"{campaign_file}: {key + '.' if key else ''}model"
    if not is_model_path(model):
        if any(c.isspace() or c == "'" for c in model):
            # A hub id goes into the vLLM unit's ExecStart, which cannot carry these.
            raise ConfigError([f"{where}: {model!r} holds whitespace or a single quote: give a hub id"])
        return None
    folder = Path(model).expanduser()
    if not folder.is_absolute():
        folder = Path(os.path.normpath(campaign_file.parent / folder))
    if not (folder / "config.json").is_file():
        raise ConfigError(
            [
                f"{where}: {model!r} is a path but {folder} is not a model folder (no config.json): "
                "give a Hugging Face model folder on this controller (it is shipped to the hosts), or a "
                "hub id such as Qwen/Qwen3-8B (downloaded on the hosts)"
            ]
        )
    if any(c.isspace() or c == "'" for c in folder.name):
        raise ConfigError([f"{where}: the folder name {folder.name!r} holds a space or quote"])
    return folder


def _read_campaign_file(path: Path) -> tuple[Any, str]:
    """A campaign file's mapping and the key it sits under: the file's top level, or (like an
    inventory) kvoffload_campaign."""
    raw = read_yaml(path)
    if isinstance(raw, dict) and set(raw) == {CAMPAIGN_VAR}:
        return raw[CAMPAIGN_VAR], CAMPAIGN_VAR
    return raw, ""


def _validate_campaign(raw: Any, campaign_file: Path, key: str) -> Campaign:
    if not isinstance(raw, dict):
        raise ConfigError([f"{campaign_file}: {key or '(top level)'}: a campaign must be a mapping"])
    try:
        return Campaign.model_validate(raw)
    except ValidationError as exc:
        raise format_validation_error(exc, campaign_file, key, Campaign) from exc


def campaign_dataset_path(campaign: Campaign, campaign_file: Path) -> Path:
    """The dataset on the controller: `dataset.path`, relative to the file that declares it."""
    dataset = Path(campaign.dataset.path)
    if not dataset.is_absolute():
        dataset = Path(os.path.normpath(campaign_file.parent / dataset))
    return dataset


def load_campaign(path: Path | str) -> tuple[Campaign, str]:
    """A campaign file on its own (no inventory rules), validated; with the key it sits under."""
    raw, key = _read_campaign_file(Path(path))
    return _validate_campaign(raw, Path(path), key), key


def _lab_prices(inv: Inventory, campaign: Campaign, where: str) -> tuple[Prices | None, str | None]:
    """The campaign's `prices` or the nodes' `kvoffload_prices` (config/slo.py `lab_prices`)."""
    nodes = []
    for host in inv.group("vllm"):
        file, key = host.var_sources.get(PRICES_VAR, (inv.file, f"host {host.name}.{PRICES_VAR}"))
        nodes.append((host.name, host.vars.model_extra or {}, f"{file}: {key}"))
    try:
        return lab_prices(campaign.prices, where, nodes)
    except KeyedError as exc:
        raise ConfigError([f"{exc.key}: {exc}"]) from exc


def load_lab(inventory_path: Path | str, campaign_path: Path | str | None = None) -> LabConfig:
    """Inventory + campaign, validated together, with the campaign's cells resolved."""
    inventory = load_inventory(inventory_path)
    if campaign_path is not None:
        campaign_file = Path(campaign_path)
        raw, key = _read_campaign_file(campaign_file)
    else:
        source, key = inventory.all_var_sources.get(
            CAMPAIGN_VAR, (inventory.file, f"all.vars.{CAMPAIGN_VAR}")
        )
        campaign_file = Path(source)
        raw = inventory.all_vars.get(CAMPAIGN_VAR)
        if raw is None:
            raise ConfigError([f"{campaign_file}: {key}: no campaign here: add one, or pass --campaign FILE"])
    campaign = _validate_campaign(raw, campaign_file, key)
    _check_inventory(inventory, campaign, f"{campaign_file}: {key + '.' if key else ''}tiers")
    prices, prices_source = _lab_prices(
        inventory, campaign, f"{campaign_file}: {key + '.' if key else ''}prices"
    )
    return LabConfig(
        prices=prices,
        prices_source=prices_source,
        model_folder=_model_folder(campaign.model, campaign_file, key),
        inventory=inventory,
        campaign=campaign,
        campaign_file=str(campaign_file),
        campaign_key=key,
        dataset_path=campaign_dataset_path(campaign, campaign_file),
        cells=tuple(resolve_cells(campaign)),
    )


__all__ = [
    "GROUPS",
    "LabConfig",
    "campaign_dataset_path",
    "load_campaign",
    "load_inventory",
    "load_lab",
    "read_yaml",
]
