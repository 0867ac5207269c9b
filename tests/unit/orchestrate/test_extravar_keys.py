"""The per-key declaration of extravars (kvoffload/orchestrate/cell/extravar_keys.py): complete for what a
cell produces, true to the roles' argument specs, and the engine identity built from it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvoffload.config import load_lab
from kvoffload.orchestrate.cell.deployment import cell_extravars, engine_key
from kvoffload.orchestrate.cell.extravar_keys import (
    EXTRAVARS,
    ORCHESTRATOR_ONLY,
    Identity,
    UndeclaredExtravar,
    check_declared,
)
from kvoffload.orchestrate.installs.wheelhouse import Wheels

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "inventories" / "example" / "hosts.yml"
LOCAL = ROOT / "inventories" / "local"


def _produced(tmp_path: Path) -> set[str]:
    """Every key `cell_extravars` produces over the example lab (every tier, every node, with and
    without a wheelhouse and Caddy's wheel) and the demo's campaign (the simulator, cold_start: reset)."""
    keys: set[str] = set()
    wheels = (
        Wheels(tmp_path / "p.whl", None),
        Wheels(tmp_path / "p.whl", tmp_path / "wh", caddy=tmp_path / "c.whl", python="3.12.3"),
    )
    labs = [load_lab(EXAMPLE), load_lab(EXAMPLE, LOCAL / "campaign-demo.yml")]
    for lab in labs:
        for cell in lab.cells:
            for node in lab.nodes:
                for w in wheels:
                    keys |= set(cell_extravars(lab, cell, tmp_path / cell.id, w, node))
    return keys


def _role_specs() -> set[str]:
    declared: set[str] = set()
    for path in (ROOT / "roles").glob("*/meta/argument_specs.yml"):
        for entry in (yaml.safe_load(path.read_text()).get("argument_specs") or {}).values():
            declared |= set(entry.get("options") or {})
    return declared


def test_every_key_a_cell_produces_is_declared(tmp_path: Path) -> None:
    produced = _produced(tmp_path)
    assert len(produced) > 50
    missing = sorted(produced - set(EXTRAVARS))
    assert not missing, f"declare these in extravar_keys.EXTRAVARS: {missing}"


def test_declared_keys_are_the_roles_arguments_or_named_orchestrator_only() -> None:
    roles = _role_specs()
    undeclared = sorted(set(EXTRAVARS) - roles - ORCHESTRATOR_ONLY)
    assert not undeclared, (
        f"no role declares {undeclared}: add them to a role's argument_specs or ORCHESTRATOR_ONLY"
    )
    assert set(EXTRAVARS) >= ORCHESTRATOR_ONLY
    assert not ORCHESTRATOR_ONLY & roles, "a role declares these now: drop them from ORCHESTRATOR_ONLY"


def test_the_declaration_keeps_the_engine_identity_of_the_name_rule(tmp_path: Path) -> None:
    # before the declaration, engine_key left out every key named replay_*, vllm_gpu_telemetry_interval
    # and kvoffload_campaign_name: the same keys must stay out (cell.json engine_key values unchanged)
    rule = ("replay_", "vllm_gpu_telemetry_interval", "kvoffload_campaign_name")
    for key in _produced(tmp_path):
        assert (EXTRAVARS[key] is Identity.NOT_ENGINE) == key.startswith(rule), key


def test_an_undeclared_key_is_refused_before_any_playbook_or_engine_key(tmp_path: Path) -> None:
    lab = load_lab(EXAMPLE)
    extravars = cell_extravars(lab, lab.cells[0], tmp_path, Wheels(tmp_path / "p.whl", None))
    check_declared(extravars)
    key = engine_key(extravars)
    # a NOT_ENGINE change keeps the key, an ENGINE change makes another
    assert engine_key({**extravars, "replay_concurrency": 999}) == key
    assert engine_key({**extravars, "vllm_base_port": 1}) != key
    with pytest.raises(UndeclaredExtravar, match="vllm_new_flag"):
        engine_key({**extravars, "vllm_new_flag": True})
    with pytest.raises(UndeclaredExtravar, match="vllm_new_flag"):
        check_declared({**extravars, "vllm_new_flag": True})
