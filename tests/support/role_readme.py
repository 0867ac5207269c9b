"""Each role's README.md, generated from its argument spec (meta/argument_specs.yml) and defaults.

The spec is where a role variable is documented (tests/unit/roles/test_role_docs.py holds every default
to it), so the README is written from it and never by hand: a test keeps each README equal to what this
renders, and `python -m tests.support.role_readme` writes them again after a spec changes. A README says
what the role does, which of the collection's playbooks run it, every variable of each entry point (type,
default, allowed values, description) and how to call it from a play.

    python -m tests.support.role_readme          # rewrite roles/*/README.md
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
PLAYBOOKS = ROOT / "playbooks"
COLLECTION = "kvoffload.lab"
# The variables-only role that holds the shared kvoffload_* variables, first in every play.
SHARED = "kvoffload"
SHARED_NOTE = "the shared variables, first in every play"


def _cell(text: str) -> str:
    """One Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{json.dumps(value)}`"


def _description(option: dict[str, Any]) -> str:
    text = option.get("description", "")
    return " ".join(text) if isinstance(text, list) else str(text)


def playbooks_using(role: str) -> list[str]:
    """The collection's playbooks that run `role` (in a roles list, or by include/import_role name)."""
    pattern = re.compile(
        rf"^\s*(?:-\s*)?(?:role|name):\s*(?:{re.escape(COLLECTION)}\.)?{re.escape(role)}\s*(?:#.*)?$|"
        rf"^\s*-\s*(?:{re.escape(COLLECTION)}\.)?{re.escape(role)}\s*(?:#.*)?$",
        re.MULTILINE,
    )
    return sorted(p.name for p in PLAYBOOKS.glob("*.yml") if pattern.search(p.read_text()))


def _defaults(role: str) -> dict[str, Any]:
    path = ROLES / role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def _options_table(options: dict[str, Any], defaults: dict[str, Any], shared: dict[str, Any]) -> list[str]:
    if not options:
        return ["This entry point takes no variables.", ""]
    lines = ["| variable | type | default | description |", "|---|---|---|---|"]
    for name in sorted(options):
        option = options[name]
        kind = str(option.get("type", ""))
        if option.get("elements"):
            kind += f" of {option['elements']}"
        if "default" in option:
            default = _value(option["default"])
        elif name in defaults:
            default = _value(defaults[name])
        elif name in shared:
            default = f"{_value(shared[name])} (role `{SHARED}`)"
        else:
            default = "required" if option.get("required") else "(unset)"
        text = _description(option)
        if option.get("choices"):
            text += " One of " + ", ".join(_value(c) for c in option["choices"]) + "."
        lines.append(f"| `{name}` | {_cell(kind)} | {_cell(default)} | {_cell(text)} |")
    return [*lines, ""]


def render(role: str) -> str:
    """The README.md of roles/<role>."""
    base = ROLES / role
    specs: dict[str, Any] = yaml.safe_load((base / "meta" / "argument_specs.yml").read_text())[
        "argument_specs"
    ]
    defaults = _defaults(role)
    shared = _defaults(SHARED) if role != SHARED else {}
    main = specs.get("main", {})
    description = main.get("description", [])
    paragraphs = description if isinstance(description, list) else [description]
    out = [f"# Role `{COLLECTION}.{role}`", "", main.get("short_description", "").rstrip(".") + ".", ""]
    for paragraph in paragraphs:
        out += [" ".join(str(paragraph).split()), ""]
    out += [
        "Generated from `meta/argument_specs.yml` and `defaults/main.yml` by "
        "`python -m tests.support.role_readme` (a test keeps it equal); to change it, change the spec.",
        "",
        "## Run by",
        "",
    ]
    used = playbooks_using(role)
    out += (
        [f"- `playbooks/{p}`" for p in used]
        if used
        else ["- no playbook of the collection; call it from yours"]
    )
    out += [""]
    for entry in ["main", *sorted(e for e in specs if e != "main")]:
        spec = specs[entry]
        title = "Variables" if entry == "main" else f"Entry point `{entry}`"
        out += [f"## {title}", ""]
        if entry != "main":
            out += [" ".join(_description(spec).split()) or spec.get("short_description", ""), ""]
        out += _options_table(spec.get("options") or {}, defaults, shared)
    out += [
        "## Example",
        "",
        "```yaml",
        "- name: Use the role",
        "  hosts: all",
        "  roles:",
        *([] if role == SHARED else [f"    - role: {COLLECTION}.{SHARED}  # {SHARED_NOTE}"]),
        f"    - role: {COLLECTION}.{role}",
        "```",
        "",
        "Inside this repository the playbooks call it by its short name (ansible.cfg: `roles_path = roles`).",
        "",
    ]
    return "\n".join(out)


def roles() -> list[str]:
    """Every role with an argument spec."""
    return sorted(p.parents[1].name for p in ROLES.glob("*/meta/argument_specs.yml"))


def main() -> int:
    for role in roles():
        (ROLES / role / "README.md").write_text(render(role))
    print(f"wrote roles/{{{','.join(roles())}}}/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
