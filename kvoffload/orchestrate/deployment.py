"""From a validated lab and one cell to the extravars of that cell's playbooks.

Joins `kvoffload.config` (who runs where) with `kvoffload.profiles.resolve` (what each tier runs) and
the replay command of `kvoffload.replay.command`. Pure: no IO, no hosts.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from kvoffload.config import Cell, LabConfig
from kvoffload.profiles.resolve import Deployment, Replica, resolve
from kvoffload.replay.command import ReplaySpec, replay_argv

REMOTE_ROOT = PurePosixPath("/var/lib/kvoffload")
REMOTE_VENV = PurePosixPath("/opt/kvoffload/venv")


def deployment(lab: LabConfig, cell: Cell) -> Deployment:
    campaign = lab.campaign
    replicas = tuple(
        Replica(host=host.name, address=host.address, index=r.index, gpus=r.gpus)
        for host in lab.inventory.group("vllm")
        for r in host.replicas
    )
    lmcache = lab.lmcache_host
    lb = lab.lb_host
    nvme = lmcache.nvme_devices[0] if lmcache is not None and lmcache.nvme_devices else None
    extra: dict[str, Any] = {}
    if nvme is not None:
        extra["nvme_mount"] = nvme.mount
    return Deployment(
        tier=cell.tier,
        gpu_vendor=campaign.gpu_vendor,
        engine=campaign.engine,
        model=campaign.model,
        replicas=replicas,
        lmcache_address=lmcache.address if lmcache is not None and cell.tier != "gpu" else None,
        lb_address=lb.address if lb is not None else None,
        node_addresses={h.name: h.address for h in lab.inventory.hosts},
        sim_profile=campaign.sim_profile,
        kv_cache_memory_bytes=campaign.kv_cache_memory_bytes,
        num_gpu_blocks_override=campaign.num_gpu_blocks_override,
        l1_size_gb=campaign.lmcache_l1_size_gb,
        extra_engine_args=tuple(campaign.extra_engine_args),
        **extra,
    )


def l2_device(lab: LabConfig, cell: Cell) -> str | None:
    """Kernel name of the block device behind the L2 path (e.g. nvme1n1, loop3); None off the nvme tier."""
    host = lab.lmcache_host
    if cell.tier != "nvme" or host is None or not host.nvme_devices:
        return None
    return Path(host.nvme_devices[0].device).name


def remote_cell_dir(lab: LabConfig, cell: Cell) -> PurePosixPath:
    return REMOTE_ROOT / "results" / lab.campaign.name / cell.id


def remote_dataset(lab: LabConfig) -> PurePosixPath:
    return REMOTE_ROOT / "datasets" / lab.campaign.name / lab.dataset_path.name


def cell_extravars(
    lab: LabConfig, cell: Cell, local_cell_dir: Path, wheelhouse: Path | None
) -> dict[str, Any]:
    """Every extravar of the deploy, replay, collect and teardown playbooks for one cell."""
    dep = deployment(lab, cell)
    resolved = resolve(dep)
    campaign = lab.campaign
    out = remote_cell_dir(lab, cell)
    spec = ReplaySpec(
        base_url=str(resolved["replay_base_url"]),
        model=campaign.model,
        dataset_code=campaign.dataset.code,
        dataset=str(remote_dataset(lab)),
        concurrency=cell.concurrency,
        num_rounds=cell.num_rounds,
        output=str(out),
        isl=cell.isl,
        osl=str(cell.osl),
        max_sessions=campaign.max_sessions,
        duration_s=campaign.duration_s,
    )
    argv = replay_argv(spec, executable=str(REMOTE_VENV / "bin" / "kvoffload-lab"))
    if campaign.honor_gaps:
        argv.append("--honor-gaps")
    return {
        **resolved,
        "kvoffload_campaign_name": campaign.name,
        "kvoffload_cell_id": cell.id,
        "kvoffload_wheelhouse": str(wheelhouse) if wheelhouse else None,
        "replay_argv": argv,
        "replay_remote_dir": str(out),
        "replay_local_dir": str(local_cell_dir),
        "replay_dataset_src": str(lab.dataset_path),
        "replay_dataset_dest": str(remote_dataset(lab)),
        "replay_interval_s": 15,
    }
