"""`kvoffload-lab watch`: its errors, and the terminal table on the fixture caught mid-run."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from kvoffload.cli.main import main
from kvoffload.cli.watch import _table
from kvoffload.report.live import LiveView
from tests.support.watch import mid_run_campaign


def test_a_missing_folder_and_a_bad_port_are_user_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["watch", str(tmp_path / "nope")]) == 2
    assert "nope: no such results folder" in capsys.readouterr().err
    assert main(["watch", str(tmp_path), "--port", "70000"]) == 2
    assert "--port 70000: give a port from 1 to 65535" in capsys.readouterr().err


def test_the_terminal_table_shows_each_node(tmp_path: Path) -> None:
    campaign = mid_run_campaign(tmp_path)
    state = LiveView(campaign, findings=lambda _root: [], clock=lambda: 2045.0).state()
    console = Console(record=True, width=200)
    console.print(_table(state))
    text = console.export_text()
    assert "fixture-small: running - cells 3 done, 1 failed of 7 - elapsed 17.4 min, ETA 5.3 min" in text
    row = next(line for line in text.splitlines() if "gpu1" in line)
    assert "b2cpu" in row and "replay" in row and "30/120, ETA 2.2 min" in row and "100/190 ms" in row
    assert "b1gpu: interrupted" in row  # 135 s of replay left: 2.2 min


def test_run_watch_starts_the_page_beside_and_stops_it(tmp_path: Path) -> None:
    import httpx

    from kvoffload.orchestrate.campaign.beside import start_beside

    campaign = mid_run_campaign(tmp_path)
    beside = start_beside(campaign, "127.0.0.1", 0)
    try:
        assert beside.url.startswith("http://127.0.0.1:")
        state = httpx.get(beside.url + "state.json", timeout=10).json()
        assert state["progress"] == {"done": 3, "failed": 1, "total": 7}
    finally:
        beside.stop()
    assert beside.proc.returncode is not None  # gone with the run


def test_run_watch_on_a_taken_port_names_runs_own_flags(tmp_path: Path) -> None:
    import socket

    from kvoffload.errors import UserError
    from kvoffload.orchestrate.campaign.beside import start_beside

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError) as refused:
            start_beside(mid_run_campaign(tmp_path), "127.0.0.1", port)
    message = str(refused.value)
    assert f"127.0.0.1:{port}" in message and "--watch-port" in message and "in use" in message, message
