"""A whole campaign on the virtual lab (a client, one node): every tier, resume after a kill, idempotence.

Real systemd hosts (nspawn), real Ansible over ssh, real Caddy and node-exporter, the simulator for
vLLM and lmcache-server. Asserts on the results the campaign produced, not on "it ran".
The lab gets its own bridge, subnet, host names and state dir, so it never collides with a demo lab.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import kvoffload
from kvoffload.orchestrate.installs import wheelhouse
from tests.support.chromium import screenshot_when
from tests.support.lab import free_lab_names, kvlab, lab_marks, small_campaign

ROOT = Path(__file__).resolve().parents[2]

pytestmark = lab_marks(2400)
# Canary Hugging Face tokens, as a user would give them: ansible-vault (vllm_hf_token) and HF_TOKEN.
CANARIES = {"vllm_hf_token": "kvoffload-canary-7f3c9a", "HF_TOKEN": "kvoffload-canary-env-5d21e8"}


def _campaign(name: str, tiers: list[str]) -> dict[str, Any]:
    """Small: 8 airline users x 5 rounds at concurrency 4; 16K tokens of GPU KV per replica."""
    return small_campaign(name, tiers)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    base = tmp_path_factory.mktemp("lab")
    env = {**os.environ, "KVOFFLOAD_LAB_STATE": str(base / "state")}
    inventory = base / "hosts.yml"
    names = free_lab_names("e", 7)
    up = kvlab(env, "lab", "up", "--hosts", "2", *names.up_args(), "--inventory", str(inventory), timeout=900)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        _plant_canaries(inventory, env)
        yield inventory, env
    finally:
        down = kvlab(env, "lab", "down", timeout=300)
        assert down.returncode == 0, down.stderr[-2000:]


def _plant_canaries(inventory: Path, env: dict[str, str]) -> None:
    doc = yaml.safe_load(inventory.read_text())
    doc["all"]["vars"]["vllm_hf_token"] = CANARIES["vllm_hf_token"]
    inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    env["HF_TOKEN"] = CANARIES["HF_TOKEN"]


def _canary_leaks(inventory: Path, folder: Path, *outputs: str) -> list[str]:
    """Where a canary token shows: files under `folder` (results, ansible artifacts), the CLI's output,
    each lab host's journal (every field, the command lines of logging processes included) and its files
    under /etc /var /root /tmp /opt /home (grep gets the canaries on stdin, never on its command line)."""
    canaries = [c.encode() for c in CANARIES.values()]
    found = [str(p) for p in folder.rglob("*") if p.is_file() and any(c in p.read_bytes() for c in canaries)]
    found += [f"CLI output: {c!r}" for c in canaries for out in outputs if c in out.encode()]
    inv = yaml.safe_load(inventory.read_text())["all"]
    key, ssh_args = inv["vars"]["ansible_ssh_private_key_file"], inv["vars"]["ansible_ssh_common_args"]
    for name, hostvars in inv["hosts"].items():
        ssh = ["ssh", "-i", key, *shlex.split(ssh_args), f"root@{hostvars['ansible_host']}"]
        journal = subprocess.run([*ssh, "journalctl", "--no-pager", "-o", "export"], capture_output=True,
                                 timeout=300, check=True)  # fmt: skip
        found += [f"{name}: journal: {c!r}" for c in canaries if c in journal.stdout]
        roots = ["/etc", "/var", "/root", "/tmp", "/opt", "/home"]
        files = subprocess.run([*ssh, "grep", "-rlF", "-D", "skip", "-f", "-", *roots],
                               input=b"\n".join(canaries), capture_output=True, timeout=600,
                               check=False)  # fmt: skip
        assert files.returncode in (0, 1), files.stderr[-2000:]  # 1: no match
        found += [f"{name}: {line}" for line in files.stdout.decode().splitlines()]
    return found


def _write_campaign(path: Path, campaign: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(campaign))
    return path


def _records(cell: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (cell / "requests.jsonl").read_text().splitlines()]


def _snapshot_sum(cell: Path, target_prefix: str, name: str) -> float:
    """Sum of a metric (any labels) over targets starting with `target_prefix` in the after snapshot."""
    total = 0.0
    for line in (cell / "metrics" / "snapshot-after.jsonl").read_text().splitlines():
        s = json.loads(line)
        if s["target"].startswith(target_prefix) and s["name"] in (name, f"{name}_total"):
            total += float(s["value"])
    return total


def _groups(inventory: Path) -> dict[str, set[str]]:
    """Inventory host -> its groups, from the lab's hosts.yml."""
    children = yaml.safe_load(inventory.read_text())["all"]["children"]
    out: dict[str, set[str]] = {}
    for group, members in children.items():
        for host in members["hosts"]:
            out.setdefault(host, set()).add(group)
    return out


def _cells(results: Path) -> dict[str, Path]:
    out = {}
    for cell in (results / "cells").iterdir():
        out[json.loads((cell / "cell.json").read_text())["config"]["tier"]] = cell
    return out


class _Run:
    """`kvoffload-lab ARGS` in the background, its output collected by threads (a CompletedProcess
    once it ends), and the URL `run --watch` printed."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "kvoffload.cli.main", *args], env=env, cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        self.out: list[str] = []
        self.err: list[str] = []
        self.url = threading.Event()
        self.threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _read(self, stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line)
            if line.startswith("watch: http://"):
                self.url.set()

    def watch_url(self) -> str:
        assert self.url.wait(600), "".join(self.err)[-3000:]
        line = next(line for line in self.err if line.startswith("watch: http://"))
        return line.split()[1]

    def ended(self) -> str | None:
        if self.proc.poll() is None:
            return None
        return f"the run ended (exit {self.proc.returncode}): {''.join(self.err)[-3000:]}"

    def wait(self, timeout: float) -> subprocess.CompletedProcess[str]:
        self.proc.wait(timeout=timeout)
        for thread in self.threads:
            thread.join(timeout=30)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, "".join(self.out),
                                           "".join(self.err))  # fmt: skip


# The live page mid-run: a replay under way with requests done, its live TTFT and local hit rate shown.
MID_RUN = (
    "[...document.querySelectorAll('.progress')]"
    ".some(e => /^[1-9][0-9]*\\/[0-9]+ requests/.test(e.textContent))"
    " && [...document.querySelectorAll('.ttft-p50')].some(e => / ms$/.test(e.textContent))"
)
FINDINGS = "String(document.querySelectorAll('#findings .finding').length)"
# The live page after the run: done, and a finding for every finished cell's group.
FINAL = "document.querySelector('#state.state-done') && document.querySelector('#findings .finding')"


def _watch_screenshots(run: _Run, results: Path, profiles: Path) -> tuple[str, str]:
    """The page `run --watch` serves, caught mid-run, then `watch` on the finished results: their text
    (each screenshot kept under tests/artifacts/; the browsers' profiles under `profiles`)."""
    artifacts = ROOT / "tests" / "artifacts"
    artifacts.mkdir(exist_ok=True)
    url = run.watch_url()
    assert url.startswith("http://127.0.0.1:")  # loopback unless --watch-bind says otherwise
    problems, mid, _ = screenshot_when(profiles / "chromium-mid", url + "?poll=1", MID_RUN,
                                       artifacts / "watch-lab-mid-run.png", timeout=1800,
                                       give_up=run.ended)  # fmt: skip
    assert problems == [], problems
    done = run.wait(timeout=2400)
    assert done.returncode == 0, done.stderr[-4000:]
    argv = [sys.executable, "-m", "kvoffload.cli.main", "watch", str(results), "--port", "0"]
    after = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert after.stdout is not None
        final_url = after.stdout.readline().strip()
        problems, final, findings = screenshot_when(profiles / "chromium-final", final_url, FINAL,
                                                    artifacts / "watch-lab-final.png", timeout=300,
                                                    probe=FINDINGS)  # fmt: skip
    finally:
        after.terminate()
        after.wait(timeout=30)
    assert problems == [], problems
    assert findings == 3, final  # one statement per tier of the campaign's one group
    return mid, final


def test_campaign_on_the_virtual_lab(lab: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    inventory, env = lab
    groups = _groups(inventory)
    campaign = _write_campaign(tmp_path / "campaign.yml", _campaign("labtest", ["gpu", "cpu", "nvme"]))
    results = tmp_path / "results" / "labtest"
    background = _Run(env, "run", str(inventory), "--campaign", str(campaign), "--results",
                      str(tmp_path / "results"), "--watch", "--watch-port", "0")  # fmt: skip
    try:
        # the browsers' profiles stay out of tmp_path, which the canary check reads file by file
        with tempfile.TemporaryDirectory(prefix="kvoffload-chromium-") as profiles:
            mid, final = _watch_screenshots(background, results, Path(profiles))
    finally:
        if background.proc.poll() is None:
            background.proc.send_signal(signal.SIGINT)  # the run tears its cell down and stops its page
            background.proc.wait(timeout=600)
    run = background.wait(timeout=60)
    assert run.returncode == 0, run.stderr[-4000:]
    # mid-run: a cell in its replay, requests done of those expected, live TTFT and hit rate
    assert ": replay for " in mid and "live figures" in mid, mid
    assert re.search(r"[1-9][0-9]*/[0-9]+ requests", mid) and "TTFT p50" in mid and "local hit:" in mid, mid
    # after: every cell done, each with its finding; the run's own terminal ended with the findings
    assert "cells 3 done, 0 failed of 3" in final and "gpu (the baseline)" in final, final
    for tier in ("cpu", "nvme"):
        assert re.search(rf"{tier} [^\n]*later-round p50 TTFT", final), final
    assert 0 <= run.stdout.index("Findings:") < run.stdout.index("report: "), run.stdout
    # plan's estimate, kept by the run with what it measured; the report compares them
    estimate = json.loads((results / "campaign.json").read_text())["estimate"]
    assert estimate["total_s"] > 0 and estimate["measured"]["total_s"] > 0, estimate
    assert "Run time: estimate against measured" in (results / "report" / "report.md").read_text()
    # the report in Chromium: the turn-by-turn view (issue 35) of the sim's per-request answers
    with tempfile.TemporaryDirectory(prefix="kvoffload-chromium-") as profiles:
        problems, report, _ = screenshot_when(
            Path(profiles) / "chromium-report", (results / "report" / "index.html").as_uri(),
            "performance.now() > 1000", ROOT / "tests" / "artifacts" / "report-lab.png",
        )  # fmt: skip
    assert problems == [], problems
    assert "Where each turn's prompt came from" in report, report
    assert "gpu: TTFT and prompt sources by round" in report, report
    assert "hit share by the turn's age" in report, report
    cells = _cells(results)
    assert set(cells) == {"gpu", "cpu", "nvme"}
    sessions = {}
    for tier, cell in cells.items():
        for name in ("DONE", "cell.json", "requests.jsonl", "sessions.json", "metrics/snapshot-before.jsonl",
                     "metrics/snapshot-after.jsonl"):  # fmt: skip
            assert (cell / name).is_file(), f"{tier}: {name} missing"
        record = json.loads((cell / "cell.json").read_text())
        assert record["status"] == "done" and record["cold_start"]["cold"] is True
        counts = json.loads((cell / "sessions.json").read_text())
        assert counts["failed_requests"] == 0
        sessions[tier] = (counts["achieved_sessions"], counts["complete"] + counts["error"])
        assert any(p.name.startswith("vllm") for p in (cell / "metrics").glob("*.jsonl"))
        # software that ran on each lab host (collect role): this checkout's wheel everywhere, no vLLM
        software = record["software"]
        assert set(software) == set(groups), software
        for host, sw in software.items():
            assert set(sw["groups"]) == groups[host]
            venv = sw["python"]["/opt/kvoffload/venv"]
            assert venv["kvoffload-lab"] == kvoffload.__version__, (host, venv)
            assert "vllm" not in venv and "lmcache" not in venv
            assert sw["packages"]["prometheus-node-exporter"]
            assert sw["gpu"] == {}  # no nvidia-smi on the virtual hosts
        # the Caddy that ran is the wheel's (the caddy role's default), though the image has Debian's
        caddy = wheelhouse.CADDY_REQUIREMENT.split("==")[1]
        assert all(software[h]["packages"]["caddy"] == caddy for h in groups if "lb" in groups[h]), software
    # the same users in every tier, every one of them run to its end (complete, or cut by that failure)
    assert set(sessions.values()) == {(8, 8)}

    # gpu tier: Caddy is sticky on x-user-id; offload tiers: least_conn spreads users over both replicas
    by_user: dict[str, set[str]] = {}
    for r in _records(cells["gpu"]):
        by_user.setdefault(r["user_id"], set()).add(r["replica"])
    assert all(len(replicas) == 1 for replicas in by_user.values()), by_user
    for tier in ("cpu", "nvme"):
        assert len({r["replica"] for r in _records(cells[tier])}) == 2

    # external (lmcache) hits only where a connector exists; L2 chunks written only on the nvme tier
    assert _snapshot_sum(cells["gpu"], "vllm", "vllm:external_prefix_cache_hits") == 0
    for tier in ("cpu", "nvme"):
        assert _snapshot_sum(cells[tier], "vllm", "vllm:external_prefix_cache_hits") > 0
    assert _snapshot_sum(cells["cpu"], "lmcache", "lmcache_mp_l2_store_completed_objects_chunks") == 0
    assert _snapshot_sum(cells["nvme"], "lmcache", "lmcache_mp_l2_store_completed_objects_chunks") > 0
    assert (results / "report" / "index.html").is_file() and (results / "report" / "report.md").is_file()

    # run made the doctor's cheap checks after provisioning; `doctor` then checks every host in full:
    # no GPU anywhere (each GPU check a clean skip), the nvme tier's L2 measured on the lmcache host
    assert json.loads((results / "doctor-run" / "doctor.json").read_text())["status"] != "fail"
    doctor = kvlab(env, "doctor", str(inventory), "--campaign", str(campaign), "--results",
                   str(tmp_path / "results"), "--json", timeout=600)  # fmt: skip
    assert doctor.returncode == 0, doctor.stderr[-3000:]
    by_host = {h["host"]: {c["name"]: c for c in h["checks"]} for h in json.loads(doctor.stdout)["hosts"]}
    assert set(by_host) == set(groups)
    for host, found in by_host.items():
        for name in ("device_files", "driver", "fabric", "cuda_init", "pinned_memory", "cuda_ipc"):
            assert (found[name]["status"], found[name]["detail"]) == ("skip", "no GPU"), (host, name)
        assert found["python"]["status"] == found["wheelhouse_python"]["status"] == "ok", host
        if "lmcache" in groups[host]:
            assert found["l2_direct_io"]["status"] == "ok" and found["l2_mount"]["status"] == "ok", found

    again = kvlab(env, "provision", str(inventory), "--campaign", str(campaign))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "provisioned: 0 changed" in again.stdout

    # the canary tokens (inventory and HF_TOKEN) were written, logged or cached nowhere
    assert _canary_leaks(inventory, tmp_path, run.stdout, run.stderr, again.stdout, again.stderr) == []


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_resume_after_the_controller_is_killed(lab: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    inventory, env = lab
    campaign = _write_campaign(tmp_path / "campaign.yml", _campaign("resumetest", ["gpu", "cpu"]))
    results = tmp_path / "results" / "resumetest"
    argv = [sys.executable, "-m", "kvoffload.cli.main", "run", str(inventory), "--campaign", str(campaign),
            "--results", str(tmp_path / "results"), "--no-report"]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    first: Path | None = None
    try:
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline and proc.poll() is None:
            done = list(results.glob("cells/*/DONE")) if results.exists() else []
            started = [p for p in results.glob("cells/*") if not (p / "DONE").exists()] if done else []
            if done and started:
                first = done[0].parent
                time.sleep(3)  # well into the second cell's deploy
                break
            time.sleep(1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert first is not None, "the first cell never finished"
    before = _digest(first)
    again = kvlab(env, *argv[3:])
    assert again.returncode == 0, again.stderr[-4000:]
    assert len(list(results.glob("cells/*/DONE"))) == 2
    assert _digest(first) == before
    assert list((results / "attempts").iterdir()), "the killed attempt is kept aside"
