"""Every campaign and inventory key, documented from the models: docs/campaign.md, docs/inventory.md and
`kvoffload-lab plan --explain KEY`.

In the CLI layer (it reads the config models and, for the variables the tool passes itself, the
orchestrator's extra-var table, so it sits above both): it walks `Campaign` and every model nested in it,
the inventory's `HostVars` (and the models of its list items), the all.vars variables a config model
types (`kvoffload_campaign`, `kvoffload_prices`), and the shared role variables of roles/kvoffload's
argument spec that an inventory is meant to set. Each key gets its dotted path (`knee_search.resolution`,
`vllm_replicas[].gpus`), its type in words, its default (or "required"), its meaning (the field's
description) and an example: the field's own `examples`, else the first value the repository's example
files give (inventories/*/campaign*.yml, inventories/*/hosts.yml, roles/kvoffload/defaults/main.yml),
named with its file. Nothing here lists key names: a new field is documented by regenerating.

Reads the example files and the argument spec; writes only through `main` (`--write`). Never prints
(`main` writes its one line to stderr); `plan --explain` prints what `explain` returns.

    python -m kvoffload.cli.keydoc --write    # or `make docs`: rewrite docs/campaign.md, docs/inventory.md
    python -m kvoffload.cli.keydoc --check    # exit 1 naming each stale file
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import re
import sys
import textwrap
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

import kvoffload
from kvoffload.config.campaign import Campaign
from kvoffload.config.inventory import CAMPAIGN_VAR, HostVars
from kvoffload.config.slo import PRICES_VAR, Prices
from kvoffload.errors import UserError
from kvoffload.orchestrate.cell.extravar_keys import EXTRAVARS

ROOT = Path(kvoffload.__file__).resolve().parents[1]
CAMPAIGN_DOC = "docs/campaign.md"
INVENTORY_DOC = "docs/inventory.md"
REGENERATE = "make docs (python -m kvoffload.cli.keydoc --write)"
SHARED_ROLE = "roles/kvoffload"
# all.vars variables a config model types: the name, its model, and where an inventory gives it.
MODEL_VARS: tuple[tuple[str, type[BaseModel], str], ...] = (
    (CAMPAIGN_VAR, Campaign, "all.vars only (or `--campaign FILE`)"),
    (PRICES_VAR, Prices, "a variable of the `vllm` hosts, in any layer (all.vars, group_vars/, host_vars/)"),
)
LIST, NAME = "[]", "<name>"  # the path steps to a list's items and to a mapping's values by name
_WIDTH = 110  # prose lines, as the other docs
_INLINE = 100  # an example or default longer than this is shown as a YAML block
_PLURALS = re.compile(r"\b(integer|number|string|mapping|path)\b")


@dataclass(frozen=True)
class KeyDoc:
    """One documented key: what `plan --explain` prints and a doc file lists."""

    key: str  # dotted path; `[]` marks the items of a list
    type: str
    default: str
    meaning: str
    example: str | None  # YAML text of `leaf: value`
    example_source: str | None  # the file it comes from, or "the model's examples"
    doc: str  # the doc file, e.g. docs/campaign.md
    section: str


@dataclass(frozen=True)
class Section:
    title: str
    intro: str
    keys: tuple[KeyDoc, ...]


@dataclass(frozen=True)
class DocFile:
    path: str
    header: str
    intro: str
    sections: tuple[Section, ...]


class UnknownKey(UserError):
    """`plan --explain` of a key no doc lists."""


# ---- types in words -------------------------------------------------------------------------------


def _number(base: str, meta: Sequence[Any]) -> str:
    bounds = {type(m): m for m in meta if isinstance(m, at.Gt | at.Ge | at.Lt | at.Le)}
    gt, ge = getattr(bounds.get(at.Gt), "gt", None), getattr(bounds.get(at.Ge), "ge", None)
    if base == "integer" and (gt == 0 or ge == 1):
        return "positive integer"
    if base == "integer" and ge == 0 and gt is None:
        return "non-negative integer"
    signs = ((at.Gt, ">", "gt"), (at.Ge, ">=", "ge"), (at.Lt, "<", "lt"), (at.Le, "<=", "le"))
    parts = [f"{sign} {getattr(bounds[cls], attr)}" for cls, sign, attr in signs if cls in bounds]
    return f"{base} {', '.join(parts)}" if parts else base


def _string(meta: Sequence[Any]) -> str:
    pattern = next((getattr(m, "pattern", None) for m in meta if getattr(m, "pattern", None)), None)
    if pattern:
        return f"string matching `{pattern}`"
    low = next((m.min_length for m in meta if isinstance(m, at.MinLen)), 0)
    high = next((m.max_length for m in meta if isinstance(m, at.MaxLen)), None)
    text = "non-empty string" if low >= 1 else "string"
    return f"{text} of at most {high} characters" if high is not None else text


def _plural(words: str) -> str:
    return _PLURALS.sub(lambda m: m.group(1) + "s", words.removeprefix("one of "))


def type_words(tp: Any, meta: Sequence[Any] = ()) -> str:
    """A field's type in plain words: "list of positive integers (at least 1)", "one of gpu|cpu|nvme"."""
    origin = get_origin(tp)
    if origin is Annotated:
        base, *more = get_args(tp)
        return type_words(base, [*meta, *more])
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return " or ".join(type_words(a, meta) for a in args)
    if origin is Literal:
        return "one of " + "|".join(str(a) for a in get_args(tp))
    if origin is list:
        low = next((m.min_length for m in meta if isinstance(m, at.MinLen)), 0)
        item = _plural(type_words(get_args(tp)[0]))
        return f"list of {item}" + (f" (at least {low})" if low else "")
    if origin is dict and get_args(tp)[1:] and get_args(tp)[1] is not Any:
        return f"mapping of names to {_plural(type_words(get_args(tp)[1]))}"
    if origin is dict or tp is dict:
        return "mapping"
    if inspect.isclass(tp) and issubclass(tp, BaseModel):
        return "mapping (its keys follow)"
    simple: dict[Any, Callable[[], str]] = {
        bool: lambda: "true or false",
        int: lambda: _number("integer", meta),
        float: lambda: _number("number", meta),
        str: lambda: _string(meta),
        Any: lambda: "any value",
    }
    return simple[tp]() if tp in simple else str(tp)


