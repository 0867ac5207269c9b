"""Every `lmcache_mp_` metric family an LMCache wheel's MP server can export, read from its source.

The analysis must know every name a real server exports (kvoffload/analysis/names.py LMC_KNOWN_NAMES):
an unknown one reads as a rename and turns absent counters from 0 into null. A capture shows only the
families its run touched (a CPU-mode server never shows the CUDA transfer path's), so the full list is
derived from the wheel itself: this walks the syntax tree (never imports) of every module of the MP
server's packages for the OpenTelemetry instruments it creates, and applies the Prometheus exporter's
naming. The result is the committed fixture tests/fixtures/lmcache-<version>-wheel/metric-families.txt,
which unit tests hold LMC_KNOWN_NAMES to, and which the real-engine lane holds the wheel it installs to.

    pip download --no-deps lmcache==0.5.6 -d /tmp/lmc
    python -m tests.support.lmcache_names /tmp/lmc/lmcache-0.5.6-*.whl   # rewrites that version's fixture

Test support only: nothing in kvoffload imports it.
"""

from __future__ import annotations

import ast
import re
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import parse_wheel_filename

from tests.support.wheel_source import wheelhouse_wheels

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
# The MP server's packages (lmcache 0.5.6): its event-bus subscribers (mp_observability), the storage
# manager, L1/L2 controllers (distributed) and the server's modules (multiprocess: the lookup and P2P
# job gauges, kv_events' log depth). Left out: lmcache/v1/mp_coordinator (the coordinator, another
# process with its own /metrics) and lmcache/observability.py (the non-MP engine's `lmcache:` names).
PACKAGES = ("lmcache/v1/mp_observability/", "lmcache/v1/distributed/", "lmcache/v1/multiprocess/")
PREFIX = "lmcache_mp"

# OpenTelemetry instrument factory -> the Prometheus type its data is exported as. A monotonic Sum is a
# counter; an up-down counter (a non-monotonic cumulative Sum) becomes a gauge
# (opentelemetry-exporter-prometheus 0.61b0, opentelemetry/exporter/prometheus/__init__.py,
# `should_convert_sum_to_gauge`).
# With the index of `unit` among the positional arguments (opentelemetry-api's Meter: the synchronous
# factories take (name, unit, description), the observable ones (name, callbacks, unit, description)).
_INSTRUMENTS = {
    "create_counter": ("counter", 1),
    "create_observable_counter": ("counter", 2),
    "create_histogram": ("histogram", 1),
    "create_up_down_counter": ("gauge", 1),
    "create_observable_up_down_counter": ("gauge", 2),
    "create_gauge": ("gauge", 1),
    "create_observable_gauge": ("gauge", 2),
}
# lmcache 0.5.6 lmcache/v1/mp_observability/otel_init.py: register_gauge(meter_name, gauge_name,
# description, func) wraps create_observable_gauge; callers also bind its first argument with partial.
_WRAPPER = "register_gauge"
_WRAPPER_NAME_INDEX = 1

# The exporter's unit mapping, opentelemetry-exporter-prometheus 0.61b0 _mapping.py (_UNIT_MAPPINGS,
# _PER_UNIT_MAPPINGS, map_unit, sanitize_full_name): the versions lmcache 0.5.6 allows
# (opentelemetry-exporter-prometheus<=0.61b0,>=0.50b0 in its METADATA).
_UNITS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds",
    "us": "microseconds", "ns": "nanoseconds", "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes",
    "GiBy": "gibibytes", "TiBy": "tibibytes", "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes",
    "TBy": "terabytes", "m": "meters", "V": "volts", "A": "amperes", "J": "joules", "W": "watts",
    "g": "grams", "Cel": "celsius", "Hz": "hertz", "1": "", "%": "percent",
}  # fmt: skip
_PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}
_INVALID = re.compile(r"[^a-zA-Z0-9:]+")
_ANNOTATION = re.compile(r"{.*}")


class ExtractError(Exception):
    """An instrument whose name or unit the extractor cannot read: the wheel needs a look by hand."""


@dataclass(frozen=True, order=True)
class Family:
    """One exported family: counters with `_total`, histograms by base name, gauges as they are (the
    spelling of tests/fixtures/lmcache-0.5.6-cpu/metric-names-types.txt)."""

    name: str
    type: str
    source: str


def _sanitize(name: str) -> str:
    return _INVALID.sub("_", name)


def prometheus_unit(unit: str) -> str:
    """The unit suffix the exporter appends (its `map_unit`): "s" -> seconds, "GB/s" ->
    GB_per_second, annotations such as "{chunks}" -> nothing."""
    unit = _ANNOTATION.sub("", unit)
    if unit in _UNITS:
        return _UNITS[unit]
    top, sep, bottom = unit.partition("/")
    if sep and _sanitize(bottom):
        top = _UNITS.get(_sanitize(top), _sanitize(top))
        per = _PER_UNITS.get(_sanitize(bottom), _sanitize(bottom))
        return f"{top}_per_{per}" if top else f"per_{per}"
    return _sanitize(unit).strip("_")


def exported_name(name: str, unit: str, kind: str) -> str:
    """The family name Prometheus shows for an instrument `name` with `unit` of `kind`: the exporter
    sanitizes the name; prometheus_client's CounterMetricFamily drops a `_total` the name ends with,
    Metric appends `_<unit>` unless the name already ends so (prometheus_client metrics_core.py), and
    the exposition adds `_total` to a counter's samples."""
    out = _sanitize("_" + name[1:] if name[:1].isdigit() else name)
    if kind == "counter":
        out = out.removesuffix("_total")
    suffix = prometheus_unit(unit)
    if suffix and not out.endswith("_" + suffix):
        out += "_" + suffix
    return out + "_total" if kind == "counter" else out


def _literal(node: ast.expr, what: str, where: str) -> str | None:
    """A string constant's value; None for an f-string that cannot make an `lmcache_mp` name."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        head = node.values[0] if node.values else None
        fixed = ""
        if isinstance(head, ast.Constant) and isinstance(head.value, str):
            fixed = _sanitize(head.value)
        if fixed and not PREFIX.startswith(fixed[: len(PREFIX)]):
            return None  # e.g. f"lmcache_blend.{phase}_duration": another prefix whatever the phase
    raise ExtractError(f"{where}: the {what} is not a string literal: {ast.unparse(node)}")


def _argument(call: ast.Call, index: int, keyword: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    return call.args[index] if len(call.args) > index else None


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    a = fn.args
    return {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}


def _wrappers(tree: ast.Module) -> dict[str, int]:
    """Callable name -> index of the metric name among its positional arguments: register_gauge, and
    names bound to `partial(register_gauge, <k arguments>)`."""
    out = {_WRAPPER: _WRAPPER_NAME_INDEX}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        call = node.value
        func = call.func
        is_partial = (isinstance(func, ast.Name) and func.id == "partial") or (
            isinstance(func, ast.Attribute) and func.attr == "partial"
        )
        if is_partial and call.args and isinstance(call.args[0], ast.Name) and call.args[0].id == _WRAPPER:
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = _WRAPPER_NAME_INDEX - (len(call.args) - 1)
    return out


def _called(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return None


def families_in_source(source: str, path: str) -> list[Family]:
    """The `lmcache_mp` families one module creates. A name or unit that is not a literal raises
    ExtractError, except the wrapper's own pass-through of its parameter."""
    tree = ast.parse(source, filename=path)
    wrappers = _wrappers(tree)
    passthrough: set[int] = set()  # calls inside a function whose name argument is its parameter
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            params = _parameters(fn)
            for call in ast.walk(fn):
                if isinstance(call, ast.Call) and _called(call) in _INSTRUMENTS:
                    arg = _argument(call, 0, "name")
                    if isinstance(arg, ast.Name) and arg.id in params:
                        passthrough.add(id(call))
    out = []
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call) or id(call) in passthrough:
            continue
        called = _called(call)
        where = f"{path}:{call.lineno}"
        if called in _INSTRUMENTS:
            kind, unit_index = _INSTRUMENTS[called]
            name_node, unit_node = _argument(call, 0, "name"), _argument(call, unit_index, "unit")
        elif called in wrappers and not (called == _WRAPPER and isinstance(call.func, ast.Attribute)):
            kind, unit_node = "gauge", None
            name_node = _argument(call, wrappers[called], "gauge_name")
        else:
            continue
        if name_node is None:
            raise ExtractError(f"{where}: {called} without a metric name")
        name = _literal(name_node, "metric name", where)
        if name is None or not _sanitize(name).startswith(PREFIX + "_"):
            continue
        unit = "" if unit_node is None else _literal(unit_node, "unit", where)
        if unit is None:
            raise ExtractError(f"{where}: the unit of {name} is not a string literal")
        out.append(Family(exported_name(name, unit, kind), kind, path))
    return out


def _sources(wheel: Path) -> Iterator[tuple[str, str]]:
    with zipfile.ZipFile(wheel) as zf:
        for member in sorted(zf.namelist()):
            if member.endswith(".py") and member.startswith(PACKAGES):
                yield member, zf.read(member).decode("utf-8")


def wheel_families(wheel: Path) -> list[Family]:
    """Every `lmcache_mp_` family the wheel's MP server packages create, sorted, one entry per name
    (the first defining module). A name created with two types raises ExtractError."""
    by_name: dict[str, Family] = {}
    for path, source in _sources(wheel):
        for fam in families_in_source(source, path):
            seen = by_name.setdefault(fam.name, fam)
            if seen.type != fam.type:
                raise ExtractError(f"{fam.name} is a {seen.type} in {seen.source} and a {fam.type} in {path}")
    if not by_name:
        raise ExtractError(f"{wheel}: no lmcache_mp metric found under {', '.join(PACKAGES)}")
    return sorted(by_name.values())


def render(families: list[Family]) -> str:
    """The fixture's text: one `name type defining-module` line per family."""
    return "".join(f"{f.name} {f.type} {f.source}\n" for f in families)


def read_fixture(path: Path) -> dict[str, str]:
    """name -> type of a metric-families.txt."""
    out = {}
    for line in path.read_text().splitlines():
        name, kind, _source = line.split()
        out[name] = kind
    return out


def fixture_for(wheel: Path) -> Path:
    """The committed family list of the LMCache version `wheel` is (by its file name)."""
    version = parse_wheel_filename(wheel.name)[1]
    return FIXTURES / f"lmcache-{version}-wheel" / "metric-families.txt"


def wheelhouse_lmcache_wheels(cache: Path) -> list[Path]:
    """The lmcache wheels of every complete engine set in a wheel cache."""
    return wheelhouse_wheels(cache, "lmcache")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write(__doc__ or "")
        return 2
    wheel = Path(argv[0])
    families = wheel_families(wheel)
    target = fixture_for(wheel)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(families))
    sys.stderr.write(f"wrote {len(families)} families of {wheel.name} to {target.relative_to(ROOT)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
