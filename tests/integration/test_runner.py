"""The ansible-runner facade against real ansible-playbook runs on localhost (connection local)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from kvoffload.config import load_lab
from kvoffload.orchestrate.cell.deployment import cell_extravars
from kvoffload.orchestrate.installs.wheelhouse import Wheels
from kvoffload.playbook import PlaybookCanceled, PlaybookFailed, PlaybookRunner, request_stop
from kvoffload.playbook.runner import HF_TOKEN_FILE_VAR, SECRET_NAME, extravars_file
from tests.support.procs import kill_pids, pids_with_environ

pytestmark = pytest.mark.integration

CANARY = "kvoffload-canary-7f3c9a"
EXAMPLE = Path(__file__).resolve().parents[2] / "inventories" / "example" / "hosts.yml"

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
    # What the vllm role's download task does with the controller's HF_TOKEN, inside no_log
    "token.yml": """
- name: Read the token the controller handed over
  hosts: all
  gather_facts: true
  tasks:
    - name: Compare the token with its digest
      ansible.builtin.copy:
        content: "{{ {'digest_matches': lookup('ansible.builtin.file', _file) | hash('sha256')
                                          == expected_digest,
                      'file': _file, 'hf_token_env': lookup('ansible.builtin.env', 'HF_TOKEN')} | to_json }}"
        dest: "{{ marker_path }}"
        mode: "0600"
      vars:
        _file: "{{ lookup('ansible.builtin.env', 'KVOFFLOAD_HF_TOKEN_FILE') }}"
      no_log: true
      diff: false
""",
    "broken.yml": """
- name: A play with a YAML error
  hosts: all
  tasks:
    - name: Say: hello
      ansible.builtin.debug:
        msg: hi
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
    result = runner.run("ok.yml", {"marker_text": "not-in-argv", "marker_path": str(marker)}, check=True)
    assert result.total_changed == 1
    assert not marker.exists()
    # --check always comes with --diff (tasks that handle a secret set diff: false)
    argv = json.loads((result.artifacts / "command").read_text())["command"]
    assert "--check" in argv and "--diff" in argv
    # the extra variables went by a file: what `ps` shows (and ansible-runner records) names it only
    assert "not-in-argv" not in " ".join(argv)
    files = [arg[1:] for arg in argv if arg.startswith("@")]
    assert len(files) == 1 and argv[argv.index("@" + files[0]) - 1] in ("-e", "--extra-vars")
    assert not Path(files[0]).parent.exists()  # removed after the run


def test_failure_names_host_and_task(ansible_home: Path, tmp_path: Path) -> None:
    runner = PlaybookRunner(ansible_home / "hosts.yml", tmp_path / "art")
    with pytest.raises(PlaybookFailed) as err:
        runner.run("fail.yml")
    text = str(err.value)
    assert "box1: failed at task 'Refuse the device': refusing /dev/loop9: it holds a filesystem" in text
    assert err.value.result.rc != 0


