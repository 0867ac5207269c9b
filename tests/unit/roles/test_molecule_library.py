"""The roles call the collection's own modules by FQCN, and every molecule scenario that needs them finds
this checkout's collection.

Roles import their task files statically, so Ansible resolves every module name of a role when it loads
the play, including tasks that tags or conditions skip. A scenario that converges such a role without
`ANSIBLE_COLLECTIONS_PATH` starting with the checkout's .collections (ansible.cfg's `collections_path`,
which molecule does not read) fails at converge with "couldn't resolve module/action", or runs an
installed copy of another version. Checked here offline, before the container tests.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("kvoffload_*.py"))
SCENARIOS = sorted(p.parent for p in (REPO / "roles").glob("*/molecule/*/molecule.yml"))
COLLECTIONS = "${MOLECULE_PROJECT_DIRECTORY}/../../.collections"
FQCN = "kvoffload.lab"


def converged_roles(scenario: Path) -> set[str]:
    """The roles that the scenario's converge.yml runs (its plays' `roles:`), by name."""
    plays = yaml.safe_load((scenario / "converge.yml").read_text()) or []
    names = set()
    for play in plays:
        for entry in play.get("roles") or []:
            names.add(entry["role"] if isinstance(entry, dict) else str(entry))
    return names


def modules_called(role: str) -> set[str]:
    """The collection modules that a role's task files name as a task's action."""
    found = set()
    for path in (REPO / "roles" / role / "tasks").glob("*.yml"):
        text = path.read_text()
        found |= {m for m in MODULES if re.search(rf"^\s+{re.escape(FQCN)}\.{m}:\s*$", text, re.M)}
    return found


def test_the_modules_and_scenarios_are_found() -> None:
    assert "kvoffload_start_units" in MODULES and len(SCENARIOS) >= 7, (MODULES, SCENARIOS)
    assert modules_called("vllm") >= {"kvoffload_start_units", "kvoffload_unit_states"}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: f"{p.parents[1].name}-{p.name}")
def test_a_scenario_that_needs_the_modules_has_the_library(scenario: Path) -> None:
    needed = {m: role for role in converged_roles(scenario) for m in modules_called(role)}
    env = (yaml.safe_load((scenario / "molecule.yml").read_text())["provisioner"].get("env")) or {}
    if needed:
        assert str(env.get("ANSIBLE_COLLECTIONS_PATH", "")).split(":")[0] == COLLECTIONS, (
            f"{scenario.relative_to(REPO)}/molecule.yml: provisioner.env.ANSIBLE_COLLECTIONS_PATH must start"
            f" with {COLLECTIONS} (its roles call {sorted(needed.items())})"
        )


def test_the_checkout_is_the_collection_ansible_finds() -> None:
    lab = REPO / ".collections" / "ansible_collections" / "kvoffload" / "lab"
    for part in ("plugins", "roles", "meta", "playbooks", "galaxy.yml"):
        assert (lab / part).resolve() == (REPO / part).resolve(), part
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    assert f"{galaxy['namespace']}.{galaxy['name']}" == FQCN


def test_roles_and_playbooks_call_the_modules_by_fqcn() -> None:
    files = [*(REPO / "roles").glob("*/tasks/*.yml"), *(REPO / "roles").glob("*/molecule/*/*.yml")]
    files += list((REPO / "playbooks").glob("*.yml"))
    short = [
        f"{path.relative_to(REPO)}: {m}"
        for path in files
        for m in MODULES
        if re.search(rf"^\s+(?:-\s+)?{m}:\s*$", path.read_text(), re.M)
    ]
    assert not short, f"call them as {FQCN}.<module>: {short}"
    assert sum(len(modules_called(r)) for r in {p.parents[1].name for p in files if "tasks" in p.parts}) >= 7


def test_galaxy_yml_names_every_role_module_and_playbook() -> None:
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    roles = sorted(p.parent.name for p in (REPO / "roles").glob("*/meta"))
    for role in roles:
        assert re.search(rf"\b{role}\b", galaxy["description"]), role
    for module in MODULES:
        assert module in galaxy["description"], module
    header = (REPO / "galaxy.yml").read_text().split("namespace:")[0]
    for name in [*roles, *MODULES, *(p.stem for p in (REPO / "playbooks").glob("*.yml"))]:
        assert re.search(rf"\b{name}\b", header), name
