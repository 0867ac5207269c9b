"""Faults on the virtual lab: what a campaign does when a replica, the lmcache-server, a host or the
client's results disk fails under it.

Each test runs a one- or two-cell campaign on its own results folder and breaks one thing at a known
moment, from this process, over the lab's ssh:
1. a replica is killed (SIGKILL, kept down) mid-replay: Caddy stops routing to it within one health
   interval (at its first refused connection, in fact), every later request is served by the other
   replica, the run completes, the failed requests are counted and the cell is marked invalid with the
   fault's reason and time;
2. lmcache-server is killed mid-replay (systemd restarts it): the cell is marked invalid with the
   reason, and what the engines did from then on is recorded;
3. the node is unreachable at deploy: the run stops with an error naming it, the client host is left
   as it was, and once the node is back a new run completes the campaign;
4. the client host's results disk fills up in the second cell: that cell fails with the reason, no
   half-written record is left on the client or the controller, the first cell stays byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.lab import ROOT, free_lab_names, kvlab, lab_marks, small_campaign

CLIENT_CELLS = "/var/lib/kvoffload/cells"  # replay_remote_root of a campaign (orchestrate/cell/deployment.py)
HEALTH_INTERVAL_S = 10.0  # Caddy profiles' health_interval
HEALTH_TIMEOUT_S = 5.0

pytestmark = lab_marks(2400)


class Lab:
    """The running lab: its inventory, environment and ssh into its hosts."""

    def __init__(self, inventory: Path, env: dict[str, str]) -> None:
        self.inventory = inventory
        self.env = env
        doc = yaml.safe_load(inventory.read_text())["all"]
        self.key = doc["vars"]["ansible_ssh_private_key_file"]
        self.address = {name: hv["ansible_host"] for name, hv in doc["hosts"].items()}
        groups = doc["children"]
        self.client = next(iter(groups["client"]["hosts"]))
        self.node = next(iter(groups["vllm"]["hosts"]))

    def ssh(self, host: str, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = ["ssh", "-i", self.key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
                f"root@{self.address[host]}", command]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if check:
            assert proc.returncode == 0, f"{host}: {command}: {proc.stderr[-1000:]}"
        return proc

    def replica_url(self, index: int) -> str:
        return f"http://{self.address[self.node]}:{8000 + index}"

    def run(self, campaign: Path, results: Path, *extra: str) -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "kvoffload.cli.main", "run", str(self.inventory),
                "--campaign", str(campaign), "--results", str(results), *extra]  # fmt: skip
        return subprocess.Popen(argv, env=self.env, cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    base = tmp_path_factory.mktemp("faultlab")
    env = {**os.environ, "KVOFFLOAD_LAB_STATE": str(base / "state")}
    inventory = base / "hosts.yml"
    names = free_lab_names("x", 11)
    up = kvlab(env, "lab", "up", "--hosts", "2", *names.up_args(), "--inventory", str(inventory), timeout=900)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        yield Lab(inventory, env)
    finally:
        down = kvlab(env, "lab", "down", timeout=300)
        assert down.returncode == 0, down.stderr[-2000:]


def _campaign(path: Path, name: str, tiers: list[str], **over: Any) -> Path:
    """The small lab campaign with the recorded gaps kept, so that the replay lasts a while."""
    path.write_text(yaml.safe_dump(small_campaign(name, tiers, **{"honor_gaps": True, **over})))
    return path


def _counter(url: str, name: str) -> float:
    """Sum of a counter family at a metrics endpoint; -1 when it does not answer."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=2).text
    except httpx.HTTPError:
        return -1.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((f"{name}_total", f"{name}{{"))
    )


def _when(condition: Callable[[], bool], timeout_s: float, what: str, every_s: float = 0.3) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return time.time()
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _finish(proc: subprocess.Popen[str], timeout_s: float = 1200) -> tuple[int, str]:
    _out, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, err


def _cell(results: Path, tier: str) -> Path:
    for cell in (results / "cells").iterdir():
        if json.loads((cell / "cell.json").read_text())["config"]["tier"] == tier:
            return cell
    raise AssertionError(f"no {tier} cell under {results}")


def _records(cell: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (cell / "requests.jsonl").read_text().splitlines()]


