"""Every public role variable is documented twice: prose in defaults/main.yml, type in argument_specs.

Bad input must fail at role entry (argument_specs), and a reader of defaults/main.yml must learn what a
variable is for (a comment right above it). Checked for every role that has defaults.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support import role_readme

ROLES = Path(__file__).resolve().parents[3] / "roles"
ROLE_NAMES = sorted(p.parents[1].name for p in ROLES.glob("*/defaults/main.yml"))


def spec_options(role: str) -> dict[str, dict[str, object]]:
    spec = yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())
    options: dict[str, dict[str, object]] = spec["argument_specs"]["main"]["options"]
    return options


def test_roles_are_found() -> None:
    assert len(ROLE_NAMES) >= 9, ROLE_NAMES


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_default_is_in_the_argument_spec(role: str) -> None:
    defaults = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {}
    missing = sorted(set(defaults) - set(spec_options(role)))
    assert not missing, f"roles/{role}/meta/argument_specs.yml lacks {missing}"


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_spec_option_has_a_description_and_a_type(role: str) -> None:
    for name, option in spec_options(role).items():
        assert option.get("description"), f"roles/{role}: option {name} has no description"
        assert option.get("type"), f"roles/{role}: option {name} has no type"


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_default_has_prose_above_it(role: str) -> None:
    lines = (ROLES / role / "defaults" / "main.yml").read_text().splitlines()
    for i, line in enumerate(lines):
        if line and not line[0].isspace() and not line.startswith(("#", "---")) and ":" in line:
            assert i > 0 and lines[i - 1].startswith("#"), f"roles/{role}/defaults/main.yml:{i + 1}: {line!r}"


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_spec_defaults_agree_with_defaults_file(role: str) -> None:
    defaults = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {}
    for name, option in spec_options(role).items():
        if "default" in option and name in defaults:
            assert option["default"] == defaults[name], (
                f"roles/{role}: {name} spec default != defaults/main.yml"
            )


@pytest.mark.parametrize("role", role_readme.roles())
def test_every_role_has_a_readme_generated_from_its_spec(role: str) -> None:
    readme = ROLES / role / "README.md"
    assert readme.is_file(), f"roles/{role}/README.md missing: python -m tests.support.role_readme"
    assert readme.read_text() == role_readme.render(role), (
        f"roles/{role}/README.md differs from its argument spec: python -m tests.support.role_readme"
    )
    for name in spec_options(role):
        assert f"| `{name}` |" in readme.read_text(), name


def test_the_readmes_name_the_playbooks_that_run_the_role() -> None:
    assert role_readme.playbooks_using("vllm") == ["deploy.yml", "teardown.yml"]
    assert "provision.yml" in role_readme.playbooks_using("nvme_storage")
    assert role_readme.playbooks_using("no_such_role") == []
