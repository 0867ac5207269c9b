"""Tier profiles (YAML data beside this module) -> the extravars the phase playbooks and roles take.

Sits between `kvoffload/config` (which reads the inventory and campaign) and `kvoffload/playbook`
(which hands these extravars to ansible-runner). It reads profile files and does arithmetic on ports
and addresses; it never touches a host, runs Ansible or reads the inventory itself. Every key it
returns is documented in the receiving role's `meta/argument_specs.yml` and in playbooks/README.md.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvoffload.errors import UserError
from kvoffload.parallelism import parallelism_problem, tensor_parallel_size
from kvoffload.tiers import (
    LMCACHE_REGISTRATION_GRACE_S,
    LMCACHE_SERVER_GPU_OVERHEAD_GIB,
    Tier,
)
from kvoffload.tiers import VLLM_HEALTH_TIMEOUT_S as VLLM_HEALTH_TIMEOUT_S

GpuVendor = Literal["nvidia", "amd"]
Engine = Literal["vllm", "sim"]

PROFILES_DIR = Path(__file__).resolve().parent
# The roles' own values, held equal by tests/unit/roles/test_shared_vars.py: kvoffload_vllm_base_port
# (roles/kvoffload) and lmcache_server_port (roles/lmcache_server).
VLLM_BASE_PORT = 8000
LMCACHE_PORT = 5555
# LMCache 0.5.6's `lmcache server` serves /metrics, /healthcheck, /status and /cache/clear on its HTTP
# port (it ignores --prometheus-port); so does the simulator.
LMCACHE_HTTP_PORT = 8080
# vLLM imports the connector from here, so a broken LMCache install fails loudly instead of vLLM falling
# back to its own bundled copy of the connector.
LMCACHE_CONNECTOR_MODULE = "lmcache.integration.vllm.lmcache_mp_connector"
CADDY_PORT = 8100
CADDY_METRICS_PORT = 8101
NODE_EXPORTER_PORT = 9100
# VLLM_HEALTH_TIMEOUT_S and LMCACHE_REGISTRATION_GRACE_S live in kvoffload/tiers.py (the analysis reads
# the grace too) and are re-exported here, where the flags are built.
VISIBLE_DEVICES_ENV: dict[GpuVendor, str] = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "HIP_VISIBLE_DEVICES"}
# vLLM's default --gpu-memory-utilization.
VLLM_GPU_MEMORY_UTILIZATION = 0.9
# The GPU size `plan` judges the room on when it cannot know the hosts' GPUs (engine vllm): 80 GiB, the
# smallest data-centre GPU this lab targets (A100/H100 80 GB), so that a figure too high for it warns.
ASSUMED_GPU_MEMORY_GIB = 80.0
# systemd splits `$VAR` in ExecStart at whitespace and the replica env file quotes values with single
# quotes, so an argument must contain neither.
_UNSAFE_ARG = re.compile(r"[\s']")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KvConnector(_Strict):
    """The KV connector block of an engine profile (cpu and nvme tiers)."""

    kv_connector: str = Field(description="vLLM connector class name, e.g. LMCacheMPConnector")
    kv_role: str = Field(description="vLLM kv_role, kv_both for a connector that stores and loads")
    mq_timeout: int = Field(gt=0, description="lmcache.mp.mq_timeout: seconds per blocking request")


class EngineProfile(_Strict):
    """Flags of `vllm serve` for one (GPU vendor build, tier)."""

    description: str = Field(description="one line saying what the profile is for")
    args: list[str] = Field(description="flags passed to every replica, in order")
    env: dict[str, str] = Field(description="extra environment of every replica")
    kv_connector: KvConnector | None = Field(description="connector to lmcache-server; null on gpu")


class L2Adapter(_Strict):
    """The L2 adapter of the nvme lmcache profile; base_path is the NVMe mount + l2_subdir.

    Only `fs_native` with O_DIRECT measures the device: the `fs` adapter is buffered Python I/O, so
    recently written chunks would come back from the page cache (RAM) and it has no capacity limit.
    """

    type: Literal["fs_native"] = Field(description="LMCache L2 adapter type (fs_native: O_DIRECT files)")
    l2_subdir: str = Field(pattern=r"^[A-Za-z0-9._-]+$", description="folder under the NVMe mount")
    use_odirect: bool = Field(description="read and write with O_DIRECT, bypassing the page cache")
    num_workers: int = Field(gt=0, description="I/O worker threads of the adapter")
    capacity_fraction: float = Field(
        gt=0, le=1, description="share of the mount's size the L2 may fill (the role measures the mount)"
    )
    eviction_policy: Literal["LRU"] = Field(
        description="L2 eviction past the capacity (without an eviction block fs_native only counts it)"
    )


class LmcacheProfile(_Strict):
    """Flags of `lmcache server` for one offload tier."""

    description: str = Field(description="one line saying what the profile is for")
    chunk_size: int = Field(gt=0, description="tokens per KV chunk")
    max_workers: int = Field(gt=0, description="worker threads of the server")
    l1_size_gb: float = Field(gt=0, description="L1 (pinned RAM) pool size in GB")
    eviction_policy: Literal["LRU", "noop"] = Field(description="L1 eviction policy")
    eviction_trigger_watermark: float = Field(gt=0, le=1, description="L1 usage ratio starting eviction")
    eviction_ratio: float = Field(gt=0, le=1, description="fraction of L1 one eviction pass frees")
    l2_adapter: L2Adapter | None = Field(description="L2 on the NVMe mount; null for the cpu tier")


class CaddyProfile(_Strict):
    """Load-balancing policy and health checks of Caddy in front of 2+ replicas."""

    description: str = Field(description="one line saying what the profile is for")
    lb_policy: Literal["header X-User-Id", "least_conn"] = Field(description="Caddy lb_policy line")
    health_uri: str = Field(description="active health check path")
    health_interval: str = Field(description="active health check interval (Caddy duration)")
    health_timeout: str = Field(description="active health check timeout (Caddy duration)")
    fail_duration: str = Field(description="passive health: how long a failure is remembered")
    max_fails: int = Field(gt=0, description="passive health: failures before a replica is down")
    lb_try_duration: str = Field(description="how long a request waits for a healthy replica")
    lb_try_interval: str = Field(description="pause between tries within lb_try_duration")


@dataclass(frozen=True)
class Replica:
    """One vLLM replica: systemd instance `kvoffload-vllm@<index>` on `host`, port 8000+index."""

    host: str
    # Where clients reach it: the address the vllm role binds (kvoffload/orchestrate/cell/deployment.py).
    address: str
    index: int
    gpus: str


@dataclass(frozen=True)
class Deployment:
    """What the resolver needs to know about one cell's deployment."""

    tier: Tier
    gpu_vendor: GpuVendor
    engine: Engine
    # What vLLM loads: a hub id, or the staged folder on the hosts.
    model: str
    replicas: tuple[Replica, ...]
    # The name requests carry (--served-model-name) when it differs from `model`.
    served_model_name: str | None = None
    # Addresses the lmcache-server and Caddy hosts bind their services to (and clients connect to).
    lmcache_address: str | None = None
    lb_address: str | None = None
    # Inventory host name -> bound address, for node-exporter targets (every host of the run).
    node_addresses: Mapping[str, str] = field(default_factory=dict)
    sim_profile: str | None = None
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    l1_size_gb: float | None = None
    nvme_mount: str = "/mnt/kvoffload-nvme"
    extra_engine_args: tuple[str, ...] = ()