def _in_background(fn: Callable[[], None]) -> Callable[[], None]:
    """Run fn in a thread; the returned join() re-raises what it raised."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()

    def join() -> None:
        thread.join(timeout=900)
        if errors:
            raise errors[0]

    return join


def test_a_replica_killed_mid_replay(lab: Lab, tmp_path: Path) -> None:
    campaign = _campaign(tmp_path / "campaign.yml", "replicakill", ["cpu"])
    proc = lab.run(campaign, tmp_path / "results")
    caddy_metrics = f"http://{lab.address[lab.node]}:8101"
    victim = f"{lab.address[lab.node]}:8001"
    moments: dict[str, float] = {}

    def fault() -> None:
        _when(lambda: _counter(lab.replica_url(1), "vllm:request_success") >= 3, 900, "replica 1's traffic")
        # SIGKILL, then stop: the replica is gone for good (systemd would restart it after 5 s)
        lab.ssh(lab.node, "systemctl kill --kill-whom=main --signal=SIGKILL kvoffload-vllm@1.service; "
                          "systemctl stop kvoffload-vllm@1.service")  # fmt: skip
        moments["kill"] = time.time()

        def caddy_marked_it_down() -> bool:
            text = httpx.get(f"{caddy_metrics}/metrics", timeout=2).text
            return any(
                line.startswith("caddy_reverse_proxy_upstreams_healthy") and victim in line
                and line.endswith(" 0")
                for line in text.splitlines()
            )  # fmt: skip

        moments["down"] = _when(caddy_marked_it_down, 60, "Caddy to mark the killed replica down")

    joined = _in_background(fault)
    rc, err = _finish(proc)
    joined()
    assert rc == 0, err[-4000:]
    assert moments["down"] - moments["kill"] <= HEALTH_INTERVAL_S + HEALTH_TIMEOUT_S, moments

    results = tmp_path / "results" / "replicakill"
    cell = _cell(results, "cpu")
    assert (cell / "DONE").is_file()
    record = json.loads((cell / "cell.json").read_text())
    assert record["valid"] is False
    outage = [f for f in record["faults"] if f["kind"] == "unreachable"]
    assert [f["target"] for f in outage] == [f"vllm-{lab.node}-1"], record["faults"]
    assert abs(outage[0]["at"] - moments["kill"]) <= 5, (outage, moments)
    assert any("not running" in r for r in record["invalid_reasons"]), record["invalid_reasons"]

    counts = json.loads((cell / "sessions.json").read_text())
    records = _records(cell)
    failed = [r for r in records if r["status"] != "ok"]
    assert counts["failed_requests"] == len(failed) <= 8
    assert counts["complete"] + counts["error"] == counts["achieved_sessions"] == 8
    # The only failures: streams the kill cut (HTTP 200, started before it), and requests Caddy sent to
    # the dead replica before its first refused connection marked it down (502 at once: Caddy does not
    # retry, docs/contracts.md). Every request from 2 s after the kill on is served by replica 0.
    for r in failed:
        cut = r["http_status"] == 200 and r["t_start"] <= moments["kill"] + 1
        refused = r["http_status"] == 502 and r["t_start"] >= moments["kill"] - 1 and r["latency_s"] < 2
        assert cut or refused, r
    later = [r for r in records if r["t_start"] > moments["kill"] + 2]
    assert later, "no request started after the kill: the fault came too late to test routing"
    assert {(r["replica"], r["status"]) for r in later} == {(f"{lab.address[lab.node]}:8000", "ok")}
    effects = record["fault_effects"]
    assert sum(effects["requests_failed"].values()) == len(failed)

    report = (results / "report" / "report.md").read_text()
    assert "not valid" in report


def test_lmcache_server_killed_mid_replay(lab: Lab, tmp_path: Path) -> None:
    campaign = _campaign(tmp_path / "campaign.yml", "lmcachekill", ["cpu"])
    proc = lab.run(campaign, tmp_path / "results")
    moments: dict[str, float] = {}

    def fault() -> None:
        _when(lambda: _counter(lab.replica_url(0), "vllm:request_success") >= 3, 900, "replica 0's traffic")
        lab.ssh(lab.node, "systemctl kill --kill-whom=main --signal=SIGKILL kvoffload-lmcache.service")
        moments["kill"] = time.time()

    joined = _in_background(fault)
    rc, err = _finish(proc)
    joined()
    assert rc == 0, err[-4000:]

    results = tmp_path / "results" / "lmcachekill"
    cell = _cell(results, "cpu")
    record = json.loads((cell / "cell.json").read_text())
    assert record["valid"] is False
    kinds = {(f["target"], f["kind"]) for f in record["faults"]}
    assert ("lmcache", "unreachable") in kinds, record["faults"]
    assert (f"kvoffload-lmcache.service on {lab.node}", "restarted") in kinds, record["faults"]
    assert any(r.startswith("lmcache unreachable at ") for r in record["invalid_reasons"])
    # what the engines did from the fault on: every request after it is accounted for
    effects = record["fault_effects"]
    after = [r for r in _records(cell) if r["t_start"] + (r["latency_s"] or 1e9) >= effects["since"]]
    assert sum(effects["requests_ok"].values()) + sum(effects["requests_failed"].values()) == len(after)
    assert effects["requests_failed"] and effects["errors"], effects  # the simulator fails the lookups
    counts = json.loads((cell / "sessions.json").read_text())
    assert counts["complete"] + counts["error"] == counts["achieved_sessions"] == 8
    assert "not valid" in (results / "report" / "report.md").read_text()


def _client_state(lab: Lab) -> str:
    """Digest of what deploy and replay change on the client host."""
    listing = lab.ssh(
        lab.client,
        "find /etc/systemd/system /etc/kvoffload /opt/kvoffload /var/lib/kvoffload -maxdepth 3 "
        "-printf '%p %s %T@\\n' 2>/dev/null | sort",
        check=False,
    ).stdout
    return hashlib.sha256(listing.encode()).hexdigest()


def test_an_unreachable_node_at_deploy_then_resume(lab: Lab, tmp_path: Path) -> None:
    campaign = _campaign(tmp_path / "campaign.yml", "unreachable", ["gpu"], honor_gaps=False)
    link = f"vb-{lab.node}"
    before = _client_state(lab)
    subprocess.run(["ip", "link", "set", link, "down"], check=True)
    try:
        rc, err = _finish(lab.run(campaign, tmp_path / "results"), timeout_s=600)
    finally:
        subprocess.run(["ip", "link", "set", link, "up"], check=True)
    assert rc == 1, err[-3000:]
    assert f"{lab.node}: unreachable" in err, err[-3000:]
    assert "Traceback" not in err
    results = tmp_path / "results" / "unreachable"
    assert not list(results.glob("cells/*/DONE"))
    assert _client_state(lab) == before, "the client host was changed although the run stopped"

    _when(lambda: lab.ssh(lab.node, "true", check=False).returncode == 0, 120, "the node's ssh")
    rc, err = _finish(lab.run(campaign, tmp_path / "results"))
    assert rc == 0, err[-4000:]
    assert len(list(results.glob("cells/*/DONE"))) == 1


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_the_client_results_disk_fills_up(lab: Lab, tmp_path: Path) -> None:
    campaign = _campaign(tmp_path / "campaign.yml", "diskfull", ["gpu", "cpu"])
    results = tmp_path / "results" / "diskfull"
    lab.ssh(
        lab.client, f"mkdir -p {CLIENT_CELLS} && mount -t tmpfs -o size=16m,mode=0755 kvx-full {CLIENT_CELLS}"
    )
    first: dict[str, Any] = {}
    try:
        proc = lab.run(campaign, tmp_path / "results")

        def fill() -> None:
            _when(lambda: bool(list(results.glob("cells/*/DONE"))), 900, "the first cell", every_s=0.2)
            done = next(iter(results.glob("cells/*/DONE"))).parent
            first["cell"], first["digest"] = done, _digest(done)
            # the other cell's folder, once the controller has made it; then its records on the client
            _when(lambda: len(list(results.glob("cells/*"))) == 2, 600, "the second cell", every_s=0.2)
            second = next(p.name for p in results.glob("cells/*") if p != done)
            records = f"{CLIENT_CELLS}/{second}/requests.jsonl"
            _when(lambda: lab.ssh(lab.client, f"test -s {records}", check=False).returncode == 0, 600,
                  "the second cell's first records")  # fmt: skip
            lab.ssh(lab.client, f"dd if=/dev/zero of={CLIENT_CELLS}/filler bs=64k 2>/dev/null; true")

        joined = _in_background(fill)
        rc, err = _finish(proc)
        joined()
        client_lines = lab.ssh(lab.client, f"cat {CLIENT_CELLS}/*/requests.jsonl", check=False).stdout
    finally:
        lab.ssh(lab.client, f"umount {CLIENT_CELLS}", check=False)
    assert rc == 1, err[-4000:]
    failed = _cell(results, "cpu")
    record = json.loads((failed / "cell.json").read_text())
    assert record["status"] == "failed" and "No space left on device" in record["error"], record.get("error")
    # the replay stopped on it, during the replay (not a snapshot before it), and said why
    # requests.jsonl or, when the last records still fitted, sessions.json
    assert re.search(
        r"replay stopped: cannot write \S+/(requests\.jsonl|sessions\.json): No space left", record["error"]
    )
    assert "Traceback" not in record["error"]
    assert not (failed / "DONE").exists()
    # no half-written record: on the client every line is whole; on the controller nothing or whole lines
    for line in client_lines.splitlines():
        json.loads(line)
    for path in failed.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            json.loads(line)
    assert _digest(first["cell"]) == first["digest"], "the finished cell changed"
    report = results / "report" / "report.md"
    assert report.is_file() and "cpu" in report.read_text()
