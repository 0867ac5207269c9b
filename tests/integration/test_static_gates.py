"""Static gates over roles/ and playbooks/: ansible-lint (production profile), yamllint, Jinja parse.

These run the real linters as CI would; a finding fails the test with the linter's own output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TEMPLATES = sorted((REPO / "roles").glob("*/templates/**/*.j2"))


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), NO_COLOR="1")
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=840, check=False)


# A hang guard, not a speed check: alone ansible-lint takes ~30 s, but beside the lab lanes of make test
# on 2 cores it once ran past 300 s.
@pytest.mark.timeout(900)
def test_ansible_lint_production_profile_is_clean() -> None:
    result = run(
        str(BIN / "ansible-lint"),
        "--offline",
        "--profile",
        "production",
        "--nocolor",
        "-q",
        "roles",
        "playbooks",
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_yamllint_is_clean() -> None:
    paths = [
        "roles",
        "playbooks",
        "kvoffload/profiles/engine",
        "kvoffload/profiles/lmcache",
        "kvoffload/profiles/caddy",
    ]
    result = run(str(BIN / "yamllint"), "--strict", "--config-file", ".yamllint", *paths)
    assert result.returncode == 0, result.stdout + result.stderr


def test_there_are_templates_to_check() -> None:
    assert len(TEMPLATES) >= 9, [str(t) for t in TEMPLATES]


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: str(p.relative_to(REPO / "roles")))
def test_every_template_parses(template: Path) -> None:
    jinja2.Environment().parse(template.read_text(), name=str(template))


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: str(p.relative_to(REPO / "roles")))
def test_every_config_template_starts_with_the_managed_header(template: Path) -> None:
    lines = template.read_text().splitlines()
    if template.name.endswith(".fact.j2"):
        # Local facts are a script (shebang first) or JSON (no comments): the marker sits inside.
        assert lines[0].startswith("#!") or lines[0] == "{", f"{template}: first line {lines[0]!r}"
        return
    assert lines[0] == "{{ ansible_managed | comment }}", f"{template}: first line {lines[0]!r}"
