"""Every conditional in the collection's YAML is a string (or a plain boolean), as ansible-core 2.19
requires: an unquoted `- x is search('key: value')` in a list parses as a mapping, which only fails when
the task runs (ansible-lint passes it). This holds the rule statically for roles, their molecule
scenarios and the playbooks, so a slip shows here rather than 20 minutes into the molecule lane."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CONDITION_KEYS = ("when", "changed_when", "failed_when", "until")
ASSERT_MODULES = ("ansible.builtin.assert", "assert")


class _AnyTagLoader(yaml.SafeLoader):
    """SafeLoader that reads Ansible's own tags (`!vault`, `!unsafe`) as plain scalars."""


def _any_tag(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_mapping(node)  # type: ignore[arg-type]


_AnyTagLoader.add_multi_constructor("!", _any_tag)


def _yaml_files() -> list[Path]:
    files = [*ROOT.glob("roles/**/*.yml"), *ROOT.glob("playbooks/**/*.yml")]
    return sorted(p for p in files if "templates" not in p.parts)


def _conditions(node: Any, where: str) -> Iterator[tuple[str, Any]]:
    """(place, value) of every conditional found in a loaded YAML document."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            yield from _conditions(item, f"{where}[{i}]")
    elif isinstance(node, dict):
        task = str(node.get("name", where))
        for key in CONDITION_KEYS:
            if key in node:
                yield f"{task}: {key}", node[key]
        for module in ASSERT_MODULES:
            args = node.get(module)
            if isinstance(args, dict) and "that" in args:
                yield f"{task}: {module}.that", args["that"]
        for key, value in node.items():
            yield from _conditions(value, f"{where}.{key}")


def _broken(value: Any) -> list[Any]:
    """The parts of a conditional that are neither strings nor booleans."""
    items = value if isinstance(value, list) else [value]
    return [v for v in items if not isinstance(v, (str, bool))]


def test_the_scan_finds_the_collections_conditionals() -> None:
    found = [c for p in _yaml_files() for c in _conditions(yaml.load(p.read_text(), _AnyTagLoader), p.name)]
    assert len(found) > 200, len(found)  # the roles and scenarios hold hundreds; an empty scan proves nothing


def test_a_mapping_in_a_condition_list_is_found() -> None:
    doc = yaml.load("- ansible.builtin.assert:\n    that:\n      - x is search('a: b')\n", _AnyTagLoader)
    [(place, value)] = list(_conditions(doc, "t"))
    assert place.endswith("ansible.builtin.assert.that") and _broken(value) == [{"x is search('a": "b')"}]


@pytest.mark.parametrize("path", _yaml_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_conditional_is_a_string(path: Path) -> None:
    doc = yaml.load(path.read_text(), _AnyTagLoader)
    broken = {place: bad for place, value in _conditions(doc, path.name) if (bad := _broken(value))}
    assert not broken, f"{path.relative_to(ROOT)}: quote these conditionals (a ': ' made a mapping): {broken}"
