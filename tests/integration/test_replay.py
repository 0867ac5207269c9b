"""The replay runner end to end against a real local streaming server (tests/support/sse_server.py)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from kvoffload.cli.main import main
from kvoffload.replay.outcome import ExitCode
from tests.support.procs import ROOT, sse_server

pytestmark = pytest.mark.integration


def _dataset(tmp_path: Path, sessions: int = 3, calls: int = 6) -> Path:
    path = tmp_path / "data.jsonl"
    with path.open("w") as fh:
        for s in range(sessions):
            msgs: list[dict[str, str]] = [{"role": "system", "content": f"session {s} system prompt"}]
            for c in range(calls):
                msgs = [*msgs, {"role": "user", "content": f"s{s} question {c} " + "word " * 20}]
                fh.write(json.dumps({"session_id": f"s{s}", "messages": msgs, "output_length": 3 + c}) + "\n")
                msgs = [*msgs, {"role": "assistant", "content": f"answer {c}"}]
    return path


def _records(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


def test_closed_loop_replay_records_everything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _dataset(tmp_path)
    out = tmp_path / "out"
    with sse_server("--ttft", "0.03", "--itl", "0.005", "--tokens", "50", "--replica", "r1") as url:
        rc = main(["replay", "--base-url", url, "--model", "tiny", "--dataset-code", "generic", "--dataset",
                   str(data), "--concurrency", "2", "--num-rounds", "5", "--output", str(out)])  # fmt: skip
        seen = httpx.get(f"{url}/requests").json()
    assert rc == 0
    # It ends with the TTFT figures of what it measured (3 users: 3 requests in round 1, 12 later).
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("replay: TTFT ms (ok requests) all 15: p50 ") and "round 1 3:" in last
    assert "later rounds 12:" in last
    recs = _records(out)
    # 3 sessions x 6 calls -> one chunk of 5 per session = 3 users x 5 rounds
    assert len(recs) == 15
    assert {r["schema"] for r in recs} == {3}
    # Schema 3: the server's own account, null where this test server says nothing of it.
    assert all(
        "response_id" in r and r["server_ttft_s"] is None and r["vllm_cached_tokens"] is None for r in recs
    )
    assert all(r["ttft_clock"] in ("kernel", "read") and "late_s" in r for r in recs)
    assert all(r["status"] == "ok" and r["replica"] == "r1" for r in recs)
    if sys.platform == "linux":  # kernel receive stamps (SO_TIMESTAMPNS); the warm-ups turned them on
        assert {r["ttft_clock"] for r in recs} == {"kernel"}
    assert all(r["late_s"] is None or r["late_s"] > 0 for r in recs)
    by_user: dict[str, list[int]] = {}
    for r in recs:
        by_user.setdefault(str(r["user_id"]), []).append(int(r["round"]))  # type: ignore[call-overload]
        assert r["ttft_s"] >= 0.03  # type: ignore[operator]
        assert r["latency_s"] >= r["ttft_s"]  # type: ignore[operator]
        assert r["completion_tokens"] == 3 + int(r["round"]) - 1  # type: ignore[call-overload]
    assert by_user == {"s0:0": [1, 2, 3, 4, 5], "s1:0": [1, 2, 3, 4, 5], "s2:0": [1, 2, 3, 4, 5]}

    # 4 warm-ups first, sharing no prefix with the data; then teacher-forced recorded inputs
    warm, real = seen[:4], seen[4:]
    assert all(w["headers"]["x-user-id"].startswith("warmup-") for w in warm)
    assert all(not w["body"]["messages"][0]["content"].startswith("s") for w in warm)
    lines = [json.loads(x) for x in data.read_text().splitlines()]
    for req in real:
        user = req["headers"]["x-user-id"]
        assert req["body"]["stream_options"] == {"include_usage": True}
        assert req["body"]["messages"] in [
            x["messages"] for x in lines if x["session_id"] == user.split(":")[0]
        ]

    # never more than `concurrency` requests in flight (closed loop)
    events = sorted([(r["t_start"], 1) for r in recs] + [(r["t_start"] + r["latency_s"], -1) for r in recs])  # type: ignore[operator]
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak <= 2

    counts = json.loads((out / "sessions.json").read_text())
    assert counts["requested_concurrency"] == 2
    assert counts["virtual_users_available"] == 3
    assert (counts["achieved_sessions"], counts["complete"], counts["incomplete"], counts["error"]) == (
        3,
        3,
        0,
        0,
    )
    assert counts["failed_requests"] == 0


def test_failing_user_is_counted_as_error(tmp_path: Path) -> None:
    data = _dataset(tmp_path)
    out = tmp_path / "out"
    with sse_server("--ttft", "0.01", "--itl", "0.001", "--fail-user", "s1:") as url:
        rc = main(["replay", "--base-url", url, "--model", "tiny", "--dataset-code", "generic", "--dataset",
                   str(data), "--concurrency", "3", "--num-rounds", "5", "--output", str(out)])  # fmt: skip
    assert rc == ExitCode.SOME_FAILED  # a completed replay whose failures are counted
    recs = _records(out)
    failed = [r for r in recs if r["status"] != "ok"]
    assert [(r["user_id"], r["round"], r["http_status"]) for r in failed] == [("s1:0", 1, 500)]
    assert failed[0]["error"] == "injected failure"
    counts = json.loads((out / "sessions.json").read_text())
    assert (counts["complete"], counts["error"], counts["failed_requests"]) == (2, 1, 1)


def test_isl_depth_filter_and_max_sessions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _dataset(tmp_path, sessions=4)
    with sse_server("--ttft", "0.001", "--itl", "0.001") as url:
        base = ["replay", "--base-url", url, "--model", "no-local-tokenizer", "--dataset-code", "generic",
                "--dataset", str(data), "--concurrency", "2", "--num-rounds", "5"]  # fmt: skip
        assert main([*base, "--isl", "5", "--output", str(tmp_path / "a")]) == 2
        assert "--isl 5" in capsys.readouterr().err
        assert main([*base, "--max-sessions", "1", "--output", str(tmp_path / "b")]) == 0
        assert main([*base, "--num-rounds", "3", "--output", str(tmp_path / "c")]) == 2
    assert len(_records(tmp_path / "b")) == 5
    assert "argument --num-rounds: 3 is below the minimum chunk length 5" in capsys.readouterr().err


def test_refuses_to_overwrite_and_bad_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _dataset(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "requests.jsonl").write_text("{}\n")
    args = ["replay", "--model", "m", "--dataset-code", "generic", "--dataset", str(data),
            "--concurrency", "1", "--num-rounds", "5", "--output"]  # fmt: skip
    with pytest.raises(SystemExit) as refused:  # checked as the flags are parsed
        main([*args, str(out), "--base-url", "http://127.0.0.1:9"])
    assert refused.value.code == 2
    assert "argument --output: " in capsys.readouterr().err
    assert main([*args, str(tmp_path / "new"), "--base-url", "http://127.0.0.1:9"]) == ExitCode.ALL_FAILED
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "all 4 warm-up requests failed" in last and last.endswith("(exit 4)")
    assert json.loads((tmp_path / "new" / "sessions.json").read_text())["stopped_by"] == "warmup"


def _replay_argv(url: str, data: Path, out: Path, concurrency: int, rounds: int, *extra: str) -> list[str]:
    """`kvoffload-lab replay` of a generic dataset against `url`, as a child process runs it."""
    return [sys.executable, "-m", "kvoffload.cli.main", "replay", "--base-url", url, "--model", "m",
            "--dataset-code", "generic", "--dataset", str(data), "--concurrency", str(concurrency),
            "--num-rounds", str(rounds), "--output", str(out), *extra]  # fmt: skip


def _stop_once(proc: subprocess.Popen[str], sig: signal.Signals, ready: Callable[[], bool]) -> str:
    """Send `sig` to the replay once `ready()` holds (or after 30 s), wait for it to exit; its stderr."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not ready():
        time.sleep(0.05)
    os.kill(proc.pid, sig)
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    return err


