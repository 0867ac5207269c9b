"""The inventory model: the hosts and groups Ansible reads from an inventory, as kvoffload-lab needs them.

Ansible parses the inventory (config/ansible_inventory.py: host ranges, INI or YAML, group order);
this module checks it through strict models. A YAML inventory's structure (`all`, groups with `hosts`,
`vars`, `children`) is strict too. Host variables are Ansible's and open-ended, so only the ones this
tool reads are typed and checked: `vllm_replicas` (vllm role) and `nvme_storage_devices`
(nvme_storage role), with the same shape the roles take, so the file feeds Ansible unchanged, and
`kvoffload_client` (which client host replays a node's cells; kvoffload.config.clients). Pure
validation of already-parsed data; no file IO.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError, field_validator

from kvoffload.config.ansible_inventory import AnsibleHost, AnsibleInventory
from kvoffload.config.errors import ConfigError, KeyedError, format_validation_error

GROUPS = ("vllm", "lmcache", "lb", "client")
CAMPAIGN_VAR = "kvoffload_campaign"
_GPUS = re.compile(r"^[0-9]+(,[0-9]+)*$")
_DOTTED = re.compile(r"^[0-9.]+$")
_LABEL = r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?$")
# vLLM's --gpu-memory-utilization is each replica's share of the whole card (vllm 0.32 wheel,
# vllm/config/cache.py `gpu_memory_utilization`: "per-instance ... two instances on the same GPU, set
# 0.5 for each"): two replicas on one GPU with the lab's share either fail to start or, with smaller
# ones, run on a shared card, which no cell means to measure. Also for one machine under two names.
SHARED_GPU_FIX = "replicas of one machine cannot share a GPU; give each replica GPUs of its own"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ReplicaSpec(_Strict):
    """One vLLM replica of a host (vllm role's `vllm_replicas` item)."""

    index: NonNegativeInt = Field(description="unit instance kvoffload-vllm@<index>, port 8000+index")
    gpus: str = Field(description='comma list of the GPU ids the replica sees, e.g. "0" or "0,1,2,3"')

    @field_validator("gpus")
    @classmethod
    def _gpu_list(cls, value: str) -> str:
        if not _GPUS.match(value):
            raise ValueError(f'must be a comma list of GPU ids such as "0" or "0,1", got {value!r}')
        ids = value.split(",")
        if len(set(ids)) != len(ids):
            raise ValueError(f"lists a GPU twice: {value!r}")
        return value


class NvmeDevice(_Strict):
    """One block device the nvme_storage role may format and mount for the L2 cache."""

    device: str = Field(pattern=r"^/dev/\S+$", description="block device path, e.g. /dev/nvme1n1")
    mount: str = Field(pattern=r"^/\S*$", description="absolute mount point, e.g. /mnt/kvoffload-nvme")
    fstype: str | None = Field(default=None, description="xfs or ext4 (default: the role's default)")
    wipe: bool = Field(
        default=False, examples=[True], description="allow destroying partitions or a foreign file system"
    )

    @field_validator("mount")
    @classmethod
    def _not_root(cls, value: str) -> str:
        if not value.strip("/"):
            raise ValueError(f"must be a mount point of its own such as /mnt/kvoffload-nvme, got {value!r}")
        return value

    @field_validator("fstype")
    @classmethod
    def _fs(cls, value: str | None) -> str | None:
        if value not in (None, "xfs", "ext4"):
            raise ValueError(f"must be xfs or ext4, got {value!r}")
        return value


class HostVars(BaseModel):
    """The host variables kvoffload-lab reads; every other Ansible variable passes through unchecked."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)

    ansible_host: str | None = Field(default=None, description="address to reach the host (default: name)")
    ansible_port: int | str | None = Field(
        default=None, examples=[2222], description="ssh port of the host (1-65535)"
    )
    vllm_replicas: list[ReplicaSpec] | None = Field(
        default=None, description="vLLM replicas on this host (hosts of group vllm)"
    )
    nvme_storage_devices: list[NvmeDevice] | None = Field(
        default=None, description="NVMe devices for the L2 cache (the lmcache host, nvme tier)"
    )
    kvoffload_client: str | None = Field(
        default=None,
        description="the client host (group client) that replays this node's cells (hosts of group "
        "vllm; default: the client hosts share the nodes evenly)",
    )

    @field_validator("ansible_host")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        # The address also goes into metric URLs and Caddy upstreams as `<address>:<port>`.
        if value is None:
            return value
        if ":" in value:
            raise ValueError(
                f"{value!r}: IPv6 literals are not supported (metric targets and Caddy upstreams are "
                "written as address:port); give an IPv4 address or a host name"
            )
        if _DOTTED.match(value):
            try:
                ipaddress.IPv4Address(value)
            except ValueError:
                raise ValueError(f"{value!r} is not a valid IPv4 address") from None
        elif not _HOSTNAME.match(value):
            raise ValueError(f"must be an IPv4 address or a host name such as gpu01.lab, got {value!r}")
        return value

    @field_validator("ansible_port", mode="before")
    @classmethod
    def _port(cls, value: Any) -> Any:
        # Before the int | str union, so that a bad value gets one message. Ansible takes "22" too.
        if value is None:
            return value
        number = int(value) if isinstance(value, str) and value.isascii() and value.isdigit() else value
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 65535:
            raise ValueError(f"must be a TCP port 1-65535, got {value!r}")
        return value

    @field_validator("nvme_storage_devices")
    @classmethod
    def _unique_devices(cls, value: list[NvmeDevice] | None) -> list[NvmeDevice] | None:
        devices: dict[str, int] = {}
        mounts: dict[str, int] = {}
        for i, nvme in enumerate(value or []):
            for key, seen, item in (("device", devices, nvme.device), ("mount", mounts, nvme.mount)):
                if item in seen:
                    raise KeyedError(
                        f"[{i}].{key}", f"{item} is also given to nvme_storage_devices[{seen[item]}]"
                    )
                seen[item] = i
        return value

    @field_validator("vllm_replicas")
    @classmethod
    def _unique_replicas(cls, value: list[ReplicaSpec] | None) -> list[ReplicaSpec] | None:
        seen_index: set[int] = set()
        seen_gpu: dict[str, int] = {}
        for i, replica in enumerate(value or []):
            if replica.index in seen_index:
                raise KeyedError(f"[{i}].index", f"index {replica.index} is used twice on this host")
            seen_index.add(replica.index)
            for gpu in replica.gpus.split(","):
                if gpu in seen_gpu:
                    raise KeyedError(
                        f"[{i}].gpus",
                        f"GPU {gpu} is also given to vllm_replicas[{seen_gpu[gpu]}]: {SHARED_GPU_FIX}",
                    )
                seen_gpu[gpu] = i
        return value


class GroupSpec(_Strict):
    """One Ansible group: hosts (name -> vars or null), group vars, child groups."""

    hosts: dict[str, dict[str, Any] | None] | None = Field(default=None, description="member hosts")
    vars: dict[str, Any] | None = Field(default=None, description="variables of every member")
    children: dict[str, GroupSpec | None] | None = Field(default=None, description="child groups")


@dataclass(frozen=True)
class Host:
    """A host with its groups and resolved variables."""

    name: str
    groups: frozenset[str]
    vars: HostVars
    # Where each of vars is written, the layer that wins: (file, key), e.g. (hosts.yml,
    # all.vars.kvoffload_python_engine_builds) or (group_vars/all.yml, kvoffload_python_engine_builds).
    var_sources: Mapping[str, tuple[str, str]] = field(default_factory=dict, compare=False)

    @property
    def address(self) -> str:
        return self.vars.ansible_host or self.name

    @property
    def replicas(self) -> list[ReplicaSpec]:
        return list(self.vars.vllm_replicas or [])

    @property
    def nvme_devices(self) -> list[NvmeDevice]:
        return list(self.vars.nvme_storage_devices or [])


@dataclass(frozen=True)
class Inventory:
    """The parsed inventory: hosts in file order, their groups, and all.vars."""

    file: str
    hosts: tuple[Host, ...]
    all_vars: dict[str, Any] = field(default_factory=dict)
    # Where each of all_vars is written: (file, key path), e.g. (hosts.yml, all.vars.kvoffload_campaign).
    all_var_sources: dict[str, tuple[str, str]] = field(default_factory=dict)

    def group(self, name: str) -> list[Host]:
        return [host for host in self.hosts if name in host.groups]

    def host(self, name: str) -> Host:
        return next(host for host in self.hosts if host.name == name)


VarFiles = Mapping[str, tuple[str, dict[str, Any]]]


def _check_layer(values: dict[str, Any] | None, file: str, path: str, problems: list[str]) -> None:
    """Validate one place variables are written, so a message points at the key where it is."""
    if not values:
        return
    try:
        HostVars.model_validate(values)
    except ValidationError as exc:
        problems += format_validation_error(exc, file, path, HostVars).problems


def _check_group(spec: GroupSpec, path: str, file: str, problems: list[str]) -> None:
    for name, host_vars in (spec.hosts or {}).items():
        _check_layer(host_vars, file, f"{path}.hosts.{name}", problems)
    _check_layer(spec.vars, file, f"{path}.vars", problems)
    for child, child_spec in (spec.children or {}).items():
        _check_group(child_spec or GroupSpec(), f"{path}.children.{child}", file, problems)


def check_yaml_layout(raw: Any, file: str) -> None:
    """The strict structure of a YAML inventory, and every variable where it is written.

    Ansible's yaml plugin only warns about a misspelt key (`host:` for `hosts:`) and drops it; here it
    is an error naming the key. Raises `ConfigError` naming the file and the key of every problem.
    """
    if not isinstance(raw, dict) or not raw:
        raise ConfigError([f"{file}: (top level): an Ansible YAML inventory must be a mapping with `all`"])
    top: dict[str, Any] = dict(raw)
    all_raw = top.pop("all", None) or {}
    # Ansible also accepts groups at the top level; they are children of `all`.
    if top:
        if not isinstance(all_raw, dict):
            raise ConfigError([f"{file}: all: must be a mapping of hosts, vars and children"])
        children = all_raw.get("children") or {}
        if not isinstance(children, dict):
            raise ConfigError([f"{file}: all.children: must be a mapping of group names to groups"])
        all_raw = {**all_raw, "children": {**children, **top}}
    try:
        all_spec = GroupSpec.model_validate(all_raw)
    except ValidationError as exc:
        raise format_validation_error(exc, file, "all", GroupSpec) from exc
    problems: list[str] = []
    _check_group(all_spec, "all", file, problems)
    if problems:
        raise ConfigError(problems)


def _host_layers(
    parsed: AnsibleInventory,
    host: AnsibleHost,
    groups: list[str],
    group_files: VarFiles,
    host_files: VarFiles,
    file: str,
    is_yaml: bool,
) -> list[tuple[Mapping[str, Any], str, str]]:
    """A host's variable layers in Ansible's order, each as (values, file, key prefix): the prefix
    spells where a key sits in that file (`all.vars.`, `[vllm:vars] `; none in a vars file)."""

    def inline(group: str) -> str:
        if not is_yaml:
            return f"[{group}:vars] "
        return "all.vars." if group == "all" else f"{group}.vars."

    all_file, all_values = group_files.get("all", ("", {}))
    layers: list[tuple[Mapping[str, Any], str, str]] = [
        (parsed.group_vars.get("all", {}), file, inline("all")),
        (all_values, all_file, ""),
    ]
    layers += [(parsed.group_vars.get(g, {}), file, inline(g)) for g in groups]
    layers += [(group_files[g][1], group_files[g][0], "") for g in groups if g in group_files]
    layers.append((host.vars, file, f"host {host.name}: "))
    if host.name in host_files:
        layers.append((host_files[host.name][1], host_files[host.name][0], ""))
    return layers


def build_inventory(
    file: str,
    parsed: AnsibleInventory,
    group_files: VarFiles | None = None,
    host_files: VarFiles | None = None,
    *,
    inline_checked: bool = False,
) -> Inventory:
    """The inventory from what Ansible parsed, plus the group_vars/host_vars files beside it.

    Variables combine in Ansible's order (its VariableManager, without a play): `all`'s inline vars <
    group_vars/all < the other groups' inline vars < their group_vars files (groups in Ansible's
    depth, priority, name order) < the host's inline vars < host_vars/<host>. A later layer replaces a
    variable whole (Ansible's default `hash_behaviour`). Each layer is validated where it is written
    (`inline_checked`: the inventory file's own layers were, by `check_yaml_layout`), then the result.
    """
    group_files = group_files or {}
    host_files = host_files or {}
    problems: list[str] = []
    if not inline_checked:
        for group, values in parsed.group_vars.items():
            _check_layer(values, file, f"[{group}:vars]", problems)
        for parsed_host in parsed.hosts:
            _check_layer(parsed_host.vars, file, f"host {parsed_host.name}", problems)
    used = {g for h in parsed.hosts for g in h.groups} | {"all"}
    for name, (var_file, values) in group_files.items():
        if name in used:
            _check_layer(values, var_file, "", problems)
    names = {h.name for h in parsed.hosts}
    for name, (var_file, values) in host_files.items():
        if name in names:
            _check_layer(values, var_file, "", problems)
    if problems:
        raise ConfigError(problems)
    hosts = []
    for parsed_host in parsed.hosts:
        others = [g for g in parsed_host.groups if g != "all"]
        merged: dict[str, Any] = {}
        sources: dict[str, tuple[str, str]] = {}
        for layer, source, prefix in _host_layers(
            parsed, parsed_host, others, group_files, host_files, file, inline_checked
        ):
            merged.update(layer)
            sources.update({key: (source, prefix + key) for key in layer})
        try:
            host_vars = HostVars.model_validate(merged)
        except ValidationError as exc:  # each layer passed: only a rule across layers is left
            problems += format_validation_error(exc, file, f"host {parsed_host.name}", HostVars).problems
            continue
        groups = frozenset(others) - {"ungrouped"}
        hosts.append(Host(name=parsed_host.name, groups=groups, vars=host_vars, var_sources=sources))
    if problems:
        raise ConfigError(problems)
    inline_all = parsed.group_vars.get("all", {})
    all_vars = dict(inline_all)
    sources = {key: (file, f"all.vars.{key}") for key in inline_all}
    if "all" in group_files:
        var_file, values = group_files["all"]
        all_vars.update(values)
        sources.update({key: (var_file, key) for key in values})
    return Inventory(file=file, hosts=tuple(hosts), all_vars=all_vars, all_var_sources=sources)
