"""The engine units' start check that LMCache's compiled ops load under the venv's torch (issue 52):
roles/kvoffload_python/files/lmcache_ops_check.py, run for real against stand-in torch and lmcache packages,
and where the units run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.roles.render import REPO
from tests.unit.roles.test_rendered_units import rendered_files

SCRIPT = REPO / "roles" / "kvoffload_python" / "files" / "lmcache_ops_check.py"
SYMBOLS = REPO / "tests" / "fixtures" / "engine-wheels" / "symbols"


def missing_under(torch: str) -> list[str]:
    """The torch symbols lmcache 0.5.6's cuda_ops needs that torch `torch` does not export (the recorded
    nm -D of both wheels, tests/fixtures/engine-wheels), less the C++ library's own."""
    needed = set((SYMBOLS / "lmcache-0.5.6.cuda_ops.undefined").read_text().split())
    others = [p for p in SYMBOLS.glob("torch-*.exports")]
    from_torch = set().union(*(set(p.read_text().split()) for p in others))
    exported = set((SYMBOLS / f"torch-{torch}.exports").read_text().split())
    return sorted(s for s in (needed & from_torch) - exported if not s.startswith("_ZNSt"))


def venv(tmp_path: Path, cuda: str | None, cuda_ops_error: str | None) -> Path:
    """A folder standing in for the engine venv's site-packages: a torch of `cuda`, an lmcache whose
    cuda_ops raises ImportError(`cuda_ops_error`) as a .so with an undefined symbol does."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        f"__version__ = '2.14.0'\nclass version:\n    cuda = {cuda!r}\n"
    )
    (tmp_path / "lmcache").mkdir()
    (tmp_path / "lmcache" / "__init__.py").write_text("")
    (tmp_path / "lmcache" / "lmcache_native.py").write_text("")
    body = f"raise ImportError({cuda_ops_error!r})\n" if cuda_ops_error else ""
    (tmp_path / "lmcache" / "cuda_ops.py").write_text(body)
    return tmp_path


def run(site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT)], env={"PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=60
    )


def test_lmcache_0_5_6_under_torch_2_14_misses_the_symbol_the_check_must_name() -> None:
    # hand-worked from the wheels: torch 2.14 gave c10_cuda_check_implementation a sixth argument
    assert missing_under("2.14.0") == ["_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb"]
    assert missing_under("2.13.0") == []


def test_a_cuda_torch_whose_cuda_ops_do_not_load_fails_the_start_naming_the_symbol(tmp_path: Path) -> None:
    symbol = missing_under("2.14.0")[0]
    so = "/opt/kvoffload/venv/lib/python3.12/site-packages/lmcache/cuda_ops.cpython-312-x86_64-linux-gnu.so"
    got = run(venv(tmp_path, "13.0", f"{so}: undefined symbol: {symbol}"))
    assert got.returncode == 1 and got.stdout == ""
    assert f"LMCache's compiled lmcache.cuda_ops does not load under torch 2.14.0 (CUDA 13.0): missing symbol {symbol}" in got.stderr
    assert "fall back to torch ops" in got.stderr and "Known-good engine sets" in got.stderr


@pytest.mark.parametrize(("cuda", "loaded"), [("13.0", "lmcache.lmcache_native, lmcache.cuda_ops"), (None, "lmcache.lmcache_native")])
def test_ops_that_load_pass_and_a_cpu_torch_never_asks_for_cuda_ops(tmp_path: Path, cuda: str | None, loaded: str) -> None:
    # a CPU build's cuda_ops would fail, but LMCache's CPU path never loads it
    got = run(venv(tmp_path, cuda, None if cuda else "libcudart.so.13: cannot open shared object file"))
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip().startswith(f"lmcache-ops-check: {loaded} loaded under torch 2.14.0")


CHECK = "ExecStartPre=/opt/kvoffload/venv/bin/python /opt/kvoffload/venv/libexec/kvoffload-lmcache-ops-check.py"


@pytest.mark.parametrize(("tier", "replica"), [("gpu", False), ("cpu", True), ("nvme", True)])
def test_lmcache_server_and_every_replica_with_the_connector_run_it_first(tier: str, replica: bool) -> None:
    real = rendered_files(tier, "vllm")
    assert (CHECK in real["kvoffload-vllm@.service"]) is replica
    if tier != "gpu":
        unit = real["kvoffload-lmcache.service"]
        assert unit.index(CHECK) < unit.index("ExecStart=/opt/kvoffload/venv/bin/lmcache server")
    sim = rendered_files(tier, "sim")  # no LMCache in the simulator's venv
    assert not [text for text in sim.values() if "lmcache-ops-check" in text]
