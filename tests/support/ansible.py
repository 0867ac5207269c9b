"""ansible-playbook of this venv, run on this repository's ansible.cfg and roles, for tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def ansible_playbook(
    *argv: str, extravars: dict[str, Any] | None = None, env: dict[str, str] | None = None, timeout: int = 240
) -> subprocess.CompletedProcess[str]:
    """`ansible-playbook ARGV -e EXTRAVARS` from the repository root, output captured, never raising.

    The hosts' python is this interpreter (plays run on local connections); `env` adds variables.
    """
    variables = {"ansible_python_interpreter": sys.executable, **(extravars or {})}
    return subprocess.run(
        [str(BIN / "ansible-playbook"), *argv, "-e", json.dumps(variables)],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
            **(env or {}),
        },
        cwd=REPO,
        timeout=timeout,
        check=False,
    )
