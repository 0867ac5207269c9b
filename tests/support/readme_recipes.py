"""README's recipes as tests read them: named fenced bash blocks, their placeholders and their commands.

A recipe is a ```bash block of README.md right after an HTML comment naming it
(`<!-- recipe: virtual-lab-campaign -->`). Its first lines may assign placeholders (`WORK=$HOME/kvlab
# what it is`): the values a reader replaces with their own, which a test replaces with its own (a
temporary folder, a dataset it wrote). Everything after them is the commands, run as written: the
lab test (tests/lab/test_readme_recipe.py) runs a whole recipe with bash, the unit tests
(tests/unit/docs/test_readme_recipes.py) parse every `kvoffload-lab` command with the CLI's own parser
and run the recipes that need no lab. This module only reads README and rewrites a recipe's text; it
runs nothing.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PROGRAM = "kvoffload-lab"

_MARK = re.compile(r"^<!-- recipe: ([a-z0-9-]+) -->$")
_ASSIGN = re.compile(r"^([A-Z][A-Z0-9_]*)=(\S*)(?:\s+#.*)?$")
_HEREDOC = re.compile(r"<<-?\s*'?\"?([A-Za-z_]+)'?\"?")
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class Recipe:
    """One named recipe: its block's lines (without the fences) and the README line it starts on."""

    name: str
    lines: tuple[str, ...]
    line: int

    def placeholders(self) -> dict[str, str]:
        """The leading `NAME=value` assignments, in order: the values a reader (or a test) sets."""
        out: dict[str, str] = {}
        for line in self.lines:
            found = _ASSIGN.match(line.strip())
            if not found:
                break
            out[found.group(1)] = found.group(2)
        return out

    def commands(self) -> list[str]:
        """The commands after the placeholders, one string each: comments and blank lines dropped, a
        backslash continuation joined, a here-document kept whole with the command that reads it."""
        body = list(self.lines[len(self.placeholders()) :])
        out: list[str] = []
        i = 0
        while i < len(body):
            line = body[i]
            i += 1
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            while line.endswith("\\") and i < len(body):
                line = line[:-1] + " " + body[i].strip()
                i += 1
            heredoc = _HEREDOC.search(line)
            if heredoc:
                end = heredoc.group(1)
                block = [line]
                while i < len(body) and body[i].strip() != end:
                    block.append(body[i])
                    i += 1
                block.append(end)
                i += 1
                line = "\n".join(block)
            out.append(line)
        return out

    def heredoc(self, command: str) -> str:
        """The body of the here-document a command of this recipe carries (without its end marker)."""
        return "\n".join(command.splitlines()[1:-1]) + "\n"

    def variables_used(self) -> set[str]:
        """Every `$NAME` / `${NAME}` its commands read."""
        return {a or b for command in self.commands() for a, b in _VARIABLE.findall(command)}

    def script(self, values: dict[str, str], extra_args: dict[str, tuple[str, ...]] | None = None) -> str:
        """The recipe as a bash script, each placeholder in `values` set to its value instead of
        README's, and `extra_args` appended to the `kvoffload-lab <subcommand>` they name (the lab test's
        own network names for `lab up`). Unknown placeholder names are an error, so a renamed one fails."""
        unknown = set(values) - set(self.placeholders())
        if unknown:
            raise KeyError(f"recipe {self.name} has no placeholder {sorted(unknown)}: {self.placeholders()}")
        lines = []
        for index, line in enumerate(self.lines):
            found = _ASSIGN.match(line.strip()) if index < len(self.placeholders()) else None
            if found and found.group(1) in values:
                line = f"{found.group(1)}={shlex.quote(values[found.group(1)])}"
            for sub, args in (extra_args or {}).items():
                head = f"{PROGRAM} {sub}"
                if line.startswith(head + " ") or line == head:
                    line = head + " " + " ".join(shlex.quote(a) for a in args) + line[len(head) :]
            lines.append(line)
        return "\n".join(lines) + "\n"


def recipes(readme: Path = README) -> dict[str, Recipe]:
    """Every recipe of README by name, in README's order; a mark not followed by a ```bash block, or a
    name used twice, is an error naming the line."""
    text = readme.read_text().splitlines()
    out: dict[str, Recipe] = {}
    for number, line in enumerate(text, start=1):
        mark = _MARK.match(line.strip())
        if not mark:
            continue
        name = mark.group(1)
        if name in out:
            raise ValueError(f"README.md:{number}: recipe {name} is named twice")
        if number >= len(text) or text[number].strip() != "```bash":
            raise ValueError(f"README.md:{number}: recipe {name} is not followed by a ```bash block")
        end = next((i for i in range(number + 1, len(text)) if text[i].strip() == "```"), None)
        if end is None:
            raise ValueError(f"README.md:{number}: recipe {name}: its block never closes")
        out[name] = Recipe(name, tuple(text[number + 1 : end]), number + 2)
    return out


def expand(command: str, values: dict[str, str]) -> str:
    """`command` with each `$NAME` / `${NAME}` of `values` replaced (others left as written)."""

    def one(found: re.Match[str]) -> str:
        name = found.group(1) or found.group(2)
        return values.get(name, found.group(0))

    return _VARIABLE.sub(one, command)


def cli_argv(command: str, values: dict[str, str]) -> list[str] | None:
    """The arguments after `kvoffload-lab` of a one-line command (placeholders expanded, a `> FILE`
    redirection and what follows it dropped); None for a command of another program."""
    words = shlex.split(expand(command.splitlines()[0], values), comments=True)
    if not words or words[0] != PROGRAM:
        return None
    if ">" in words:
        words = words[: words.index(">")]
    return words[1:]


def redirect_target(command: str, values: dict[str, str]) -> str | None:
    """The file a one-line command writes its standard output to (`> FILE`), or None."""
    words = shlex.split(expand(command.splitlines()[0], values), comments=True)
    return words[words.index(">") + 1] if ">" in words else None
