"""Teardown keeps the journal of a replica that systemd had to kill at TimeoutStopSec (and, after a
failed cell, of every unit it stopped).

Runs the vllm role's teardown_journal.yml on a local connection, with a `journalctl` stand-in first
on PATH (this machine has no systemd as PID 1), after a stop whose kvoffload_unit_states result says
which unit's stop timed out: only that unit's journal lands in the cell's units/ folder. The stop
itself (one `systemctl stop` for the units that run) is the module's, tested in
tests/unit/roles/test_unit_states_module.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.ansible import ansible_playbook

pytestmark = pytest.mark.integration

UNITS = ["kvoffload-vllm@0.service", "kvoffload-vllm@1.service", "kvoffload-vllm@2.service"]


def _run(
    tmp_path: Path, results: list[str], journal_dir: Path | None, units: str | None = None
) -> tuple[str, int]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    # `journalctl --no-pager --unit U ...`: says whose journal it printed.
    (bin_dir / "journalctl").write_text('#!/bin/sh\necho "journal of $3: still serving after SIGTERM"\n')
    (bin_dir / "journalctl").chmod(0o755)
    # The module's answer to the stop: the units it stopped, and each unit's Result after it; a replica
    # that did not run (not stopped) keeps the `timeout` of an earlier stop, which is not this cell's.
    stop = {
        "stopped": UNITS,
        "units": {
            u: {"Id": u, "ActiveState": "inactive", "Result": r} for u, r in zip(UNITS, results, strict=True)
        }
        | {"kvoffload-vllm@9.service": {"Id": "kvoffload-vllm@9.service", "Result": "timeout"}},
    }
    play = [
        {
            "hosts": "all",
            "gather_facts": False,
            "roles": [{"role": "kvoffload"}],
            "tasks": [
                {
                    "ansible.builtin.include_role": {"name": "vllm", "tasks_from": "teardown_journal.yml"},
                    "vars": {"_vllm_teardown_stop": stop},
                }
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    extravars = {} if journal_dir is None else {"replay_controller_dir": str(journal_dir)}
    if units is not None:
        extravars["vllm_teardown_journal_units"] = units
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1"}
    done = ansible_playbook(
        "-i", "gpu1,", "-c", "local", str(tmp_path / "play.yml"), extravars=extravars, env=env
    )
    return done.stdout, done.returncode


def test_only_the_unit_whose_stop_timed_out_has_its_journal_kept(tmp_path: Path) -> None:
    cell = tmp_path / "cell"
    out, rc = _run(tmp_path, ["success", "timeout", "success"], cell)
    assert rc == 0, out[-3000:]
    kept = sorted(p.name for p in (cell / "units").iterdir())
    assert kept == ["gpu1--kvoffload-vllm@1.service.stop-timeout.journal.txt"]
    text = (cell / "units" / kept[0]).read_text()
    assert text == "journal of kvoffload-vllm@1.service: still serving after SIGTERM\n"
    assert "kvoffload-vllm@1.service did not exit on SIGTERM" in out


def test_clean_stops_keep_nothing_and_without_a_results_folder_the_warning_names_the_host(
    tmp_path: Path,
) -> None:
    cell = tmp_path / "cell"
    out, rc = _run(tmp_path, ["success", "success", "success"], cell)
    assert rc == 0, out[-3000:]
    assert not cell.exists()
    out, rc = _run(tmp_path, ["timeout", "success", "success"], None)
    assert rc == 0, out[-3000:]
    assert "see journalctl -u UNIT on gpu1" in out


def test_after_a_failed_cell_every_stopped_units_journal_is_kept(tmp_path: Path) -> None:
    # the orchestrator asks for all of them after a failed cell: its collect never ran
    cell = tmp_path / "cell"
    out, rc = _run(tmp_path, ["success", "timeout", "success"], cell, units="all")
    assert rc == 0, out[-3000:]
    kept = sorted(p.name for p in (cell / "units").iterdir())
    assert kept == [f"gpu1--{u}.failed-cell.journal.txt" for u in UNITS]  # not @9: it was not stopped
    assert "kvoffload-vllm@1.service did not exit on SIGTERM" in out  # still said
