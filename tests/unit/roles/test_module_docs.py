"""Every module of the collection documents itself as ansible-doc expects, and says true things.

Reads DOCUMENTATION, EXAMPLES and RETURN of each plugins/modules/*.py from its source (ast, the module
is not imported) and holds them against each other and against the module's own argument_spec: an
example may use only documented options (and every required one), each documented option is one the
module accepts with the same type, and a registered result is read only through documented keys.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

MODULES = Path(__file__).resolve().parents[3] / "plugins" / "modules"
MODULE_NAMES = sorted(p.stem for p in MODULES.glob("*.py") if p.stem != "__init__")
NAMESPACE = "kvoffload.lab"
OPTION_KEYS = {"type", "required", "default", "choices", "elements", "description", "suboptions", "aliases"}
RETURN_KEYS = {"description", "type", "returned", "elements", "contains", "sample"}
TYPES = {"str", "int", "float", "bool", "list", "dict", "path", "raw"}
Options = dict[str, dict[str, Any]]
# What every registered result has, whatever the module returns.
COMMON_RESULT_KEYS = {"changed", "failed", "skipped", "msg", "diff"}
# Keys of a task that are not the module's (the others name a module).
TASK_KEYWORDS = {
    "name", "register", "when", "loop", "loop_control", "tags", "become", "delegate_to", "changed_when",
    "failed_when", "check_mode", "environment", "vars", "notify", "ignore_errors", "run_once", "until",
    "retries", "delay", "no_log",
}  # fmt: skip


def _source(module: str) -> ast.Module:
    return ast.parse((MODULES / f"{module}.py").read_text(encoding="utf-8"))


def doc_block(tree: ast.Module, name: str, module: str) -> Any:
    """The YAML of a top-level `NAME = r\"\"\"...\"\"\"` of the module, parsed."""
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return yaml.safe_load(node.value.value)
    pytest.fail(f"plugins/modules/{module}.py has no {name} string")


def _literal(node: ast.expr) -> Any:
    """A literal, where `dict(a=...)` counts as the dict it builds (both spellings of argument_spec)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        return {k.arg: _literal(k.value) for k in node.keywords}
    if isinstance(node, ast.Dict):
        return {ast.literal_eval(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True) if k}
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    return ast.literal_eval(node)


def argument_spec(tree: ast.Module, module: str) -> dict[str, dict[str, Any]]:
    specs = [
        kw.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for kw in node.keywords
        if kw.arg == "argument_spec"
    ]
    assert len(specs) == 1, f"plugins/modules/{module}.py: expected one argument_spec=, found {len(specs)}"
    spec: dict[str, dict[str, Any]] = _literal(specs[0])
    return spec


def module_tasks(examples: list[dict[str, Any]], module: str) -> list[dict[str, Any]]:
    """The module's arguments in every example task that calls it."""
    calls = []
    for task in examples:
        named = [k for k in task if k not in TASK_KEYWORDS]
        assert len(named) == 1, f"{module} EXAMPLES: task {task.get('name')!r} names modules {named}"
        (key,) = named
        assert key.startswith("ansible.") or key == f"{NAMESPACE}.{module}", (
            f"{module} EXAMPLES: task {task.get('name')!r} calls {key!r}; use the FQCN {NAMESPACE}.{module}"
        )
        if key == f"{NAMESPACE}.{module}":
            assert isinstance(task[key], dict), f"{module} EXAMPLES: give the options as a mapping"
            calls.append(task[key])
    return calls


def check_arguments(args: dict[str, Any], options: dict[str, dict[str, Any]], where: str) -> None:
    unknown = sorted(set(args) - set(options))
    assert not unknown, f"{where}: options {unknown} are not in DOCUMENTATION"
    missing = sorted(n for n, o in options.items() if o.get("required") and n not in args)
    assert not missing, f"{where}: required options {missing} are missing"
    for name, value in args.items():
        sub = options[name].get("suboptions")
        if sub and isinstance(value, list):
            for i, item in enumerate(value):
                check_arguments(item, sub, f"{where} {name}[{i}]")