def test_ctrl_c_keeps_finished_records(tmp_path: Path) -> None:
    data = _dataset(tmp_path, sessions=6, calls=10)
    out = tmp_path / "out"
    with sse_server("--ttft", "0.2", "--itl", "0.01") as url:
        proc = subprocess.Popen(
            _replay_argv(url, data, out, 2, 10, "--warmup", "0"), cwd=ROOT, stderr=subprocess.PIPE, text=True
        )
        err = _stop_once(
            proc, signal.SIGINT, lambda: (out / "requests.jsonl").exists() and len(_records(out)) >= 3
        )
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    recs = _records(out)  # every line parses: nothing half-written
    assert 3 <= len(recs) < 60
    counts = json.loads((out / "sessions.json").read_text())
    assert counts["interrupted"] is True and counts["stopped_by"] == "interrupt"
    assert counts["incomplete"] >= 1
    assert counts["requests"] == len(recs)


def test_duration_stops_new_rounds(tmp_path: Path) -> None:
    data = _dataset(tmp_path, sessions=6, calls=10)
    out = tmp_path / "out"
    # A round takes at least 0.17 s (first token after 0.1 s, 8 tokens 0.01 s apart): 10 take over 1 s.
    with sse_server("--ttft", "0.1", "--itl", "0.01") as url:
        rc = main(["replay", "--base-url", url, "--model", "m", "--dataset-code", "generic", "--dataset",
                   str(data), "--concurrency", "2", "--num-rounds", "10", "--output", str(out),
                   "--duration", "1", "--warmup", "0"])  # fmt: skip
    assert rc == 0
    counts = json.loads((out / "sessions.json").read_text())
    assert counts["stopped_by"] == "duration"
    assert counts["incomplete"] == 2 and counts["complete"] == 0
    assert len(_records(out)) < 20


