"""An inventory source read by Ansible's own inventory plugins (yaml, ini), in-process.

Ansible expands host ranges (`gpu[01:02].lab.example`), reads INI as well as YAML, and decides group
membership and group order (depth, priority, name: `ansible.inventory.helpers.sort_groups`), so
kvoffload-lab sees the hosts Ansible will run on. Only the yaml and ini plugins are enabled: an
executable inventory (the script plugin) is never run by `plan`. Values come back as plain Python
(Ansible's tagged types unwrapped; an inline `!vault` value as its ciphertext, which only Ansible
decrypts). Reads the one inventory file; group_vars/ and host_vars/ are load.py's. Errors Ansible
raises become ConfigError naming the file, with Ansible's message.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvoffload.config.errors import ConfigError

# Set by Ansible itself on every host and group it adds; not inventory variables of the user's.
_ANSIBLE_SET = frozenset({"inventory_file", "inventory_dir"})
PLUGINS = ("yaml", "ini")


@dataclass(frozen=True)
class AnsibleHost:
    """A host as Ansible sees it: its groups in Ansible's variable order (`all` first) and its own vars."""

    name: str
    groups: tuple[str, ...]
    vars: dict[str, Any]


@dataclass(frozen=True)
class AnsibleInventory:
    """Hosts in the order Ansible added them, and each group's own (inline) vars."""

    hosts: tuple[AnsibleHost, ...]
    group_vars: dict[str, dict[str, Any]]


def plain(value: Any) -> Any:
    """Ansible's tagged values as plain dict/list/str/int/float/bool/None."""
    if type(value).__name__ == "EncryptedString":
        return str(value._ciphertext)
    if isinstance(value, bool | None):
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


def _own(variables: dict[str, Any]) -> dict[str, Any]:
    return {str(k): plain(v) for k, v in variables.items() if k not in _ANSIBLE_SET}


@functools.cache
def ansible_machinery() -> tuple[Any, ...]:
    """Ansible's inventory classes and the enabled plugins, imported once per process.

    Imported lazily: ansible-core's import costs most of a second (it runs `ldconfig` through ctypes
    and probes `getaddrinfo` on 127.0.0.1), so only commands that read an inventory pay it.
    """
    from ansible.errors import AnsibleError
    from ansible.inventory.data import InventoryData
    from ansible.inventory.helpers import sort_groups
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import inventory_loader

    plugins = tuple((name, inventory_loader.get(name)) for name in PLUGINS)
    return AnsibleError, InventoryData, sort_groups, DataLoader, plugins


def read_ansible_inventory(path: Path) -> AnsibleInventory:
    """Parse `path` with the first of Ansible's yaml and ini plugins that reads it (a file without an
    extension is tried as YAML first, as Ansible does)."""
    ansible_error, inventory_data, sort_groups, data_loader, plugins = ansible_machinery()
    source = str(path.resolve())
    loader = data_loader()
    failures: list[str] = []
    for name, plugin in plugins:
        if plugin is None or not plugin.verify_file(source):
            continue
        # As Ansible does: the next plugin gets a clean inventory when one fails part-way.
        data = inventory_data()
        data.current_source = source
        try:
            plugin.parse(data, loader, source, cache=False)
            data.reconcile_inventory()
        except ansible_error as exc:
            failures.append(f"Ansible's {name} inventory plugin cannot read it: {_message(exc)}")
            continue
        break
    else:
        if not failures:
            failures.append("not an inventory Ansible's yaml or ini plugin reads")
        raise ConfigError([f"{path}: {'; '.join(failures)}"])
    hosts = tuple(
        AnsibleHost(
            name=str(host.name),
            groups=tuple(str(g.name) for g in sort_groups(host.get_groups())),
            vars=_own(host.vars),
        )
        for host in data.hosts.values()
    )
    return AnsibleInventory(hosts=hosts, group_vars={str(g.name): _own(g.vars) for g in data.groups.values()})


def _message(exc: Exception) -> str:
    """Ansible's message and its causes, on one line (the cause says what is wrong in the file)."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(parts) < 4:
        text = getattr(seen, "message", None) or str(seen)
        text = " ".join(str(text).split())
        if text and not any(text in part for part in parts):
            parts.append(text)
        seen = seen.__cause__
    return ": ".join(parts)