def _load(path: Path, model: type[_Strict]) -> Any:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"cannot read profile {path}: {exc}") from exc
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise UserError(f"profile {path} is invalid (fix the keys named here):\n{exc}") from exc


@cache
def engine_profile(gpu_vendor: GpuVendor, tier: Tier) -> EngineProfile:
    """The engine profile of (vendor build, tier): kvoffload/profiles/engine/<vendor>-<tier>.yaml."""
    result: EngineProfile = _load(PROFILES_DIR / "engine" / f"{gpu_vendor}-{tier}.yaml", EngineProfile)
    return result


@cache
def lmcache_profile(tier: Tier) -> LmcacheProfile:
    """The lmcache-server profile of an offload tier (cpu or nvme)."""
    if tier == "gpu":
        raise UserError("the gpu tier runs no lmcache-server, so it has no lmcache profile")
    result: LmcacheProfile = _load(PROFILES_DIR / "lmcache" / f"{tier}.yaml", LmcacheProfile)
    return result


@cache
def caddy_profile(tier: Tier) -> CaddyProfile:
    """The Caddy profile of a tier."""
    result: CaddyProfile = _load(PROFILES_DIR / "caddy" / f"{tier}.yaml", CaddyProfile)
    return result


def _check_args(args: Sequence[str], what: str) -> None:
    for arg in args:
        if _UNSAFE_ARG.search(arg):
            raise UserError(
                f"{what}: argument {arg!r} contains whitespace or a single quote, which the systemd "
                "unit cannot pass through; remove them (JSON values are written compactly)"
            )


