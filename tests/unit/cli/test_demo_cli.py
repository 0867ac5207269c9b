"""`kvoffload-lab demo`: `kvoffload-lab run` on the virtual lab, with run's own defaults, and the lab
torn down after (the lab's lifecycle replaced by a recorder: no root, no hosts)."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import kvoffload.cli.main
from kvoffload.cli import demo
from kvoffload.cli.args import DEFAULT_WHEEL_CACHE
from kvoffload.cli.main import build_parser
from kvoffload.lab import lifecycle

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def lab(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(lifecycle, "require_root", lambda: None)
    monkeypatch.setattr(lifecycle, "status", lambda: SimpleNamespace(healthy=False, hosts=()))
    monkeypatch.setattr(lifecycle, "up", lambda opts: calls.append(f"up {opts.hosts} {opts.nodes}"))
    monkeypatch.setattr(lifecycle, "down", lambda: calls.append("down") or True)
    return calls


def _demo(monkeypatch: pytest.MonkeyPatch, argv: list[str], rc: int = 0) -> tuple[argparse.Namespace, Any]:
    """Run `demo` with the inner `kvoffload-lab run` parsed by the real parser but not run."""
    seen: list[list[str]] = []

    def fake_main(inner: list[str]) -> int:
        seen.append(inner)
        return rc

    parser = build_parser()
    args = parser.parse_args(["demo", *argv])
    monkeypatch.setattr(kvoffload.cli.main, "main", fake_main)
    assert demo.demo(args) == rc
    (inner,) = seen
    return parser.parse_args(inner), inner


def test_demo_runs_run_with_its_defaults(
    lab: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(ROOT)  # the demo's campaign and inventory are paths of the checkout
    run, _ = _demo(monkeypatch, ["--results", str(tmp_path / "r")])
    assert run.func.__name__ == "run" and run.inventory == demo.DEMO_INVENTORY
    assert run.campaign == demo.DEMO_CAMPAIGNS["sim"] and run.results == tmp_path / "r"
    assert (run.wheel_cache, run.no_wheelhouse, run.hosts_python, run.cells) == (
        DEFAULT_WHEEL_CACHE,
        False,
        None,
        None,
    )
    assert (run.fresh, run.skip_provision, run.no_report, run.watch) == (True, False, False, False)
    assert (run.watch_bind, run.watch_port) == ("127.0.0.1", 8765)
    assert lab == ["down", "up 3 2", "down"]  # a lab not healthy is cleared first; torn down after


def test_demo_resume_watch_and_keep_lab_reach_run(
    lab: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(ROOT)
    argv = ["--results", str(tmp_path / "r"), "--resume", "--watch", "--keep-lab", "--nodes", "1"]
    run, inner = _demo(monkeypatch, argv, rc=1)
    assert run.fresh is False and run.watch is True and "-v" not in inner
    assert lab == ["down", "up 2 1"]  # kept up