def _nested(tp: Any) -> tuple[type[BaseModel], str] | None:
    """The model a field holds and the path step to it: "" (the value), LIST (each list item) or NAME
    (each value of a mapping by name); None for a plain value."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _nested(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        found = [n for a in get_args(tp) if (n := _nested(a)) is not None]
        return found[0] if found else None
    if origin in (list, dict):
        inner = _nested(get_args(tp)[-1]) if get_args(tp) else None
        return None if inner is None or inner[1] else (inner[0], LIST if origin is list else NAME)
    if inspect.isclass(tp) and issubclass(tp, BaseModel):
        return tp, ""
    return None


# ---- values and examples --------------------------------------------------------------------------


def _yaml(value: Any, name: str | None = None) -> str:
    """`name: value` (or the value alone) as YAML: one flow line when short, else a block."""
    plain = to_jsonable_python(value)  # a model's default may be a model (EngineSource())
    data = plain if name is None else {name: plain}
    line: str = yaml.safe_dump(data, default_flow_style=True, sort_keys=False, width=10**6)
    line = line.strip().removesuffix("...").strip()
    if name is not None:
        line = line.removeprefix("{").removesuffix("}")
    if "\n" not in line and len(line) <= _INLINE:
        return line
    block: str = yaml.safe_dump(data, default_flow_style=None, sort_keys=False, width=10**6)
    if max(len(x) for x in block.splitlines()) > _INLINE:
        block = yaml.safe_dump(data, default_flow_style=False, sort_keys=False, width=10**6)
    return block.rstrip()


def _default_text(field: FieldInfo) -> str:
    """`value` (code), or "required" / "not set" (prose)."""
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    return "not set" if value is None else f"`{_yaml(value)}`"


def _parts(key: str) -> list[str]:
    return [p for p in re.split(r"\.|(?=\[\])", key) if p]


def _lookup(data: Any, parts: Sequence[str]) -> tuple[bool, Any]:
    """The value at a dotted path (`[]`, `<name>`: the first list item or mapping value that has the
    rest)."""
    if not parts:
        return True, data
    head, rest = parts[0], parts[1:]
    if head in (LIST, NAME):
        items = data if head == LIST and isinstance(data, list) else []
        items = list(data.values()) if head == NAME and isinstance(data, dict) else items
        for item in items:
            found = _lookup(item, rest)
            if found[0]:
                return found
        return False, None
    if isinstance(data, dict) and head in data:
        return _lookup(data[head], rest)
    return False, None


def _load(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def _host_layers(group: Any) -> Iterator[Any]:
    """The variable layers of a YAML inventory's group, in file order: its vars, hosts, children."""
    if not isinstance(group, dict):
        return
    yield group.get("vars")
    yield from (group.get("hosts") or {}).values()
    for child in (group.get("children") or {}).values():
        yield from _host_layers(child)