def _check_deployment(dep: Deployment) -> None:
    if not dep.replicas:
        raise UserError("deployment has no vLLM replica: give the `vllm` group hosts `vllm_replicas`")
    keys = [(r.host, r.index) for r in dep.replicas]
    if len(set(keys)) != len(keys):
        raise UserError(f"two replicas share a host and index in vllm_replicas: {sorted(keys)}")
    ports = {(r.address, VLLM_BASE_PORT + r.index) for r in dep.replicas}
    if len(ports) != len(dep.replicas):
        raise UserError(
            "two replicas would listen on the same address and port: make indexes unique per host"
        )
    for r in dep.replicas:
        if r.index < 0 or not re.fullmatch(r"[0-9]+(,[0-9]+)*", r.gpus):
            raise UserError(
                f"vllm_replicas of host {r.host}: index {r.index} / gpus {r.gpus!r} are invalid "
                '(index >= 0, gpus a comma list of GPU ids such as "0" or "0,1")'
            )
    if dep.tier != "gpu" and not dep.lmcache_address:
        raise UserError(f"tier {dep.tier} needs the `lmcache` group: one host for lmcache-server")
    if len(dep.replicas) >= 2 and not dep.lb_address:
        raise UserError(f"{len(dep.replicas)} replicas need the `lb` group: one host for Caddy")
    if dep.engine == "sim" and not dep.sim_profile:
        raise UserError("engine sim needs a simulator cost profile (sim_profile)")
    if dep.kv_cache_memory_bytes is not None and dep.num_gpu_blocks_override is not None:
        raise UserError("set kv_cache_memory_bytes or num_gpu_blocks_override, not both")
    _check_args([dep.model], "model")


def engine_args(dep: Deployment) -> list[str]:
    """Flags every replica gets after `vllm serve <model> --host H --port P`.

    Each replica's `--tensor-parallel-size` is not among them: it depends on the replica's `gpus`, so the
    vllm role appends it in the replica's environment file (kvoffload/parallelism.py).
    """
    profile = engine_profile(dep.gpu_vendor, dep.tier)
    # The vllm role adds each replica's --tensor-parallel-size from its `gpus`: no profile or campaign
    # flag may contradict it (the campaign model refuses it first; this covers the profile files).
    profile_file = PROFILES_DIR / "engine" / f"{dep.gpu_vendor}-{dep.tier}.yaml"
    for where, given in (
        (f"engine profile {profile_file}: args", profile.args),
        ("the campaign's extra_engine_args", dep.extra_engine_args),
    ):
        problem = parallelism_problem(given)
        if problem is not None:
            raise UserError(f"{where}[{problem[0]}]: {problem[1]}")
    args = list(profile.args)
    if dep.served_model_name and dep.served_model_name != dep.model:
        args += ["--served-model-name", dep.served_model_name]
    if dep.kv_cache_memory_bytes is not None:
        args += ["--kv-cache-memory-bytes", str(dep.kv_cache_memory_bytes)]
    if dep.num_gpu_blocks_override is not None:
        args += ["--num-gpu-blocks-override", str(dep.num_gpu_blocks_override)]
    args += list(dep.extra_engine_args)
    if profile.kv_connector is not None:
        config = {
            "kv_connector": profile.kv_connector.kv_connector,
            "kv_connector_module_path": LMCACHE_CONNECTOR_MODULE,
            "kv_role": profile.kv_connector.kv_role,
            "kv_connector_extra_config": {
                "lmcache.mp.host": f"tcp://{dep.lmcache_address}",
                "lmcache.mp.port": LMCACHE_PORT,
                "lmcache.mp.mq_timeout": profile.kv_connector.mq_timeout,
            },
        }
        args += ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
    _check_args(args, f"engine profile {dep.gpu_vendor}-{dep.tier}")
    return args


def l2_path(dep: Deployment) -> str | None:
    """Folder of the L2 files on the NVMe mount (nvme tier), else None."""
    if dep.tier == "gpu":
        return None
    adapter = lmcache_profile(dep.tier).l2_adapter
    return None if adapter is None else f"{dep.nvme_mount.rstrip('/')}/{adapter.l2_subdir}"


