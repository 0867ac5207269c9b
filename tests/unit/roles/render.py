"""Render role templates the way Ansible's template module does, for golden files and static gates.

Uses ansible-core's own Templar (same filters, lazy templating of role defaults) so a golden file is
what a host would receive; the variables are the role defaults overlaid with the resolver's extravars.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader
from ansible.template import Templar, trust_as_template

REPO = Path(__file__).resolve().parents[3]
ROLES = REPO / "roles"
MANAGED = "Ansible managed: do not edit on the host"

# This checkout as the collection kvoffload.lab (its filters), whatever the working directory of the test
# that first imported Ansible (ansible.cfg, which names .collections, is found from the cwd).
init_plugin_loader([str(REPO / ".collections")])


def trusted(value: Any) -> Any:
    """A role file's value as Ansible holds it: every string in it a trusted template."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [trusted(v) for v in value]
    if isinstance(value, dict):
        return {k: trusted(v) for k, v in value.items()}
    return value


def role_defaults(*roles: str) -> dict[str, Any]:
    """The roles' defaults and their internal `vars/main.yml` values (templated lazily on render), after
    those of the kvoffload role (the shared variables), as a play that lists it first gives them."""
    merged: dict[str, Any] = {}
    for role in ("kvoffload", *roles):
        for path in (ROLES / role / "defaults" / "main.yml", ROLES / role / "vars" / "main.yml"):
            if path.exists():
                data = yaml.safe_load(path.read_text()) or {}
                # Role files are trusted templates for Ansible (defaults may refer to other variables).
                merged.update({k: trusted(v) for k, v in data.items()})
    return merged


def render(role: str, template: str, variables: dict[str, Any]) -> str:
    source = (ROLES / role / "templates" / template).read_text()
    context = {"ansible_managed": MANAGED, "inventory_hostname": "gpu1", **variables}
    templar = Templar(loader=DataLoader(), variables=context)
    # As ansible.builtin.template does: no backslash escaping, trim_blocks on (its default).
    rendered = templar.template(
        trust_as_template(source),
        escape_backslashes=False,
        overrides={"trim_blocks": True, "lstrip_blocks": False},
    )
    assert isinstance(rendered, str)
    # The template module keeps a template's final newline.
    return rendered if rendered.endswith("\n") else rendered + "\n"


def collection_module(name: str) -> ModuleType:
    """One of the collection's modules (plugins/modules/NAME.py), imported for its functions."""
    path = REPO / "plugins" / "modules" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_collection_module(name: str, tmp_path: Path, bindir: Path, args: dict[str, object]) -> dict[str, Any]:
    """The JSON answer of the collection's module NAME, run as Ansible runs it (a JSON arguments file),
    with `bindir` (stand-in tools such as systemctl) first on PATH."""
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    out = subprocess.run(
        [sys.executable, str(REPO / "plugins" / "modules" / f"{name}.py"), str(path)],
        env={**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        check=False,
    )
    return dict(json.loads(out.stdout))