def check_option_docs(options: dict[str, dict[str, Any]], where: str) -> None:
    for name, option in options.items():
        assert isinstance(option, dict), f"{where}: option {name} is not a mapping"
        extra = sorted(set(option) - OPTION_KEYS)
        assert not extra, f"{where}: option {name} has keys {extra}"
        assert option.get("type") in TYPES, f"{where}: option {name} has type {option.get('type')!r}"
        assert isinstance(option.get("description"), str | list), f"{where}: option {name} has no description"
        assert option["description"], f"{where}: option {name} has an empty description"
        if "suboptions" in option:
            check_option_docs(option["suboptions"], f"{where} {name}")


def check_against_spec(options: Options, spec: Options, where: str) -> None:
    only_doc, only_code = sorted(set(options) - set(spec)), sorted(set(spec) - set(options))
    assert not only_doc and not only_code, (
        f"{where}: options only in DOCUMENTATION {only_doc}, only in the argument_spec {only_code}"
    )
    for name, option in options.items():
        for key in ("type", "required", "elements", "choices", "default"):
            documented = option.get(key, False if key == "required" else None)
            coded = spec[name].get(key, False if key == "required" else None)
            assert documented == coded, (
                f"{where}: option {name} {key}: documented {documented!r}, in code {coded!r}"
            )
        if "suboptions" in option or "options" in spec[name]:
            check_against_spec(option.get("suboptions", {}), spec[name].get("options", {}), f"{where} {name}")


def test_modules_are_found() -> None:
    assert len(MODULE_NAMES) >= 7, MODULE_NAMES


@pytest.mark.parametrize("module", MODULE_NAMES)
def test_documentation_is_complete(module: str) -> None:
    doc = doc_block(_source(module), "DOCUMENTATION", module)
    where = f"plugins/modules/{module}.py DOCUMENTATION"
    assert doc["module"] == module, f"{where}: module is {doc['module']!r}"
    for key in ("short_description", "description", "author", "version_added"):
        assert doc.get(key), f"{where}: no {key}"
    assert isinstance(doc.get("options"), dict), f"{where}: no options"
    check_option_docs(doc["options"], where)


@pytest.mark.parametrize("module", MODULE_NAMES)
def test_documented_options_are_the_argument_spec(module: str) -> None:
    tree = _source(module)
    doc = doc_block(tree, "DOCUMENTATION", module)
    check_against_spec(doc["options"], argument_spec(tree, module), f"plugins/modules/{module}.py")


@pytest.mark.parametrize("module", MODULE_NAMES)
def test_every_return_value_is_described(module: str) -> None:
    returns = doc_block(_source(module), "RETURN", module)
    where = f"plugins/modules/{module}.py RETURN"
    assert isinstance(returns, dict) and returns, f"{where}: no return values"
    for name, entry in returns.items():
        # a flow mapping with an unquoted comma in its description parses into stray keys
        assert set(entry) <= RETURN_KEYS, f"{where}: {name} has keys {sorted(set(entry) - RETURN_KEYS)}"
        assert entry.get("description"), f"{where}: {name} has no description"
        assert entry.get("type") in TYPES, f"{where}: {name} has type {entry.get('type')!r}"
        assert entry.get("returned"), f"{where}: {name} does not say when it is returned"


@pytest.mark.parametrize("module", MODULE_NAMES)
def test_examples_call_the_module_by_fqcn_with_documented_options(module: str) -> None:
    tree = _source(module)
    options = doc_block(tree, "DOCUMENTATION", module)["options"]
    examples = doc_block(tree, "EXAMPLES", module)
    assert isinstance(examples, list) and examples, f"plugins/modules/{module}.py EXAMPLES: no tasks"
    calls = module_tasks(examples, module)
    assert calls, f"plugins/modules/{module}.py EXAMPLES: no task calls {NAMESPACE}.{module}"
    for i, args in enumerate(calls):
        check_arguments(args, options, f"plugins/modules/{module}.py EXAMPLES call {i + 1}")


@pytest.mark.parametrize("module", MODULE_NAMES)
def test_examples_read_only_documented_results(module: str) -> None:
    tree = _source(module)
    examples = doc_block(tree, "EXAMPLES", module)
    returns = set(doc_block(tree, "RETURN", module)) | COMMON_RESULT_KEYS
    registered = {t["register"] for t in examples if f"{NAMESPACE}.{module}" in t and "register" in t}
    text = yaml.safe_dump(examples)
    for var in registered:
        read = set(re.findall(rf"\b{re.escape(var)}\.(\w+)", text))
        unknown = sorted(read - returns)
        assert not unknown, f"plugins/modules/{module}.py EXAMPLES reads {unknown} of {var}, not in RETURN"