def test_stalled_server_exits_5_with_its_reason_and_no_traceback(tmp_path: Path) -> None:
    """The server sends the role chunk and then nothing: the watchdog, not the 18 h timeout, ends it."""
    data = _dataset(tmp_path)
    out = tmp_path / "out"
    with sse_server("--ttft", "3600") as url:
        proc = subprocess.run(
            _replay_argv(url, data, out, 2, 5, "--stall-timeout", "1"),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == ExitCode.STALLED, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("kvoffload-lab: replay stalled: no byte arrived on any of the 4 requests")
    counts = json.loads((out / "sessions.json").read_text())
    assert counts["stopped_by"] == "stall" and counts["requests"] == 0  # stalled in the warm-ups


_ROLE_PLAYBOOK = """
- name: Run the replay role's run tasks with a stand-in kvoffload-lab
  hosts: all
  gather_facts: false
  roles:
    - role: kvoffload
  tasks:
    - name: Replay, and say how it went
      block:
        - name: The role's run tasks
          ansible.builtin.include_role:
            name: replay
            tasks_from: run
        - name: Completed
          ansible.builtin.copy:
            content: completed
            dest: "{{ outcome_file }}"
            mode: "0644"
      rescue:
        - name: Failed
          ansible.builtin.copy:
            content: "{{ ansible_failed_task.name }}\\n{{ ansible_failed_result.msg }}"
            dest: "{{ outcome_file }}"
            mode: "0644"
"""


def test_replay_role_completes_on_some_failed_and_fails_with_the_verdict_otherwise(tmp_path: Path) -> None:
    """roles/replay/tasks/run.yml against a stand-in replay exiting 0, 3, 4 and 5 (async, polled)."""
    hosts: dict[str, dict[str, object]] = {}
    for rc in (0, 3, 4, 5):
        venv = tmp_path / f"venv{rc}"
        (venv / "bin").mkdir(parents=True)
        fake = venv / "bin" / "kvoffload-lab"
        fake.write_text(
            "#!/bin/sh\n"
            f'printf "%s\\n" "$@" > {tmp_path}/argv{rc}\n'
            'echo "INFO a log line" >&2\n'
            f'[ {rc} -eq 0 ] || echo "kvoffload-lab: the verdict of exit {rc}" >&2\n'
            f"exit {rc}\n"
        )
        fake.chmod(0o755)
        hosts[f"rc{rc}"] = {
            "kvoffload_venv": str(venv),
            "outcome_file": str(tmp_path / f"outcome{rc}"),
            "replay_remote_root": str(tmp_path / f"cells{rc}"),
        }
    # the orchestrator's way: the whole argv given (its executable replaced by the venv's), run as is
    given = [
        "/opt/kvoffload/venv/bin/kvoffload-lab",
        "replay",
        "--base-url",
        "http://lb:8100",
        "--x",
        "a b;$(c)",
    ]
    hosts["rc0"]["replay_argv"] = given
    inventory = {
        "all": {
            "hosts": hosts,
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "ansible_become": False,  # no sudo here; the replay user is root
                "replay_user": "root",
                "replay_cell_id": "cell1",
                "replay_controller_dir": str(tmp_path / "controller"),
                "replay_dataset_code": "generic",
                "replay_dataset_path": "/data/set.jsonl",
                "replay_extra_args": ["--warmup", "4"],
            },
        }
    }
    (tmp_path / "hosts.yml").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(_ROLE_PLAYBOOK)
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_ASYNC_DIR": str(tmp_path / "ansible-async"),
        "ANSIBLE_NOCOLOR": "1",
    }
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
         str(tmp_path / "play.yml")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    outcome = {rc: (tmp_path / f"outcome{rc}").read_text() for rc in (0, 3, 4, 5)}
    assert outcome[0] == outcome[3] == "completed"
    for rc in (4, 5):
        task, message = outcome[rc].split("\n", 1)
        assert task == "Fail the cell unless the replay completed"
        assert message.strip() == f"kvoffload-lab replay exited {rc}: kvoffload-lab: the verdict of exit {rc}"
    assert (tmp_path / "argv0").read_text().splitlines() == given[1:]  # no shell: one word stays one
    argv = (tmp_path / "argv3").read_text().splitlines()  # the role's own build
    assert argv[:3] == ["replay", "--base-url", "http://127.0.0.1:8000"]
    assert argv[-4:] == ["--warmup", "4", "--output", str(tmp_path / "cells3" / "cell1")]


