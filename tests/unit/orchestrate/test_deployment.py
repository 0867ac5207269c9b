"""Cell extravars from the example inventory: endpoints, replay command, L2 device per tier."""

from __future__ import annotations

from pathlib import Path

from kvoffload.config import load_lab
from kvoffload.orchestrate.deployment import cell_extravars, l2_device, replay_command, target_hosts
from kvoffload.replay.command import ReplaySpec, replay_argv

EXAMPLE = Path(__file__).resolve().parents[3] / "inventories" / "example" / "hosts.yml"


def test_example_lab_cells(tmp_path: Path) -> None:
    lab = load_lab(EXAMPLE)
    by_tier = {}
    for cell in lab.cells:
        by_tier.setdefault(cell.tier, cell)
    gpu = cell_extravars(lab, by_tier["gpu"], tmp_path, None)
    nvme = cell_extravars(lab, by_tier["nvme"], tmp_path, tmp_path / "wh")
    # 16 replicas behind Caddy: the replay goes to the load balancer, never to a replica directly
    assert gpu["replay_base_url"].endswith(":8100")
    assert len(gpu["caddy_upstreams"]) == 16
    assert gpu["lmcache_server_enabled"] is False and nvme["lmcache_server_enabled"] is True
    argv = replay_command(nvme)
    assert argv[:2] == ["/opt/kvoffload/venv/bin/kvoffload-lab", "replay"]
    assert argv[argv.index("--concurrency") + 1] == str(by_tier["nvme"].concurrency)
    assert argv[-2:] == ["--output", f"/var/lib/kvoffload/cells/{by_tier['nvme'].id}"]
    # the role's argv is the replay runner's own resolved command, flag for flag
    spec_argv = replay_argv(
        ReplaySpec(
            base_url=nvme["replay_base_url"], model=lab.campaign.model,
            dataset_code=lab.campaign.dataset.code,
            dataset=nvme["replay_dataset_path"], concurrency=by_tier["nvme"].concurrency,
            num_rounds=by_tier["nvme"].num_rounds, output=argv[-1], isl=by_tier["nvme"].isl,
            osl=str(by_tier["nvme"].osl), max_sessions=lab.campaign.max_sessions,
        ),
        executable=argv[0],
    )  # fmt: skip
    assert sorted(spec_argv) == sorted(argv)
    assert nvme["kvoffload_wheelhouse"] == str(tmp_path / "wh")
    # the GPU telemetry (node-exporter textfile) and the client's sampler share one interval
    interval = lab.campaign.sample_interval_s
    assert gpu["vllm_gpu_telemetry_interval"] == gpu["replay_metrics_interval"] == interval
    assert l2_device(lab, by_tier["gpu"]) is None
    assert l2_device(lab, by_tier["nvme"]) == Path(lab.lmcache_host.nvme_devices[0].device).name  # type: ignore[union-attr]
    names = {t["name"] for t in nvme["replay_metrics_targets"]}
    assert "lmcache" in names and "caddy" in names
    assert "lmcache" not in {t["name"] for t in gpu["replay_metrics_targets"]}


def test_targets_name_their_host(tmp_path: Path) -> None:
    lab = load_lab(EXAMPLE)
    cell = next(c for c in lab.cells if c.tier == "nvme")
    targets = target_hosts(lab, cell, cell_extravars(lab, cell, tmp_path, None)["replay_metrics_targets"])
    assert targets["lmcache"]["host"] == lab.lmcache_host.name  # type: ignore[union-attr]
    nodes = {k: v for k, v in targets.items() if v["kind"] == "node"}
    assert {v["host"] for v in nodes.values()} == {h.name for h in lab.inventory.hosts}
    vllm = [v for v in targets.values() if v["kind"] == "vllm"]
    assert len(vllm) == 16 and all(v["host"] in {h.name for h in lab.inventory.group("vllm")} for v in vllm)
