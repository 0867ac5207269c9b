"""The inventory model: an Ansible YAML inventory read as the hosts and groups kvoffload-lab needs.

The structure (`all`, groups with `hosts`, `vars`, `children`) is strict. Host variables are Ansible's
and open-ended, so only the ones this tool reads are typed and checked here: `vllm_replicas` (vllm
role) and `nvme_storage_devices` (nvme_storage role), with the same shape the roles take, so the file
feeds Ansible unchanged. Variables resolve as Ansible does for these simple cases: all.vars < group
vars (parents before children; a group_vars/<group>.yml file over the inline vars) < host vars
(host_vars/<host>.yml over inline). Pure validation of already-parsed YAML; no file IO.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError, field_validator

from kvoffload.config.errors import ConfigError, KeyedError, format_validation_error

GROUPS = ("vllm", "lmcache", "lb", "client")
CAMPAIGN_VAR = "kvoffload_campaign"
_GPUS = re.compile(r"^[0-9]+(,[0-9]+)*$")
_DOTTED = re.compile(r"^[0-9.]+$")
_LABEL = r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?$")


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
    wipe: bool = Field(default=False, description="allow destroying partitions or a foreign file system")

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
    ansible_port: int | str | None = Field(default=None, description="ssh port of the host (1-65535)")
    vllm_replicas: list[ReplicaSpec] | None = Field(
        default=None, description="vLLM replicas on this host (hosts of group vllm)"
    )
    nvme_storage_devices: list[NvmeDevice] | None = Field(
        default=None, description="NVMe devices for the L2 cache (the lmcache host, nvme tier)"
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
                        f"[{i}].gpus", f"GPU {gpu} is also given to vllm_replicas[{seen_gpu[gpu]}]"
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


@dataclass(frozen=True)
class _Layer:
    """Variables of one place (inline group/host vars or a group_vars/host_vars file) for one host."""

    rank: tuple[int, int, str]  # (group depth, 0 inline | 1 file, group name); host vars rank last
    values: dict[str, Any]
    file: str
    path: str


@dataclass
class _Walk:
    """Accumulates group membership and variables while walking the group tree."""

    group_files: VarFiles
    order: list[str] = field(default_factory=list)
    groups: dict[str, set[str]] = field(default_factory=dict)
    layers: dict[str, list[_Layer]] = field(default_factory=dict)


_HOST_DEPTH = 1000


def _walk(
    group: str, spec: GroupSpec, depth: int, path: str, state: _Walk, inherited: list[str], file: str
) -> None:
    members: list[str] = []
    for name, host_vars in (spec.hosts or {}).items():
        if name not in state.groups:
            state.order.append(name)
            state.groups[name] = set()
            state.layers[name] = []
        members.append(name)
        if host_vars:
            layer = _Layer((_HOST_DEPTH, 0, name), host_vars, file, f"{path}.hosts.{name}")
            state.layers[name].append(layer)
    lineage = [*inherited, group]
    for name in members:
        state.groups[name].update(lineage)
    for child, child_spec in (spec.children or {}).items():
        _walk(child, child_spec or GroupSpec(), depth + 1, f"{path}.children.{child}", state, lineage, file)
    layers = []
    if spec.vars:
        layers.append(_Layer((depth, 0, group), spec.vars, file, f"{path}.vars"))
    if group in state.group_files:
        # group_vars/<group>.yml overrides the group's inline vars, as in Ansible.
        var_file, values = state.group_files[group]
        layers.append(_Layer((depth, 1, group), values, var_file, ""))
    for name in _members_recursive(spec):
        state.layers[name].extend(layers)


def _members_recursive(spec: GroupSpec) -> list[str]:
    names = list(spec.hosts or {})
    for child in (spec.children or {}).values():
        names += _members_recursive(child or GroupSpec())
    return names


def parse_inventory(
    raw: Any, file: str, group_files: VarFiles | None = None, host_files: VarFiles | None = None
) -> Inventory:
    """Validate parsed inventory YAML (plus parsed group_vars/host_vars files, by group or host name).

    Raises `ConfigError` naming the file and the key of every problem.
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
    state = _Walk(group_files=group_files or {})
    _walk("all", all_spec, 0, "all", state, [], file)
    for name, (var_file, values) in (host_files or {}).items():
        if name in state.layers:
            state.layers[name].append(_Layer((_HOST_DEPTH, 1, name), values, var_file, ""))
    problems: list[str] = []
    checked: set[tuple[str, str]] = set()
    hosts = []
    for name in state.order:
        merged: dict[str, Any] = {}
        for layer in sorted(state.layers[name], key=lambda item: item.rank):
            # Validate each layer where it is written, so the message points at the right key.
            if (layer.file, layer.path) not in checked:
                checked.add((layer.file, layer.path))
                try:
                    HostVars.model_validate(layer.values)
                except ValidationError as exc:
                    problems += format_validation_error(exc, layer.file, layer.path, HostVars).problems
            merged.update(layer.values)
        if problems:
            continue
        groups = frozenset(state.groups[name] - {"all"})
        hosts.append(Host(name=name, groups=groups, vars=HostVars.model_validate(merged)))
    if problems:
        raise ConfigError(problems)
    all_vars = dict(all_spec.vars or {})
    sources = {key: (file, f"all.vars.{key}") for key in all_vars}
    if "all" in state.group_files:
        var_file, values = state.group_files["all"]
        all_vars.update(values)
        sources.update({key: (var_file, key) for key in values})
    return Inventory(file=file, hosts=tuple(hosts), all_vars=all_vars, all_var_sources=sources)