def test_workers_split_users_and_merge_one_requests_file(tmp_path: Path) -> None:
    """Two worker processes (a few seconds: each starts an interpreter): the outputs are one replay's."""
    data = _dataset(tmp_path, sessions=4, calls=5)
    out = tmp_path / "out"
    with sse_server("--ttft", "0.02", "--itl", "0.002", "--tokens", "4") as url:
        rc = main(["replay", "--base-url", url, "--model", "tiny", "--dataset-code", "generic", "--dataset",
                   str(data), "--concurrency", "2", "--num-rounds", "5", "--output", str(out),
                   "--workers", "2", "--warmup", "1"])  # fmt: skip
        seen = httpx.get(f"{url}/requests").json()
    assert rc == 0
    recs = _records(out)
    assert len(recs) == 20 and len(seen) == 20 + 2  # one warm-up per worker
    assert [r["t_start"] for r in recs] == sorted(r["t_start"] for r in recs)  # type: ignore[type-var]
    by_user: dict[str, list[dict[str, object]]] = {}
    for r in recs:
        by_user.setdefault(str(r["user_id"]), []).append(r)
    assert sorted(by_user) == ["s0:0", "s1:0", "s2:0", "s3:0"]
    for rounds in by_user.values():  # a user's rounds in order, each after the previous one ended
        assert [r["round"] for r in rounds] == [1, 2, 3, 4, 5]
        for a, b in itertools.pairwise(rounds):
            assert b["t_start"] >= a["t_start"] + a["latency_s"] - 0.01  # type: ignore[operator]
    counts = json.loads((out / "sessions.json").read_text())
    assert (counts["requested_concurrency"], counts["achieved_sessions"], counts["complete"]) == (2, 4, 4)
    assert (counts["requests"], counts["failed_requests"], counts["stopped_by"]) == (20, 0, "pool")
    assert not (out / "workers").exists()


def test_sigterm_stops_every_worker_and_keeps_their_records(tmp_path: Path) -> None:
    data = _dataset(tmp_path, sessions=6, calls=10)
    out = tmp_path / "out"
    with sse_server("--ttft", "0.2", "--itl", "0.01") as url:
        proc = subprocess.Popen(
            _replay_argv(url, data, out, 4, 10, "--warmup", "0", "--workers", "2"),
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        parts = [out / "workers" / str(i) / "requests.jsonl" for i in range(2)]
        err = _stop_once(proc, signal.SIGTERM, lambda: all(p.exists() and p.stat().st_size for p in parts))
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    recs = _records(out)
    assert 2 <= len(recs) < 60
    # both workers' records were kept: worker 0 replays s0, s2, s4 and worker 1 s1, s3, s5 (either one's
    # first answered request may be any of its users': they run concurrently)
    users = {str(r["user_id"]).split(":")[0] for r in recs}
    assert users & {"s0", "s2", "s4"} and users & {"s1", "s3", "s5"}, users
    counts = json.loads((out / "sessions.json").read_text())
    assert counts["interrupted"] is True and counts["stopped_by"] == "interrupt"
    assert counts["requests"] == len(recs)
    assert not (out / "workers").exists()