def lmcache_workers(dep: Deployment) -> int:
    """Worker threads of the server: at least one per tensor-parallel rank of the replicas it serves."""
    # LMCache 0.5.6 runs every STORE/RETRIEVE of one ZMQ client on one thread of its affinity pool:
    # `--max-workers` threads without --max-gpu-workers (lmcache/v1/multiprocess/config.py), handed to
    # add_affinity_thread_pool in lmcache/v1/multiprocess/transport/zmq_impl/server.py and keyed by the
    # client's ZMQ identity (lmcache/v1/multiprocess/transport/zmq_impl/mq.py); a client past the pool's
    # size shares a thread with an earlier one, its transfers queued behind theirs
    # (lmcache/v1/multiprocess/affinity_pool.py AffinityThreadPool._slot_for_key). Each
    # tensor-parallel rank of a replica is such a client: vLLM builds one LMCacheMPConnector per worker
    # process, whose LMCacheMPWorkerAdapter opens its own request client
    # (lmcache/integration/vllm/lmcache_mp_connector.py, vllm_multi_process_adapter.py). So the
    # clients are the ranks, not the replicas.
    ranks = sum(tensor_parallel_size(r.gpus) for r in dep.replicas)
    return max(lmcache_profile(dep.tier).max_workers, ranks)


def lmcache_args(dep: Deployment) -> list[str]:
    """Flags of `lmcache server` (or the simulator's `sim cache-server`), empty on the gpu tier.

    The L2 adapter is not among them: its capacity depends on the mount's size, which only the host
    knows, so the lmcache_server role appends `--l2-adapter` from `l2_adapter()` (see that role).
    """
    if dep.tier == "gpu":
        return []
    p = lmcache_profile(dep.tier)
    l1 = dep.l1_size_gb if dep.l1_size_gb is not None else p.l1_size_gb
    # No --host/--http-host: the lmcache_server role binds the host's lab address (kvoffload_bind_address,
    # the address `lmcache_address` is), as the other server roles do.
    args = [
        "--port", str(LMCACHE_PORT),
        "--http-port", str(LMCACHE_HTTP_PORT),
        "--chunk-size", str(p.chunk_size),
        "--max-workers", str(lmcache_workers(dep)),
        "--l1-size-gb", f"{l1:g}",
        "--eviction-policy", p.eviction_policy,
        "--eviction-trigger-watermark", f"{p.eviction_trigger_watermark:g}",
        "--eviction-ratio", f"{p.eviction_ratio:g}",
        # auto: the server offers both transfer paths and each worker (the connector in each replica)
        # picks one: CUDA IPC where the replica runs on a GPU, the engine-driven copy path where it runs
        # on none (vLLM's CPU build in the virtual lab).
        "--supported-transfer-mode", "auto",
        "--worker-registration-grace-seconds", str(LMCACHE_REGISTRATION_GRACE_S),
    ]  # fmt: skip
    _check_args(args, f"lmcache profile {dep.tier}")
    return args


def l2_adapter(dep: Deployment) -> dict[str, Any] | None:
    """The `--l2-adapter` JSON of the nvme tier without its capacity (the role adds it), else None."""
    path = l2_path(dep)
    if dep.tier == "gpu" or path is None:
        return None
    adapter = lmcache_profile(dep.tier).l2_adapter
    assert adapter is not None  # l2_path() is None without one
    return {
        "type": adapter.type,
        "base_path": path,
        "use_odirect": adapter.use_odirect,
        "num_workers": adapter.num_workers,
        "eviction": {"eviction_policy": adapter.eviction_policy},
    }


def metrics_targets(dep: Deployment) -> list[dict[str, str]]:
    """Every /metrics endpoint the client samples during a cell: [{name, url}], sorted by name."""
    targets = [
        {"name": f"vllm-{r.host}-{r.index}", "url": f"http://{r.address}:{VLLM_BASE_PORT + r.index}/metrics"}
        for r in dep.replicas
    ]
    if dep.tier != "gpu":
        targets.append(
            {"name": "lmcache", "url": f"http://{dep.lmcache_address}:{LMCACHE_HTTP_PORT}/metrics"}
        )
    if len(dep.replicas) >= 2:
        targets.append({"name": "caddy", "url": f"http://{dep.lb_address}:{CADDY_METRICS_PORT}/metrics"})
    for host, address in dep.node_addresses.items():
        targets.append({"name": f"node-{host}", "url": f"http://{address}:{NODE_EXPORTER_PORT}/metrics"})
    return sorted(targets, key=lambda t: t["name"])


def base_url(dep: Deployment) -> str:
    """Where the replay client sends requests: Caddy with 2+ replicas, else the one replica."""
    if len(dep.replicas) >= 2:
        return f"http://{dep.lb_address}:{CADDY_PORT}"
    only = dep.replicas[0]
    return f"http://{only.address}:{VLLM_BASE_PORT + only.index}"


