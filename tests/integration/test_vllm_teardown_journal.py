"""Teardown keeps the journal of a replica that systemd had to kill at TimeoutStopSec.

Runs the vllm role's teardown_journal.yml on a local connection, with `systemctl` and `journalctl`
stand-ins first on PATH (this machine has no systemd as PID 1): the stand-in says which unit's stop
timed out, and the test checks that only that unit's journal lands in the cell's units/ folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.ansible import ansible_playbook

pytestmark = pytest.mark.integration

UNITS = ["kvoffload-vllm@0.service", "kvoffload-vllm@1.service", "kvoffload-vllm@2.service"]


def _run(tmp_path: Path, results: list[str], journal_dir: Path | None) -> tuple[str, int]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    # `systemctl show --property=Result --value U...`: one value per unit, blank lines between them.
    (bin_dir / "systemctl").write_text("#!/bin/sh\nprintf '" + "\\n\\n".join(results) + "\\n'\n")
    # `journalctl --no-pager --unit U ...`: says whose journal it printed.
    (bin_dir / "journalctl").write_text('#!/bin/sh\necho "journal of $3: still serving after SIGTERM"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    play = [
        {
            "hosts": "all",
            "gather_facts": False,
            "tasks": [
                {
                    "ansible.builtin.include_role": {"name": "vllm", "tasks_from": "teardown_journal.yml"},
                    "vars": {"_vllm_teardown_units": UNITS},
                }
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    extravars = {} if journal_dir is None else {"replay_controller_dir": str(journal_dir)}
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


def test_the_running_replicas_are_stopped_in_one_call(tmp_path: Path) -> None:
    """teardown_stop.yml: the units named from the replicas' environment files, then one `systemctl
    stop` for every unit that runs (or is starting), none for the others; with none running, no call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    states = tmp_path / "states"
    # `systemctl is-active -- U...` prints one state per unit (exit 3 when any is not active);
    # `systemctl stop -- U...` is logged.
    (bin_dir / "systemctl").write_text(
        f'#!/bin/sh\nif [ "$1" = is-active ]; then cat {states}; exit 3; fi\necho "$@" >> {calls}\n'
    )
    (bin_dir / "systemctl").chmod(0o755)
    play = [
        {
            "hosts": "all",
            "gather_facts": False,
            "tasks": [
                {
                    "ansible.builtin.include_role": {"name": "vllm", "tasks_from": "teardown_stop.yml"},
                    # what `find` answers for /etc/kvoffload/vllm/replica-*.env, in its own order
                    "vars": {
                        "_vllm_teardown_env": {
                            "files": [{"path": f"/etc/kvoffload/vllm/replica-{i}.env"} for i in (2, 0, 1)]
                        }
                    },
                }
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1"}

    def run(lines: list[str]) -> str:
        states.write_text("\n".join(lines) + "\n")
        done = ansible_playbook("-i", "gpu1,", "-c", "local", str(tmp_path / "play.yml"), env=env)
        assert done.returncode == 0, done.stdout[-3000:]
        return calls.read_text() if calls.exists() else ""

    assert run(["active", "inactive", "activating"]) == (
        "stop -- kvoffload-vllm@0.service kvoffload-vllm@2.service\n"
    )
    calls.unlink()
    assert run(["inactive", "failed", "inactive"]) == ""
