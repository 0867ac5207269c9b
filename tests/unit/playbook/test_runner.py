"""The ansible-runner facade against real ansible-playbook runs on localhost (connection local)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from kvoffload.playbook import PlaybookCanceled, PlaybookFailed, PlaybookRunner, request_stop

PLAYS = {
    "ok.yml": """
- name: Write a file
  hosts: all
  gather_facts: false
  tasks:
    - name: Write marker
      ansible.builtin.copy:
        content: "{{ marker_text }}\\n"
        dest: "{{ marker_path }}"
        mode: "0644"
""",
    "slow.yml": """
- name: Take a while
  hosts: all
  gather_facts: false
  tasks:
    - name: Sleep
      ansible.builtin.command: sleep 120
      changed_when: false
""",
    "fail.yml": """
- name: Fail on purpose
  hosts: all
  gather_facts: false
  tasks:
    - name: Refuse the device
      ansible.builtin.fail:
        msg: "refusing /dev/loop9: it holds a filesystem"
""",
}


@pytest.fixture
def ansible_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "roles").mkdir()
    (tmp_path / "ansible.cfg").write_text("[defaults]\nhost_key_checking = False\n")
    for name, text in PLAYS.items():
        (tmp_path / "playbooks" / name).write_text(text)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  hosts:\n    box1:\n      ansible_connection: local\n"
        "      ansible_python_interpreter: "
                         "\"{{ ansible_playbook_python }}\"\n")  # fmt: skip
    monkeypatch.setenv("KVOFFLOAD_ANSIBLE_DIR", str(tmp_path))
    return tmp_path


def test_success_reports_changes_and_keeps_artifacts(ansible_home: Path, tmp_path: Path) -> None:
    tasks: list[str] = []
    runner = PlaybookRunner(
        ansible_home / "hosts.yml", tmp_path / "art", on_task=lambda _h, t: tasks.append(t)
    )
    marker = tmp_path / "marker.txt"
    extravars = {"marker_text": "hello", "marker_path": str(marker)}
    first = runner.run("ok.yml", extravars, ident="first")
    assert marker.read_text() == "hello\n"
    assert first.changed == {"box1": 1} and first.total_changed == 1
    assert tasks == ["Write marker"]
    assert (first.artifacts / "job_events").is_dir()
    # no env files that could hold secret extravars
    assert not (tmp_path / "art" / "env" / "extravars").exists()
    assert runner.run("ok.yml", extravars, ident="second").total_changed == 0


def test_check_mode_changes_nothing(ansible_home: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker.txt"
    runner = PlaybookRunner(ansible_home / "hosts.yml", tmp_path / "art")
    result = runner.run("ok.yml", {"marker_text": "x", "marker_path": str(marker)}, check=True)
    assert result.total_changed == 1
    assert not marker.exists()


def test_failure_names_host_and_task(ansible_home: Path, tmp_path: Path) -> None:
    runner = PlaybookRunner(ansible_home / "hosts.yml", tmp_path / "art")
    with pytest.raises(PlaybookFailed) as err:
        runner.run("fail.yml")
    text = str(err.value)
    assert "box1: failed at task 'Refuse the device': refusing /dev/loop9: it holds a filesystem" in text
    assert err.value.result.rc != 0


def test_stop_request_kills_ansible_playbook(ansible_home: Path, tmp_path: Path) -> None:
    assert request_stop() is False  # nothing running: the caller interrupts itself
    runner = PlaybookRunner(ansible_home / "hosts.yml", tmp_path / "art")
    asked: list[bool] = []

    def stop_soon() -> None:
        time.sleep(3)
        asked.append(request_stop())

    threading.Thread(target=stop_soon, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(PlaybookCanceled):
        runner.run("slow.yml")
    assert asked == [True]
    assert time.monotonic() - t0 < 60
    # ansible-playbook itself is gone (what a task started on a host is the teardown playbook's job)
    deadline = time.monotonic() + 15  # a killed process may take a moment to be reaped
    while True:
        left = subprocess.run(
            ["pgrep", "-f", f"ansible-playbook.*{tmp_path}"], capture_output=True, text=True, check=False
        )
        if not left.stdout.strip() or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    subprocess.run(["pkill", "-f", "sleep 120"], check=False)
    assert left.stdout.strip() == "", "ansible-playbook or one of its workers outlived the canceled run"