def _l2_fraction(dep: Deployment) -> float | None:
    adapter = lmcache_profile(dep.tier).l2_adapter if dep.tier != "gpu" else None
    return adapter.capacity_fraction if adapter is not None else None


def resolve(dep: Deployment) -> dict[str, Any]:
    """All extravars of one cell's deploy/replay/teardown playbooks (plain JSON-able values)."""
    _check_deployment(dep)
    engine = engine_profile(dep.gpu_vendor, dep.tier)
    lb = caddy_profile(dep.tier)
    offload = dep.tier != "gpu"
    return {
        "kvoffload_tier": dep.tier,
        "kvoffload_engine": dep.engine,
        "kvoffload_gpu_vendor": dep.gpu_vendor,
        "kvoffload_model": dep.model,
        "vllm_engine_args": engine_args(dep),
        "vllm_env": dict(sorted(engine.env.items())),
        "vllm_sim_profile": dep.sim_profile if dep.engine == "sim" else None,
        "vllm_visible_devices_env": VISIBLE_DEVICES_ENV[dep.gpu_vendor],
        "vllm_base_port": VLLM_BASE_PORT,
        "lmcache_server_enabled": offload,
        "lmcache_server_args": lmcache_args(dep),
        "lmcache_server_port": LMCACHE_PORT,
        "lmcache_server_http_port": LMCACHE_HTTP_PORT,
        "lmcache_server_l2_path": l2_path(dep),
        "lmcache_server_l2_adapter": l2_adapter(dep),
        "lmcache_server_l2_capacity_fraction": _l2_fraction(dep),
        "caddy_enabled": len(dep.replicas) >= 2,
        "caddy_upstreams": [f"{r.address}:{VLLM_BASE_PORT + r.index}" for r in dep.replicas],
        "caddy_listen_port": CADDY_PORT,
        "caddy_metrics_port": CADDY_METRICS_PORT,
        "caddy_lb_policy": lb.lb_policy,
        "caddy_health_uri": lb.health_uri,
        "caddy_health_interval": lb.health_interval,
        "caddy_health_timeout": lb.health_timeout,
        "caddy_fail_duration": lb.fail_duration,
        "caddy_max_fails": lb.max_fails,
        "caddy_lb_try_duration": lb.lb_try_duration,
        "caddy_lb_try_interval": lb.lb_try_interval,
        "replay_base_url": base_url(dep),
        "replay_metrics_targets": metrics_targets(dep),
    }


def gpu_memory_utilization(args: Sequence[str]) -> float:
    """The --gpu-memory-utilization in `args` (vLLM keeps the last one), else vLLM's default."""
    value = VLLM_GPU_MEMORY_UTILIZATION
    for i, arg in enumerate(args):
        name, sep, given = arg.partition("=")
        if name.replace("_", "-") == "--gpu-memory-utilization":
            raw = given if sep else (args[i + 1] if i + 1 < len(args) else "")
            try:
                value = float(raw)
            except ValueError:
                continue  # vLLM itself refuses it at start
    return value


def gpu_room_warning(tier: Tier, args: Sequence[str], gpu_memory_gib: float | None) -> str | None:
    """Why the engine flags `args` leave too little GPU memory for lmcache-server on `tier`, or None.

    `gpu_memory_gib` None: the hosts' GPUs are unknown, and ASSUMED_GPU_MEMORY_GIB is judged.
    """
    if tier == "gpu":
        return None
    utilization = gpu_memory_utilization(args)
    size = gpu_memory_gib if gpu_memory_gib is not None else ASSUMED_GPU_MEMORY_GIB
    room = (1.0 - utilization) * size
    if room >= LMCACHE_SERVER_GPU_OVERHEAD_GIB:
        return None
    highest = math.floor(1000 * (1.0 - LMCACHE_SERVER_GPU_OVERHEAD_GIB / size)) / 1000  # at most: down
    assumed = "" if gpu_memory_gib is not None else " (assumed: plan does not know the hosts' GPUs)"
    return (
        f"tier {tier}: --gpu-memory-utilization {utilization:g} leaves {room:.2f} GiB of a {size:g} GiB "
        f"GPU{assumed} outside vLLM's budget, but lmcache-server holds about "
        f"{LMCACHE_SERVER_GPU_OVERHEAD_GIB:g} GiB on every GPU (its CUDA context and transfer buffers): "
        f"a replica may fail to start or run out of memory mid-cell; give at most {highest:.3f} in the "
        "campaign's extra_engine_args, or size the KV cache with kv_cache_memory_bytes"
    )