@dataclass(frozen=True)
class Examples:
    """The repository's example files, parsed once: campaigns (where each sits) and host variable
    layers, each with the file it comes from (relative to the repository)."""

    campaigns: tuple[tuple[str, Any], ...]
    host_layers: tuple[tuple[str, Any], ...]
    shared_defaults: tuple[tuple[str, Any], ...]

    @staticmethod
    def read(root: Path) -> Examples:
        campaigns: list[tuple[str, Any]] = []
        layers: list[tuple[str, Any]] = []
        for path in sorted(root.glob("inventories/*/campaign*.yml")):
            campaigns.append((str(path.relative_to(root)), _load(path)))
        for path in sorted(root.glob("inventories/*/hosts.yml")):
            rel, data = str(path.relative_to(root)), _load(path)
            all_group = data.get("all") if isinstance(data, dict) else None
            found, campaign = _lookup(all_group, ["vars", CAMPAIGN_VAR])
            if found:
                campaigns.append((rel, campaign))
            layers += [(rel, layer) for layer in _host_layers(all_group) if isinstance(layer, dict)]
        defaults = root / SHARED_ROLE / "defaults" / "main.yml"
        shared = [(str(defaults.relative_to(root)), _load(defaults))] if defaults.is_file() else []
        return Examples(tuple(campaigns), tuple(layers), tuple(shared))

    @staticmethod
    def files(*sources: Sequence[tuple[str, Any]]) -> list[str]:
        return list(dict.fromkeys(f for group in sources for f, _ in group))

    @staticmethod
    def first(sources: Sequence[tuple[str, Any]], key: str) -> tuple[Any, str] | None:
        for source, data in sources:
            found, value = _lookup(data, _parts(key))
            if found:
                return value, source
        return None


def _field_example(field: FieldInfo | None) -> tuple[Any, str] | None:
    if field is not None and field.examples:
        return field.examples[0], "the model's examples"
    return None


# ---- the walk over a model ------------------------------------------------------------------------


def _key_doc(
    key: str, words: str, default: str, meaning: str, example: tuple[Any, str] | None, doc: str, section: str
) -> KeyDoc:
    """A KeyDoc; `example` is (value, where it comes from) or None."""
    text, source = (None, None) if example is None else (_yaml(example[0], _leaf(key)), example[1])
    return KeyDoc(key, words, default, meaning, text, source, doc, section)


def _doc_text(model: type[BaseModel]) -> str:
    return " ".join((inspect.getdoc(model) or "").split())


def _leaf(key: str) -> str:
    return _parts(key)[-1]


def walk_model(
    model: type[BaseModel],
    prefix: str,
    doc: str,
    title: str,
    find: Callable[[str, FieldInfo | None], tuple[Any, str] | None],
) -> list[Section]:
    """A section for `model`'s own keys (paths start with `prefix`), then one per nested model."""
    keys: list[KeyDoc] = []
    nested: list[Section] = []
    for name, field in model.model_fields.items():
        key = prefix + name
        example = find(key, field)
        words = type_words(field.annotation, field.metadata)
        keys.append(_key_doc(key, words, _default_text(field), field.description or "", example, doc, title))
        sub = _nested(field.annotation)
        if sub is not None:
            child = key + {"": ".", LIST: "[].", NAME: f".{NAME}."}[sub[1]]
            nested += walk_model(sub[0], child, doc, f"`{child.removesuffix('.')}`", find)
    intro = _doc_text(model)
    return [Section(title, intro, tuple(keys)), *nested]


def _campaign_path(model: type[BaseModel]) -> str | None:
    """The campaign key that holds `model` (`prices` for Prices), if any."""
    for name, field in Campaign.model_fields.items():
        sub = _nested(field.annotation)
        if sub is not None and sub[0] is model and not sub[1]:
            return name
    return None


# ---- the two documents ----------------------------------------------------------------------------


def _header(model: str) -> str:
    return (
        f"_Generated from {model} by `python -m kvoffload.cli.keydoc --write` (`make docs`): change the "
        "model's Field descriptions "
        "and examples, then regenerate; a unit test holds this file equal to them._"
    )


def _how_to_read(files: Sequence[str]) -> str:
    listed = ", ".join(files) if files else "none found"
    return (
        "Each key is written as its dotted path (`knee_search.resolution` is `resolution:` inside "
        f"`knee_search:`; `{LIST}` stands for each item of a list, `{NAME}` for each name of a mapping). "
        "Then: its type; its default, where "
        '"required" means it must be given and "not set" that leaving it out has the effect its meaning '
        "says; its meaning; and an example, from the field's own examples or else from the first example "
        f"file that gives the key (the file is named). The example files: {listed}. "
        "`kvoffload-lab plan --explain KEY` prints one key."
    )


def campaign_doc(examples: Examples) -> DocFile:
    def find(key: str, field: FieldInfo | None) -> tuple[Any, str] | None:
        return _field_example(field) or Examples.first(examples.campaigns, key)

    intro = (
        f"A campaign lives in the inventory's `all.vars.{CAMPAIGN_VAR}` or in its own YAML file "
        "(`kvoffload-lab plan|run INVENTORY --campaign FILE`). It is strict: an unknown key or a wrong type "
        "is an error naming the file and the key; rules that tie two keys together name both (their "
        'semantics: docs/contracts.md, "Campaign keys"). The cells are the product of the list keys '
        "(tiers x concurrency x num_rounds x isl x osl, times repeats).\n\n"
        + _how_to_read(Examples.files(examples.campaigns))
    )
    sections = walk_model(Campaign, "", CAMPAIGN_DOC, "Top-level keys", find)
    return DocFile(CAMPAIGN_DOC, _header("kvoffload.config.campaign.Campaign"), intro, tuple(sections))


def _spec_type(option: dict[str, Any]) -> str:
    if option.get("choices"):
        return "one of " + "|".join(str(c) for c in option["choices"])
    words = {"str": "string", "int": "integer", "bool": "true or false", "dict": "mapping", "raw": "any"}
    kind = str(option.get("type", "str"))
    if kind == "list":
        return f"list of {_plural(words.get(str(option.get('elements', 'str')), 'value'))}"
    return words.get(kind, kind)


def _shared_vars(root: Path, examples: Examples, per_cell: frozenset[str]) -> tuple[Section, list[str]]:
    """roles/kvoffload's variables that an inventory sets (those kvoffload-lab does not pass per cell),
    and the names of those it does pass."""
    spec_file = root / SHARED_ROLE / "meta" / "argument_specs.yml"
    spec = _load(spec_file) if spec_file.is_file() else None
    found, options = _lookup(spec, ["argument_specs", "main", "options"])
    options = options if found and isinstance(options, dict) else {}
    defaults = examples.shared_defaults[0][1] if examples.shared_defaults else {}
    title = f"Shared role variables ({SHARED_ROLE})"
    keys = []
    for name, option in options.items():
        if name in per_cell:
            continue
        described = option.get("description", "")
        text = " ".join(described) if isinstance(described, list) else str(described)
        meaning = " ".join(text.split())
        if isinstance(defaults, dict) and name in defaults:
            default = f"`{_yaml(defaults[name])}`"
            if "\n" in default:
                default = f"the value in {examples.shared_defaults[0][0]} (the example below)"
        else:
            default = f"`{_yaml(option['default'])}`" if option.get("default") is not None else "not set"
        example = Examples.first(examples.host_layers, name) or Examples.first(examples.shared_defaults, name)
        keys.append(_key_doc(name, _spec_type(option), default, meaning, example, INVENTORY_DOC, title))
    intro = (
        "Read by the roles on the hosts, some by kvoffload-lab too (where it builds URLs or picks wheels); "
        f"declared, typed and defaulted in {SHARED_ROLE}/meta/argument_specs.yml and defaults/main.yml. "
        "Set them in any layer of the inventory."
    )
    passed = [name for name in options if name in per_cell]
    return Section(title, intro, tuple(keys)), passed


def inventory_doc(examples: Examples, root: Path, per_cell: frozenset[str]) -> DocFile:
    def find(key: str, field: FieldInfo | None) -> tuple[Any, str] | None:
        found = _field_example(field) or Examples.first(examples.host_layers, key)
        if found is not None:
            return found
        # An all.vars model that the campaign also holds (kvoffload_prices: the campaign's `prices`).
        head, _, rest = key.partition(".")
        model = next((m for name, m, _ in MODEL_VARS if name == head), None)
        path = None if model is None else _campaign_path(model)
        return None if path is None else Examples.first(examples.campaigns, f"{path}.{rest}".rstrip("."))

    sections = walk_model(HostVars, "", INVENTORY_DOC, "Host variables kvoffload-lab checks", find)
    sections[0] = Section(
        sections[0].title,
        _doc_text(HostVars) + " They may be set in any layer: a host's entry, a group's vars, all.vars, "
        "group_vars/ or host_vars/ files; a later layer replaces a variable whole (docs/contracts.md, "
        '"Inventory").',
        sections[0].keys,
    )
    model_keys = []
    typed = "Variables typed by a campaign model"
    for name, model, where in MODEL_VARS:
        path = _campaign_path(model)
        same = (
            CAMPAIGN_DOC
            if model is Campaign
            else f"the same keys as the campaign's `{path}` ({CAMPAIGN_DOC}, section `{path}`)"
        )
        example = find(name, None)
        meaning = f"{_doc_text(model)} Where: {where}. Keys: {same}."
        model_keys.append(_key_doc(name, "mapping", "not set", meaning, example, INVENTORY_DOC, typed))
    sections.append(Section(typed, "", tuple(model_keys)))
    shared, passed = _shared_vars(root, examples, per_cell)
    if passed:
        shared = Section(
            shared.title,
            shared.intro + " Not listed: " + ", ".join(f"`{n}`" for n in passed) + ", which kvoffload-lab "
            "passes to every playbook run from the campaign and the run (extra variables win over the "
            "inventory; kvoffload/orchestrate/cell/extravar_keys.py).",
            shared.keys,
        )
    sections.append(shared)
    intro = (
        "The inventory is an Ansible YAML (or INI) inventory: groups `vllm`, `lmcache`, `lb`, `client` "
        "(docs/architecture.md section 3, inventories/example/hosts.yml). Host variables are Ansible's "
        "and open-ended: this file lists those kvoffload-lab and its shared role read. Each role's own "
        "variables are in its roles/<role>/README.md.\n\n"
        + _how_to_read(Examples.files(examples.host_layers, examples.campaigns, examples.shared_defaults))
    )
    models = (
        f"kvoffload.config.inventory.HostVars, the campaign models and {SHARED_ROLE}/meta/argument_specs.yml"
    )
    return DocFile(INVENTORY_DOC, _header(models), intro, tuple(sections))


