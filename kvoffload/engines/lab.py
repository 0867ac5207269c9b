"""Which engine set each node of a lab installs, resolved from the campaign, the inventory and the
built-in sets, before any host is touched.

Orchestration's view of engine sets (kvoffload/engines/sets.py holds the models and the built-in file):
`run`, `plan`, the doctor, the wheelhouse and the cell's extravars all ask `node_sets`. A set comes
from, by name: the campaign's `engine_sets`, the inventory's `kvoffload_engine_sets` (lab-wide sets, e.g.
an air-gapped lab's wheel folder), or the built-in file; `engine_set: auto` is each node's build's
built-in default. A user set named like a built-in one is refused naming both; paths in a set's source
are relative to the file that defines it. The campaign's `engine_source` (or the inventory's
`kvoffload_engine_source`) replaces the chosen set's source. Every refusal is a `UserError` naming the
file and key, and the fix. Reads the built-in file; never a host.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from kvoffload.engines.sets import AUTO, SETS_VAR, EngineSet, EngineSource, builtin_sets, default_set_name
from kvoffload.errors import UserError

if TYPE_CHECKING:
    from kvoffload.config import Host, LabConfig

# Inventory variables (any layer Ansible reads: all.vars, group_vars, host_vars).
INVENTORY_SETS_VAR = "kvoffload_engine_sets"  # the built-in file's key is SETS_VAR
INVENTORY_SOURCE_VAR = "kvoffload_engine_source"
BUILD_VAR = "kvoffload_engine_build"
# The role variable that defined the engine software before engine sets; an inventory override of it
# would now be ignored, so it is refused naming the keys that replace it.
OLD_BUILDS_VAR = "kvoffload_python_engine_builds"


@dataclass(frozen=True)
class ResolvedSet:
    """The set one node installs: its name, the set (source paths absolute), where it is defined
    (`<file>: <key>`) and where its source is written when that is another place."""

    name: str
    spec: EngineSet
    where: str
    builtin: bool
    source_where: str | None = None

    def record(self) -> dict[str, Any]:
        """The set as the role's extravar `kvoffload_engine_set` and as cell.json / campaign.json keep
        it: name, build, requirements, source (paths absolute), os_packages, remove, environment."""
        return {"name": self.name, **self.spec.model_dump(mode="json")}


def _absolute(source: EngineSource, base: Path) -> EngineSource:
    """`source` with wheels_dir and wheels relative to `base` (the defining file's folder) made absolute."""

    def path(value: str) -> str:
        p = Path(value).expanduser()
        return str(p if p.is_absolute() else Path(os.path.normpath(base / p)))

    return source.model_copy(
        update={
            "wheels_dir": path(source.wheels_dir) if source.wheels_dir is not None else None,
            "wheels": [path(w) for w in source.wheels],
        }
    )


def _validated(raw: Any, where: str, model: type[EngineSet] | type[EngineSource]) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = ".".join(str(p) for p in error["loc"])
            problems.append(f"{where}{'.' + loc if loc else ''}: {error['msg']}")
        raise UserError("\n".join(problems)) from exc


def host_build(lab: LabConfig, host: Host) -> str:
    """A vLLM host's build: its `kvoffload_engine_build`, or for auto the build of the campaign's GPU
    vendor (rocm on amd, cuda on nvidia)."""
    build = str((host.vars.model_extra or {}).get(BUILD_VAR, AUTO))
    if build == AUTO:
        return "rocm" if lab.campaign.gpu_vendor == "amd" else "cuda"
    return build


def _inventory_sets(lab: LabConfig, builtins: dict[str, EngineSet], file: str) -> dict[str, ResolvedSet]:
    """The inventory's `kvoffload_engine_sets` of every vLLM host, each set by where it is written."""
    found: dict[str, ResolvedSet] = {}
    for host in lab.inventory.group("vllm"):
        extra = host.vars.model_extra or {}
        if OLD_BUILDS_VAR in extra:
            src, key = host.var_sources.get(OLD_BUILDS_VAR, (lab.inventory.file, OLD_BUILDS_VAR))
            raise UserError(
                f"{src}: {key}: engine software is now chosen by engine sets: name a set with the "
                f"campaign's engine_set, define yours under the campaign's engine_sets or the inventory's "
                f"{INVENTORY_SETS_VAR} (same shape as {file}), and remove {OLD_BUILDS_VAR}"
            )
        raw = extra.get(INVENTORY_SETS_VAR)
        if raw is None:
            continue
        src, key = host.var_sources.get(INVENTORY_SETS_VAR, (lab.inventory.file, INVENTORY_SETS_VAR))
        if not isinstance(raw, dict):
            raise UserError(f"{src}: {key}: must be a mapping of set names to engine sets")
        for name, body in raw.items():
            where = f"{src}: {key}.{name}"
            spec = _validated(body, where, EngineSet)
            spec = spec.model_copy(update={"source": _absolute(spec.source, Path(src).parent)})
            _refuse_builtin_name(str(name), where, builtins, file)
            previous = found.get(str(name))
            if previous is not None and previous.spec != spec:
                raise UserError(
                    f"{where}: engine set {name} is also defined, differently, at {previous.where}: give "
                    "one of them another name"
                )
            found.setdefault(str(name), ResolvedSet(str(name), spec, where, builtin=False))
    return found


def _refuse_builtin_name(name: str, where: str, builtins: dict[str, EngineSet], file: str) -> None:
    if name in builtins:
        raise UserError(
            f"{where}: the name {name} is taken by a built-in engine set ({file}: {SETS_VAR}.{name}): "
            "give yours another name"
        )


def _source_override(lab: LabConfig) -> tuple[EngineSource, str] | None:
    """The campaign's engine_source, else the inventory's kvoffload_engine_source (one for the lab)."""
    if lab.campaign.engine_source is not None:
        base = Path(lab.campaign_file).parent
        return _absolute(lab.campaign.engine_source, base), lab.where("engine_source")
    for host in lab.inventory.group("vllm"):
        raw = (host.vars.model_extra or {}).get(INVENTORY_SOURCE_VAR)
        if raw is not None:
            src, key = host.var_sources.get(INVENTORY_SOURCE_VAR, (lab.inventory.file, INVENTORY_SOURCE_VAR))
            source = _validated(raw, f"{src}: {key}", EngineSource)
            return _absolute(source, Path(src).parent), f"{src}: {key}"
    return None


def known_sets(lab: LabConfig) -> dict[str, ResolvedSet]:
    """Every set a campaign of this lab may name: built-in, the inventory's and the campaign's."""
    from kvoffload.engines.sets import sets_file

    file = str(sets_file())
    builtins = builtin_sets()
    sets = {n: ResolvedSet(n, s, f"{file}: {SETS_VAR}.{n}", builtin=True) for n, s in builtins.items()}
    user = _inventory_sets(lab, builtins, file)
    base = Path(lab.campaign_file).parent
    for name, spec in lab.campaign.engine_sets.items():
        where = lab.where(f"engine_sets.{name}")
        _refuse_builtin_name(name, where, builtins, file)
        if name in user:
            raise UserError(
                f"{where}: engine set {name} is also defined at {user[name].where}: give one of them "
                "another name"
            )
        spec = spec.model_copy(update={"source": _absolute(spec.source, base)})
        user[name] = ResolvedSet(name, spec, where, builtin=False)
    return {**sets, **user}


def node_sets(lab: LabConfig) -> dict[str, ResolvedSet]:
    """Node name -> the engine set it installs (engine vllm; empty for the simulator). Refuses a set the
    campaign names that does not exist, one whose build differs from the node's explicit
    `kvoffload_engine_build`, a vendor and build that do not go together (amd: rocm only; nvidia: no
    rocm), and a set whose wheels are on no public index without a source."""
    if lab.campaign.engine != "vllm":
        return {}
    sets = known_sets(lab)
    override = _source_override(lab)
    chosen = lab.campaign.engine_set
    out: dict[str, ResolvedSet] = {}
    for host in lab.nodes:
        build = host_build(lab, host)
        if chosen == AUTO:
            try:
                name = default_set_name(build)
            except KeyError:
                raise UserError(
                    f"host {host.name}: {BUILD_VAR} {build!r} has no built-in engine set (builds: "
                    "cuda, cpu, rocm)"
                ) from None
        elif chosen not in sets:
            raise UserError(
                f"{lab.where('engine_set')}: no engine set {chosen!r}; known: {', '.join(sorted(sets))} "
                f"(or define it under engine_sets, or the inventory's {INVENTORY_SETS_VAR})"
            )
        else:
            name = chosen
        found = sets[name]
        explicit = str((host.vars.model_extra or {}).get(BUILD_VAR, AUTO))
        if explicit != AUTO and explicit != found.spec.build:
            src, key = host.var_sources.get(BUILD_VAR, (lab.inventory.file, f"host {host.name}: {BUILD_VAR}"))
            raise UserError(
                f"{lab.where('engine_set')}: {name} is an engine set of build {found.spec.build}, but "
                f"{src}: {key} is {explicit} for node {host.name}: choose a set of build {explicit}, or "
                f"set {BUILD_VAR} to {found.spec.build} (or auto)"
            )
        _vendor_rule(lab, name, found)
        if override is not None:
            found = ResolvedSet(found.name, found.spec.model_copy(update={"source": override[0]}),
                                found.where, found.builtin, override[1])  # fmt: skip
        source = found.spec.source
        if source.required and not (source.wheels_dir or source.index_url):
            raise UserError(
                f"{found.where}: engine set {name} (build {found.spec.build}) comes from no public index: "
                f"set engine_source.wheels_dir (a folder of its wheels, built for the hosts' Python) or "
                f"engine_source.index_url in {lab.where('engine_source')}, or {INVENTORY_SOURCE_VAR} in "
                "the inventory"
            )
        out[host.name] = found
    return out


def _vendor_rule(lab: LabConfig, name: str, found: ResolvedSet) -> None:
    vendor, build = lab.campaign.gpu_vendor, found.spec.build
    if vendor == "amd" and build != "rocm":
        raise UserError(
            f"{lab.where('gpu_vendor')}: amd needs an engine set of build rocm, but "
            f"{lab.where('engine_set')} picks {name} ({found.where}), of build {build}: set engine_set "
            "to rocm-vllm0.32 (with engine_source) or auto, or to a set of yours with build: rocm"
        )
    if vendor == "nvidia" and build == "rocm":
        raise UserError(
            f"{lab.where('gpu_vendor')}: nvidia cannot run {name} ({found.where}), of build rocm: set "
            "engine_set to a set of build cuda (or cpu), or gpu_vendor to amd"
        )


def lab_sets(lab: LabConfig) -> list[tuple[ResolvedSet, list[str]]]:
    """The distinct sets of the lab's nodes, each with the nodes that install it (node order)."""
    grouped: dict[str, tuple[ResolvedSet, list[str]]] = {}
    for node, found in node_sets(lab).items():
        grouped.setdefault(found.name, (found, []))[1].append(node)
    return list(grouped.values())


def requirement_sources(found: ResolvedSet) -> list[tuple[str, str]]:
    """(requirement, where its wheel comes from) of every requirement of a set: a single wheel file of
    its source for that distribution, else its folder (offline), its index URL(s) or the default index."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename

    source = found.spec.source
    files = {str(parse_wheel_filename(Path(w).name)[0]): w for w in source.wheels}
    if source.wheels_dir is not None:
        general = f"folder {source.wheels_dir} (offline, no index)"
    elif source.index_url or source.extra_index_urls:
        urls = [u for u in (source.index_url, *source.extra_index_urls) if u]
        general = "index " + " + ".join(urls)
    else:
        general = "the default index (pip's configuration)"
    return [
        (line, f"wheel file {files[name]}" if (name := canonicalize_name(Requirement(line).name)) in files
         else general)
        for line in found.spec.requirements
    ]  # fmt: skip


def wheel_sets(lab: LabConfig) -> list[EngineSet]:
    """The distinct sets the wheelhouse must hold for this lab (none for the simulator)."""
    return [found.spec for found, _nodes in lab_sets(lab)]


def engine_sets_record(lab: LabConfig) -> list[dict[str, Any]]:
    """campaign.json `engine_sets`: each set the nodes installed (its record) with `nodes` and `where`
    it is defined; empty for the simulator."""
    return [{**found.record(), "nodes": nodes, "where": found.where} for found, nodes in lab_sets(lab)]
