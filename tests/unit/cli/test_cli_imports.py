"""The CLI stays thin: no command module uses another's code, no cli module another's private names,
and building the parser (`kvoffload-lab --help`) loads none of the heavy layers.

What several commands share lives in kvoffload/cli/args.py or in a lower layer (orchestrate, report,
...); a command module (main.COMMAND_MODULES) imports nothing from another command module, and no
module of kvoffload/cli imports a `_private` name of another. The heavy modules are imported inside
the handlers that need them.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import kvoffload.cli
from kvoffload.cli.main import COMMAND_MODULES

CLI = Path(kvoffload.cli.__file__).parent


def cli_imports(source: str) -> list[tuple[str, str]]:
    """(module, name) of every `kvoffload.cli` import in `source`, at any depth (`import M`: name '')."""
    found: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvoffload.cli"):
            for alias in node.names:
                if node.module == "kvoffload.cli":  # from kvoffload.cli import run
                    found.append((f"kvoffload.cli.{alias.name}", ""))
                else:
                    found.append((node.module, alias.name))
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith("kvoffload.cli.")]
    return found


def violations(module: str, source: str) -> list[str]:
    """What `module` (kvoffload.cli.X) imports that it must not: another cli module's private names,
    and, for a command module, anything of another command module."""
    out = []
    for imported, name in cli_imports(source):
        if imported == module:
            continue
        if name.startswith("_"):
            out.append(f"{module} imports the private {imported}.{name}")
        if module in COMMAND_MODULES and imported in COMMAND_MODULES:
            out.append(f"command {module} imports command {imported} ({name or 'the module'})")
    return out


@pytest.mark.parametrize("path", sorted(CLI.glob("*.py")), ids=lambda p: p.name)
def test_cli_modules_share_nothing_private(path: Path) -> None:
    assert violations(f"kvoffload.cli.{path.stem}", path.read_text()) == []


def test_the_check_sees_a_cross_import_at_any_depth() -> None:
    source = (
        "from kvoffload.cli.args import add_lab_arguments\n"  # the shared module: fine
        "def f():\n"
        "    from kvoffload.cli.run import _CellPools\n"
        "    from kvoffload.cli import watch\n"
    )
    assert violations("kvoffload.cli.plan", source) == [
        "kvoffload.cli.plan imports the private kvoffload.cli.run._CellPools",
        "command kvoffload.cli.plan imports command kvoffload.cli.run (_CellPools)",
        "command kvoffload.cli.plan imports command kvoffload.cli.watch (the module)",
    ]
    # a helper module of the CLI (not a command) may use a command's public code, never its private
    assert violations("kvoffload.cli.cellvars", "from kvoffload.cli.run import run, _x\n") == [
        "kvoffload.cli.cellvars imports the private kvoffload.cli.run._x"
    ]


# Modules `kvoffload-lab --help` must not load (each costs it 5 ms or more; a handler imports them).
HEAVY = (
    "kvoffload.config",
    "kvoffload.playbook",
    "kvoffload.tokenizer",
    "kvoffload.orchestrate.campaign.runner",
    "kvoffload.report",
    "kvoffload.metrics.sampler",
    "kvoffload.lab.lifecycle",
    "rich.console",
    "pandas",
    "ansible_runner",
    "httpx",
    "urllib.request",
)


def test_building_the_parser_loads_no_heavy_layer() -> None:
    probe = (
        "import json, sys\n"
        "from kvoffload.cli.main import build_parser\n"
        "build_parser().format_help()\n"
        f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []
