"""The probe's engine check imports LMCache's compiled ops as the engine units' start check does, and
fails a node whose cuda_ops do not load, naming the symbol (issue 52): run for real in a child Python
against stand-in torch and lmcache packages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvoffload.doctor import probe
from tests.unit.roles.test_lmcache_ops_check import missing_under, venv


def dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_cuda_ops_that_do_not_load_fail_the_engine_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    symbol = missing_under("2.14.0")[0]
    site = venv(tmp_path, "13.0", f"cuda_ops.so: undefined symbol: {symbol}")
    dist(site, "lmcache", "0.5.6")
    dist(site, "torch", "2.14.0")
    monkeypatch.setenv("PYTHONPATH", str(site))
    got = probe.probe_engine(sys.executable, "json")
    assert got["status"] == probe.FAIL
    assert f"lmcache.cuda_ops does not load under torch 2.14.0: missing symbol {symbol}" in got["detail"]
    assert got["facts"]["compiled_ops"]["lmcache.lmcache_native"] == "ok"


def test_ops_that_load_are_named_in_the_ok(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = venv(tmp_path, "13.0", None)
    dist(site, "lmcache", "0.5.6")
    monkeypatch.setenv("PYTHONPATH", str(site))
    got = probe.probe_engine(sys.executable, "json")
    assert got["status"] == probe.OK and "lmcache.lmcache_native, lmcache.cuda_ops load" in got["detail"]
