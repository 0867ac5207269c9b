"""One home per shared fact: the kvoffload role's defaults, first in every play.

The kvoffload_* variables that several roles read live in roles/kvoffload/defaults/main.yml only (the
kubespray_defaults pattern); every other role's defaults carry its own prefix. A role that reads a
shared variable lists it in its argument spec, with the same type and no default of its own. Every play
lists the kvoffload role first, so the roles after it see the values. The Python side keeps a few of
these values as constants (a standalone host probe cannot read a role): each is held equal here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kvoffload.doctor import probe
from kvoffload.orchestrate.cell import deployment
from kvoffload.orchestrate.checks import doctor
from kvoffload.profiles import resolve

REPO = Path(__file__).resolve().parents[3]
ROLES = REPO / "roles"
SHARED_ROLE = "kvoffload"
ROLE_NAMES = sorted(p.parents[1].name for p in ROLES.glob("*/meta/argument_specs.yml"))
PLAYBOOKS = sorted((REPO / "playbooks").glob("*.yml")) + sorted(
    p for p in ROLES.glob("*/molecule/*/*.yml") if p.name != "molecule.yml"
)


def defaults(role: str) -> dict[str, Any]:
    path = ROLES / role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def spec(role: str) -> dict[str, dict[str, dict[str, Any]]]:
    specs: dict[str, dict[str, dict[str, Any]]] = yaml.safe_load(
        (ROLES / role / "meta" / "argument_specs.yml").read_text()
    )["argument_specs"]
    return specs


SHARED = defaults(SHARED_ROLE)
SHARED_SPEC = spec(SHARED_ROLE)["main"]["options"]


def test_the_shared_role_holds_the_shared_variables_and_no_tasks() -> None:
    assert {"kvoffload_venv", "kvoffload_bind_address", "kvoffload_vllm_base_port"} <= set(SHARED)
    assert all(name.startswith(f"{SHARED_ROLE}_") for name in SHARED)
    assert not (ROLES / SHARED_ROLE / "tasks").exists()


@pytest.mark.parametrize("role", [r for r in ROLE_NAMES if r != SHARED_ROLE])
def test_a_role_declares_only_its_own_variables(role: str) -> None:
    foreign = sorted(name for name in defaults(role) if not name.startswith(f"{role}_"))
    assert not foreign, f"roles/{role}/defaults/main.yml declares {foreign}: shared ones belong in roles/kvoffload"


@pytest.mark.parametrize("role", [r for r in ROLE_NAMES if r != SHARED_ROLE])
def test_a_role_checks_a_shared_variable_as_the_shared_role_types_it(role: str) -> None:
    for entry, entry_spec in spec(role).items():
        for name, option in (entry_spec.get("options") or {}).items():
            if name.startswith(f"{role}_"):
                continue
            if name.startswith("kvoffload_") and not name.startswith("kvoffload_python_"):
                assert name in SHARED, f"roles/{role} ({entry}): {name} is in no role's defaults"
            if name not in SHARED:
                continue
            where = f"roles/{role}/meta/argument_specs.yml ({entry}): {name}"
            assert "default" not in option, f"{where}: its default is the kvoffload role's alone"
            for key in ("type", "elements", "choices"):
                assert option.get(key) == SHARED_SPEC[name].get(key), f"{where}: {key} differs from roles/kvoffload"


@pytest.mark.parametrize("path", PLAYBOOKS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_play_lists_the_shared_role_first(path: Path) -> None:
    plays = [p for p in yaml.safe_load(path.read_text()) or [] if "hosts" in p]
    assert plays or path.name == "site.yml", path
    for play in plays:
        first = (play.get("roles") or [None])[0]
        name = first.get("role") if isinstance(first, dict) else first
        assert name == SHARED_ROLE, f"{path.relative_to(REPO)}: play {play.get('name')!r} starts with {name!r}"


def test_the_python_constants_are_the_roles_values() -> None:
    assert SHARED["kvoffload_vllm_base_port"] == resolve.VLLM_BASE_PORT
    assert defaults("lmcache_server")["lmcache_server_port"] == resolve.LMCACHE_PORT
    assert defaults("lmcache_server")["lmcache_server_http_port"] == resolve.LMCACHE_HTTP_PORT
    assert SHARED["kvoffload_venv"] == str(deployment.REMOTE_VENV)
    assert probe.DEFAULT_ENGINE_PYTHON == f"{SHARED['kvoffload_venv']}/bin/python"
    assert probe.DEFAULT_SERVICE_USER == SHARED["kvoffload_engine_user"]
    assert doctor.run_doctor.__kwdefaults__["venv"] == SHARED["kvoffload_venv"]
    # the probe's HIP child runs with the devices the ROCm units are given
    rocm = SHARED["kvoffload_engine_rocm_devices"]
    flat = [f"{k}={v}" for k, vs in rocm.items() for v in ([vs] if isinstance(vs, str) else vs)]
    assert list(probe.ROCM_SANDBOX_PROPERTIES) == flat


def test_the_role_defaults_spell_each_port_once() -> None:
    lmcache = defaults("lmcache_server")
    args = lmcache["lmcache_server_args"]
    assert args[args.index("--port") + 1] == "{{ lmcache_server_port | string }}"
    assert args[args.index("--http-port") + 1] == "{{ lmcache_server_http_port | string }}"
    assert defaults("vllm")["vllm_base_port"] == "{{ kvoffload_vllm_base_port }}"
    assert "kvoffload_vllm_base_port" in defaults("replay")["replay_base_url"]
    assert "8000" not in (ROLES / "caddy" / "defaults" / "main.yml").read_text()
