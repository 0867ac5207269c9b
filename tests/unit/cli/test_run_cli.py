"""`kvoffload-lab teardown`: its own flags only, no results folder, no wheelhouse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvoffload.cli.main import main
from kvoffload.orchestrate.campaign import runner as campaign
from kvoffload.playbook.runner import PlaybookRunner

EXAMPLE = Path(__file__).resolve().parents[3] / "inventories" / "example" / "hosts.yml"


def test_teardown_runs_the_playbook_and_writes_nothing_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    artifacts: list[Path] = []

    def fake_run(self: PlaybookRunner, playbook: str, extravars: Any = None, **_kw: Any) -> object:
        ran.append((playbook, dict(extravars or {})))
        artifacts.append(self.artifacts)
        return object()

    def no_wheels(*_a: Any, **_kw: Any) -> None:
        raise AssertionError("teardown built a wheelhouse")

    monkeypatch.setattr(PlaybookRunner, "run", fake_run)
    monkeypatch.setattr(campaign, "build_wheels", no_wheels)
    monkeypatch.chdir(tmp_path)
    assert main(["teardown", str(EXAMPLE)]) == 0
    assert capsys.readouterr().out.strip().endswith("torn down")
    assert [p for p, _ in ran] == ["teardown.yml"]
    # The role variables of a cell, naming a wheel that nobody built (the teardown installs nothing).
    assert ran[0][1]["kvoffload_package_wheel"].endswith("unused.whl")
    assert ran[0][1]["kvoffload_wheelhouse"] is None
    assert list(tmp_path.iterdir()) == []  # no results/ (nor anything else) where it ran
    assert not artifacts[0].exists()  # the scratch folder of the playbook's artifacts is gone


@pytest.mark.parametrize("flag", ["--results", "--wheel-cache", "--no-wheelhouse", "--hosts-python"])
def test_teardown_offers_only_its_own_flags(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["teardown", str(EXAMPLE), flag, "x"])
    assert exc.value.code == 2
    assert f"unrecognized arguments: {flag}" in capsys.readouterr().err