def test_a_playbook_that_does_not_parse_says_why(ansible_home: Path, tmp_path: Path) -> None:
    runner = PlaybookRunner(ansible_home / "hosts.yml", tmp_path / "art")
    with pytest.raises(PlaybookFailed) as err:
        runner.run("broken.yml")
    assert not err.value.result.failures
    text = str(err.value)
    assert "YAML" in text and "broken.yml" in text, text


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
    # ansible-playbook itself is gone (what a task started on a host is the teardown playbook's job).
    # This run's processes are found by its artifact folder in their environment, never by a name or
    # command line that other processes could share.
    art = str(tmp_path / "art")
    deadline = time.monotonic() + 15  # a killed process may take a moment to be reaped
    while True:
        left = [pid for pid in pids_with_environ(art) if b"ansible-playbook" in _cmdline(pid)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # The task's own `sleep` on the (local) host may outlive its worker: stop exactly what this run
    # started, by PID.
    kill_pids(pids_with_environ(art))
    assert left == [], "ansible-playbook or one of its workers outlived the canceled run"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""  # gone


def files_holding(root: Path, secret: str) -> list[str]:
    """Every file under `root` whose name or bytes hold `secret`."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and (secret in str(p) or secret.encode() in p.read_bytes())
    )


def test_secret_named_extravars_and_envvars_are_refused(ansible_home: Path, tmp_path: Path) -> None:
    runner = PlaybookRunner(ansible_home / "hosts.yml", tmp_path / "art")
    with pytest.raises(ValueError, match="refusing to pass vllm_hf_token"):
        runner.run("ok.yml", {"vllm_hf_token": CANARY, "marker_path": str(tmp_path / "m")})
    assert not (tmp_path / "art" / "artifacts").exists()  # refused before anything ran or was written
    with pytest.raises(ValueError, match="refusing to pass HF_TOKEN"):
        PlaybookRunner(ansible_home / "hosts.yml", tmp_path / "art", envvars={"HF_TOKEN": CANARY})


def test_the_secret_name_rule_passes_every_extravar_of_the_campaign(tmp_path: Path) -> None:
    lab = load_lab(EXAMPLE)
    names = set()
    for cell in lab.cells:
        names |= set(cell_extravars(lab, cell, tmp_path, Wheels(tmp_path / "k.whl", None)))
    assert "replay_tokenizer" in names  # a token*izer* is no token
    assert sorted(n for n in names if SECRET_NAME.search(n)) == []
    assert all(SECRET_NAME.search(n) for n in ("vllm_hf_token", "ansible_become_password", "api_key"))


def test_the_controller_hf_token_reaches_the_play_through_memory_only(
    ansible_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", CANARY)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", CANARY)
    runner = PlaybookRunner(ansible_home / "hosts.yml", tmp_path / "art")
    marker = tmp_path / "seen.json"
    digest = hashlib.sha256(CANARY.encode()).hexdigest()
    result = runner.run("token.yml", {"marker_path": str(marker), "expected_digest": digest}, ident="tok")
    seen = json.loads(marker.read_text())
    # the play read the token (the right one), from a file that was this process's memory
    assert seen["digest_matches"] is True
    assert seen["file"].startswith(f"/proc/{os.getpid()}/fd/")
    assert not Path(seen["file"]).exists()  # closed with the run
    assert seen["hf_token_env"] == ""  # blanked in ansible-playbook's environment
    # ansible-runner recorded the environment and the facts: the path is there, never the token
    command = json.loads((result.artifacts / "command").read_text())
    assert command["env"][HF_TOKEN_FILE_VAR] == seen["file"]
    assert command["env"]["HF_TOKEN"] == command["env"]["HUGGING_FACE_HUB_TOKEN"] == ""
    assert list((result.artifacts / "fact_cache").iterdir()), "facts (ansible_env) were cached"
    assert files_holding(tmp_path / "art", CANARY) == []
    assert not (tmp_path / "art" / "env").exists() or not list((tmp_path / "art" / "env").iterdir())
    # the search itself finds a planted copy
    (tmp_path / "art" / "planted").write_text(f"x{CANARY}y")
    assert files_holding(tmp_path / "art", CANARY) == ["planted"]


def test_without_hf_token_no_file_is_handed_over(
    ansible_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    runner = PlaybookRunner(ansible_home / "hosts.yml", tmp_path / "art")
    result = runner.run("ok.yml", {"marker_text": "x", "marker_path": str(tmp_path / "m")}, ident="none")
    assert HF_TOKEN_FILE_VAR not in json.loads((result.artifacts / "command").read_text())["env"]


def test_the_extravars_file_is_readable_by_its_owner_only() -> None:
    with extravars_file({"a": [1, "x"]}) as path:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert json.loads(path.read_text()) == {"a": [1, "x"]}
    assert not path.parent.exists()


def test_plays_are_timed_and_unit_states_come_back_in_events(ansible_home: Path, tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    with (ansible_home / "ansible.cfg").open("a") as cfg:
        # the collection's modules by FQCN, as the roles call them
        cfg.write(f"collections_path = {repo / '.collections'}\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    # what a teardown's stop reads (its properties name Result) differs from what the collect reads
    (bindir / "systemctl").write_text(
        "#!/bin/sh\ncase \"$*\" in *Result*) r='Result=timeout';; *) r='NRestarts=3';; esac\n"
        "printf 'Id=kvoffload-lmcache.service\\nLoadState=loaded\\n%s\\n' \"$r\"\n"
    )
    (bindir / "systemctl").chmod(0o755)
    (ansible_home / "playbooks" / "two.yml").write_text(f"""
- name: Replay the cell
  hosts: all
  gather_facts: false
  tasks:
    - name: Wait a little
      ansible.builtin.command: sleep 0.5
      changed_when: false
- name: Collect
  hosts: all
  gather_facts: false
  tasks:
    - name: Read the state of every unit
      kvoffload.lab.kvoffload_unit_states:
        units: [kvoffload-lmcache.service]
        replica_dir: {tmp_path / "no-replicas"}
        properties: [NRestarts]
      environment:
        PATH: "{bindir}:/usr/sbin:/usr/bin:/sbin:/bin"
- name: Teardown
  hosts: all
  gather_facts: false
  tasks:
    - name: Stop the units
      kvoffload.lab.kvoffload_unit_states:
        units: [kvoffload-lmcache.service]
        replica_dir: {tmp_path / "no-replicas"}
        properties: [Result]
        stop: true
        settle: 0
      environment:
        PATH: "{bindir}:/usr/sbin:/usr/bin:/sbin:/bin"
""")
    started: list[str] = []
    result = PlaybookRunner(ansible_home / "hosts.yml", tmp_path / "art").run(
        "two.yml", on_play=started.append
    )
    assert [name for name, _at in result.plays] == started == ["Replay the cell", "Collect", "Teardown"]
    collect = result.seconds_from("Collect")
    assert collect is not None and 0 < collect < result.duration_s - 0.5  # the sleep is before it
    assert result.unit_states == {
        "box1": {"kvoffload-lmcache.service": {"Id": "kvoffload-lmcache.service", "LoadState": "loaded",
                                               "NRestarts": "3"}}
    }  # fmt: skip
    # the teardown's stop read the units too: not the cell's unit states, which stay the collect's


def test_failures_name_their_play(ansible_home: Path, tmp_path: Path) -> None:
    (ansible_home / "playbooks" / "late.yml").write_text("""
- name: Replay
  hosts: all
  gather_facts: false
  tasks:
    - name: Pass
      ansible.builtin.debug: msg=ok
- name: Teardown
  hosts: all
  gather_facts: false
  tasks:
    - name: Fail late
      ansible.builtin.fail: msg=no
""")
    with pytest.raises(PlaybookFailed) as err:
        PlaybookRunner(ansible_home / "hosts.yml", tmp_path / "art").run("late.yml")
    result = err.value.result
    assert [(f.play, f.task) for f in result.failures] == [("Teardown", "Fail late")]
    assert result.failed_only_in("Teardown") and not result.failed_only_in("Replay")


def test_the_fact_cache_spares_a_later_run_its_gathering(ansible_home: Path, tmp_path: Path) -> None:
    (ansible_home / "playbooks" / "facts.yml").write_text("""
- name: Needs the addresses
  hosts: all
  gather_subset: [network]
  tasks:
    - name: Use them
      ansible.builtin.assert:
        that: ansible_facts.all_ipv4_addresses is defined
""")
    with (ansible_home / "ansible.cfg").open("a") as cfg:
        cfg.write("gathering = smart\n")  # as the repository's ansible.cfg
    runner = PlaybookRunner(ansible_home / "hosts.yml", tmp_path / "art")
    tasks: list[list[str]] = []
    for ident in ("first", "second"):
        started: list[str] = []
        runner.on_task = lambda _h, t, started=started: started.append(t)  # type: ignore[misc]
        runner.run("facts.yml", ident=ident, fact_cache=tmp_path / "facts")
        tasks.append(started)
    assert tasks == [["Gathering Facts", "Use them"], ["Use them"]]