def _per_cell_vars() -> frozenset[str]:
    """The variables the orchestrator passes per cell (their one home: orchestrate/cell/extravar_keys.py)."""
    return frozenset(EXTRAVARS)


def build_docs(root: Path = ROOT) -> tuple[DocFile, DocFile]:
    examples = Examples.read(root)
    return campaign_doc(examples), inventory_doc(examples, root, _per_cell_vars())


# ---- rendering ------------------------------------------------------------------------------------


def _fill(text: str, indent: str = "") -> str:
    return textwrap.fill(
        text, _WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )


def render_key(doc: KeyDoc) -> str:
    """A key's block: its path, meaning, type, default and example (Markdown)."""
    lines = [f"### `{doc.key}`", "", _fill(doc.meaning or "(no description)"), ""]
    lines += [_fill(f"- type: {doc.type}", "  "), _fill(f"- default: {doc.default}", "  ")]
    if doc.example is None:
        lines.append("- example: none in the example files")
    elif "\n" in doc.example:
        lines += [f"- example ({doc.example_source}):", "", "  ```yaml"]
        lines += [f"  {line}".rstrip() for line in doc.example.splitlines()] + ["  ```"]
    else:
        lines.append(f"- example: `{doc.example}` ({doc.example_source})")
    return "\n".join(lines)


def render(doc: DocFile) -> str:
    title = "Campaign" if doc.path == CAMPAIGN_DOC else "Inventory"
    out = [doc.header, "", f"# {title} keys", "", *(_fill(p) + "\n" for p in doc.intro.split("\n\n"))]
    out[-1] = out[-1].rstrip("\n")
    for section in doc.sections:
        out += ["", f"## {section.title}"]
        if section.intro:
            out += ["", _fill(section.intro)]
        for key in section.keys:
            out += ["", render_key(key)]
    return "\n".join(out) + "\n"


# ---- plan --explain -------------------------------------------------------------------------------


def _normal(key: str) -> str:
    key = key.strip()
    for name, model, _ in MODEL_VARS:
        path = "" if model is Campaign else _campaign_path(model)
        if path is not None and key.startswith(f"{name}."):
            return (f"{path}." if path else "") + key.removeprefix(f"{name}.")
    return key


def _pattern(key: str) -> str:
    """A regex a key as typed matches: `a[].b` is found as `a[0].b`, `a[].b` and `a.b`; `s.<name>.x`
    as `s.mine.x`."""
    escaped = re.escape(key).replace(re.escape(LIST), r"(\[\d*\])?").replace(re.escape(NAME), "[^.]+")
    return escaped


def explain(key: str, root: Path = ROOT) -> str:
    """The doc block of `key` (campaign or inventory; `a[0].b` and `a.b` both find `a[].b`), with its
    doc file. Raises UnknownKey with the closest keys and the doc files."""
    every = [k for doc in build_docs(root) for s in doc.sections for k in s.keys]
    wanted = _normal(key)
    hits = [k for k in every if re.fullmatch(_pattern(k.key), wanted)]
    if not hits:
        close = difflib.get_close_matches(wanted, [k.key for k in every], n=5, cutoff=0.5)
        raise UnknownKey(
            f"plan --explain: no key {key!r}"
            + (f"; closest: {', '.join(close)}" if close else "")
            + f"; every key is in {CAMPAIGN_DOC} and {INVENTORY_DOC}"
        )
    return "\n\n".join(f"{render_key(k)}\n\n(in {k.doc}, section {k.section})" for k in hits)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvoffload.cli.keydoc", description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"rewrite {CAMPAIGN_DOC} and {INVENTORY_DOC}")
    mode.add_argument("--check", action="store_true", help="exit 1 naming each doc that differs")
    args = parser.parse_args(argv)
    stale = []
    for doc in build_docs(ROOT):
        path, text = ROOT / doc.path, render(doc)
        if args.write:
            path.write_text(text)
        elif not path.is_file() or path.read_text() != text:
            stale.append(doc.path)
    if stale:
        sys.stderr.write(f"stale: {', '.join(stale)}: regenerate with {REGENERATE}\n")
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
