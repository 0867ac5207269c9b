"""Every molecule scenario whose roles call the collection's own modules points Ansible at them.

Roles import their task files statically, so Ansible resolves every module name of a role when it loads
the play, including tasks that tags or conditions skip. A scenario that converges such a role without
`ANSIBLE_LIBRARY` set to plugins/modules (ansible.cfg's `library`, which molecule does not read) fails
at converge with "couldn't resolve module/action". Checked here offline, before the container tests.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("kvoffload_*.py"))
SCENARIOS = sorted(p.parent for p in (REPO / "roles").glob("*/molecule/*/molecule.yml"))
LIBRARY = "${MOLECULE_PROJECT_DIRECTORY}/../../plugins/modules"


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
        found |= {m for m in MODULES if re.search(rf"^\s+(?:kvoffload\.lab\.)?{m}:\s*$", text, re.M)}
    return found


def test_the_modules_and_scenarios_are_found() -> None:
    assert "kvoffload_start_units" in MODULES and len(SCENARIOS) >= 7, (MODULES, SCENARIOS)
    assert modules_called("vllm") >= {"kvoffload_start_units", "kvoffload_unit_states"}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: f"{p.parents[1].name}-{p.name}")
def test_a_scenario_that_needs_the_modules_has_the_library(scenario: Path) -> None:
    needed = {m: role for role in converged_roles(scenario) for m in modules_called(role)}
    env = (yaml.safe_load((scenario / "molecule.yml").read_text())["provisioner"].get("env")) or {}
    if needed:
        assert env.get("ANSIBLE_LIBRARY") == LIBRARY, (
            f"{scenario.relative_to(REPO)}/molecule.yml: provisioner.env.ANSIBLE_LIBRARY must be {LIBRARY}"
            f" (its roles call {sorted(needed.items())})"
        )
