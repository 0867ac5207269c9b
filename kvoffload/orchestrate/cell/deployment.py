"""From a validated lab and one cell to the extravars of that cell's playbooks.

Joins `kvoffload.config` (who runs where) with `kvoffload.profiles.resolve` (what each tier runs) and
the replay command of `kvoffload.replay.command`. Pure: no IO, no hosts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from kvoffload.config import Cell, Host, LabConfig
from kvoffload.engines.lab import host_build
from kvoffload.errors import UserError
from kvoffload.orchestrate.cell.extravar_keys import engine_part
from kvoffload.orchestrate.installs.wheelhouse import Wheels
from kvoffload.parallelism import compilation_config, replica_args
from kvoffload.profiles.resolve import Deployment, Replica, engine_args, resolve
from kvoffload.replay.command import ReplaySpec, fixed_flags, replay_argv

REMOTE_ROOT = PurePosixPath("/var/lib/kvoffload")
REMOTE_VENV = PurePosixPath("/opt/kvoffload/venv")
# Staged models on the vLLM hosts (and a shipped model's tokenizer files on the client host).
REMOTE_MODELS = REMOTE_ROOT / "models"


def staged_model(lab: LabConfig) -> str:
    """What vLLM loads: the staged folder of a shipped or downloaded model; the bare name for the sim."""
    if lab.model_folder is not None:
        return str(REMOTE_MODELS / lab.model_folder.name)
    if lab.campaign.engine == "vllm":
        return str(REMOTE_MODELS / lab.campaign.model.replace("/", "--"))
    return lab.campaign.model


def model_extravars(lab: LabConfig) -> dict[str, Any]:
    """Model staging (vllm role) and the replay's tokenizer (replay role)."""
    folder = lab.model_folder
    hub = lab.campaign.model if folder is None and lab.campaign.engine == "vllm" else None
    return {
        "vllm_model_source": str(folder) if folder is not None else None,
        "vllm_model_hub_id": hub,
        "vllm_model_dir": staged_model(lab) if folder is not None or hub else None,
        "replay_tokenizer_src": str(folder) if folder is not None else None,
        "replay_tokenizer": str(REMOTE_MODELS / folder.name) if folder is not None else lab.campaign.model,
    }


BIND_ADDRESS_VAR = "kvoffload_bind_address"
BIND_ALL_VAR = "kvoffload_bind_all"
_TRUE = (True, "true", "yes", "on", "1", "True", "Yes")


def service_address(host: Host) -> str:
    """Where the other hosts reach `host`'s services: the address its server roles bind to.

    The roles (vllm, lmcache_server, caddy, node_exporter) listen on `kvoffload_bind_address`, whose
    default is the host's `ansible_host` (else its inventory name), and on every interface only with
    `kvoffload_bind_all: true`; then clients use `ansible_host`. Both variables are inventory variables
    (host, group or all), read here as the roles read them, so URLs and binds cannot drift apart.
    """
    extra = host.vars.model_extra or {}
    if extra.get(BIND_ALL_VAR, False) in _TRUE:
        return host.address
    bind = extra.get(BIND_ADDRESS_VAR)
    if bind is None:
        return host.address
    if not isinstance(bind, str) or not bind or any(c in bind for c in " \t:/{}"):
        raise UserError(
            f"host {host.name}: {BIND_ADDRESS_VAR} must be the host's IPv4 address on the lab network "
            f"(services listen there and clients connect there), got {bind!r}"
        )
    return bind


def cell_node(lab: LabConfig, node: Host | str | None) -> Host:
    """The node a cell runs on (a name, a host, or None for the first node)."""
    if node is None:
        return lab.nodes[0]
    return lab.node(node) if isinstance(node, str) else node


def deployment(lab: LabConfig, cell: Cell, node: Host | str | None = None) -> Deployment:
    """What `cell` runs on `node` (default: the first node): its replicas, lmcache-server and Caddy."""
    campaign = lab.campaign
    host = cell_node(lab, node)
    replicas = tuple(
        Replica(host=host.name, address=service_address(host), index=r.index, gpus=r.gpus)
        for r in host.replicas
    )
    lmcache = lab.node_lmcache(host)
    lb = lab.node_lb(host)
    nvme = lmcache.nvme_devices[0] if lmcache is not None and lmcache.nvme_devices else None
    extra: dict[str, Any] = {}
    if nvme is not None:
        extra["nvme_mount"] = nvme.mount
    # node-exporter targets: the hosts of this run and its client host (another node's are not this cell's)
    sampled = [*lab.node_hosts(host), lab.client_of(host).name]
    return Deployment(
        tier=cell.tier,
        gpu_vendor=campaign.gpu_vendor,
        engine=campaign.engine,
        model=staged_model(lab),
        served_model_name=lab.served_model_name,
        replicas=replicas,
        lmcache_address=service_address(lmcache) if lmcache is not None and cell.tier != "gpu" else None,
        lb_address=service_address(lb) if lb is not None else None,
        node_addresses={h.name: service_address(h) for h in lab.inventory.hosts if h.name in sampled},
        sim_profile=campaign.sim_profile,
        kv_cache_memory_bytes=campaign.kv_cache_memory_bytes,
        num_gpu_blocks_override=campaign.num_gpu_blocks_override,
        l1_size_gb=_l1_size(lab, cell),
        extra_engine_args=tuple(campaign.extra_engine_args),
        **extra,
    )


def target_hosts(
    lab: LabConfig, cell: Cell, targets: list[dict[str, str]], node: Host | str | None = None
) -> dict[str, dict[str, Any]]:
    """cell.json `targets`: each sampled endpoint's kind and the inventory host it runs on."""
    host = cell_node(lab, node)
    dep = deployment(lab, cell, host)
    lmcache, lb = lab.node_lmcache(host), lab.node_lb(host)
    hosts: dict[str, str | None] = {f"vllm-{r.host}-{r.index}": r.host for r in dep.replicas}
    hosts |= {f"node-{h.name}": h.name for h in lab.inventory.hosts}
    hosts["lmcache"] = lmcache.name if lmcache else None
    hosts["caddy"] = lb.name if lb else None
    # A replica's GPUs give its tensor-parallel size, which the capacity analysis needs to turn vLLM's
    # per-GPU KV bytes into the replica's (kvoffload/analysis/capacity.py).
    gpus = {f"vllm-{r.host}-{r.index}": r.gpus for r in dep.replicas}
    # The compilation config each replica runs, as vLLM parses it from the arguments the vllm role
    # renders (the campaign's merged with the TP > 1 CUDA switch; issue 52).
    shared = engine_args(dep)
    cuda = dep.engine == "vllm" and dep.gpu_vendor == "nvidia" and host_build(lab, host) != "cpu"
    compiled = {
        f"vllm-{r.host}-{r.index}": compilation_config(replica_args(shared, r.gpus, cuda=cuda))
        for r in dep.replicas
    }
    out: dict[str, dict[str, Any]] = {}
    for t in targets:
        out[t["name"]] = {"kind": t["name"].split("-")[0], "host": hosts.get(t["name"]), "url": t["url"]}
        if t["name"] in gpus:
            out[t["name"]]["gpus"] = gpus[t["name"]]
            out[t["name"]]["compilation_config"] = compiled[t["name"]]
    return out


def cell_units(lab: LabConfig, cell: Cell, node: Host | str | None = None) -> list[str]:
    """`<host>--<unit>` of every engine unit the cell runs (the keys of the collected `units/`)."""
    host = cell_node(lab, node)
    dep = deployment(lab, cell, host)
    lmcache, lb = lab.node_lmcache(host), lab.node_lb(host)
    units = [f"{r.host}--kvoffload-vllm@{r.index}.service" for r in dep.replicas]
    if dep.lmcache_address is not None and lmcache is not None:
        units.append(f"{lmcache.name}--kvoffload-lmcache.service")
    if len(dep.replicas) >= 2 and lb is not None:
        units.append(f"{lb.name}--kvoffload-caddy.service")
    return units


def _l1_size(lab: LabConfig, cell: Cell) -> float | None:
    sizes = lab.campaign.lmcache_l1_size_gb
    if sizes is None or cell.tier == "gpu":
        return None
    value: float | None = getattr(sizes, cell.tier)
    return value


def l2_device(lab: LabConfig, cell: Cell, node: Host | str | None = None) -> str | None:
    """Kernel name of the block device behind the L2 path (e.g. nvme1n1, loop3); None off the nvme tier."""
    host = lab.node_lmcache(cell_node(lab, node))
    if cell.tier != "nvme" or host is None or not host.nvme_devices:
        return None
    return Path(host.nvme_devices[0].device).name


REMOTE_CELLS = REMOTE_ROOT / "cells"
REMOTE_DATASETS = REMOTE_ROOT / "datasets"


def remote_cell_dir(cell: Cell) -> PurePosixPath:
    return REMOTE_CELLS / cell.id


def remote_dataset(lab: LabConfig) -> PurePosixPath:
    return REMOTE_DATASETS / lab.campaign.name / lab.dataset_path.name


def cell_extravars(
    lab: LabConfig, cell: Cell, local_cell_dir: Path, wheels: Wheels, node: Host | str | None = None
) -> dict[str, Any]:
    """Every extravar of the deploy, replay, collect and teardown playbooks for one cell on `node`."""
    dep = deployment(lab, cell, node)
    resolved = resolve(dep)
    models = model_extravars(lab)
    campaign = lab.campaign
    spec = ReplaySpec(
        base_url=str(resolved["replay_base_url"]),
        model=lab.served_model_name,
        dataset_code=campaign.dataset.code,
        dataset=str(remote_dataset(lab)),
        concurrency=cell.concurrency,
        num_rounds=cell.num_rounds,
        output=str(remote_cell_dir(cell)),
        isl=cell.isl,
        osl=str(cell.osl),
        max_sessions=campaign.max_sessions,
        duration_s=campaign.duration_s,
        tokenizer=str(models["replay_tokenizer"]),
        # LMCache's cached_token_stats come from its connector: asked where the replicas have one
        # (the gpu tier's cached tokens are all the engine's own, docs/metrics.md).
        attribution="--kv-transfer-config" in resolved["vllm_engine_args"],
        honor_gaps=campaign.honor_gaps,
    )
    if campaign.cold_start == "reset":
        # POST /reset_prefix_cache exists only in vLLM's dev mode (it also serves other dev endpoints,
        # on the address the replica binds: the lab network).
        resolved["vllm_env"] = dict(sorted({**resolved["vllm_env"], "VLLM_SERVER_DEV_MODE": "1"}.items()))
    return {
        **resolved,
        **models,
        "kvoffload_node": cell_node(lab, node).name,
        # the client host that replays the node's cells (preflight refuses a play reaching another)
        "replay_client_host": lab.client_of(cell_node(lab, node)).name,
        "replay_model": lab.served_model_name,
        "kvoffload_campaign_name": campaign.name,
        # the engine set the node installs (kvoffload/engines/lab.py; null for the simulator): the
        # kvoffload_python role installs it, the engine units get its environment
        "kvoffload_engine_set": node_engine_set(lab, cell_node(lab, node)),
        "kvoffload_wheelhouse": str(wheels.wheelhouse) if wheels.wheelhouse else None,
        "kvoffload_package_wheel": str(wheels.package),
        "kvoffload_python_uv_wheel": wheels.uv,
        # preflight (roles/preflight/tasks/host_python.yml) refuses a host whose Python differs
        "kvoffload_wheelhouse_python": wheels.python if wheels.wheelhouse else None,
        # the caddy role ships this one wheel to the load balancer's host and runs its binary
        "caddy_wheel": str(wheels.caddy) if wheels.caddy else None,
        # the argv the replay role runs (no shell); the role's own build from the replay_* variables
        # below, for a role run on its own, gives the same list (tests/unit/roles/test_replay_argv.py)
        "replay_argv": replay_argv(spec, executable=str(REMOTE_VENV / "bin" / "kvoffload-lab")),
        "replay_cell_id": cell.id,
        "replay_remote_root": str(REMOTE_CELLS),
        "replay_controller_dir": str(local_cell_dir),
        "replay_dataset_code": campaign.dataset.code,
        "replay_dataset_path": spec.dataset,
        "replay_dataset_src": str(lab.dataset_path.resolve()),
        "replay_concurrency": cell.concurrency,
        "replay_num_rounds": cell.num_rounds,
        "replay_isl": cell.isl,
        "replay_osl": str(cell.osl),
        "replay_max_sessions": campaign.max_sessions,
        "replay_extra_args": fixed_flags(spec),
        "replay_metrics_interval": campaign.sample_interval_s,
        # the GPU telemetry on vllm hosts (vllm role) polls as often as the client samples
        "vllm_gpu_telemetry_interval": campaign.sample_interval_s,
    }


def node_engine_set(lab: LabConfig, node: Host) -> dict[str, Any] | None:
    """The record of the engine set `node` installs (kvoffload/engines/lab.py), None for the simulator."""
    from kvoffload.engines.lab import node_sets

    found = node_sets(lab).get(node.name)
    return found.record() if found is not None else None


def replay_command(extravars: dict[str, Any]) -> list[str]:
    """The replay argv the role runs, for cell.json: the extravars' `replay_argv`
    (kvoffload.replay.command.replay_argv, the one build)."""
    return [str(a) for a in extravars["replay_argv"]]


def engine_key(extravars: dict[str, Any]) -> str:
    """A digest of everything a deploy sets up (engines, cache server, Caddy, on which node): two cells
    with the same key can share running engines, made cold by a reset instead of a restart. Which
    extravars count is declared per key (kvoffload/orchestrate/cell/extravar_keys.py); an undeclared key is
    refused."""
    engine = engine_part(extravars)
    canonical = json.dumps(engine, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def cold_start_methods(lab: LabConfig, cells: Sequence[Cell], node: Host | str) -> list[str]:
    """How each of a node's cells (in run order) will start cold if every cell succeeds: "restart"
    for the first and whenever the engine configuration changes, else "reset" (cold_start: reset)."""
    placeholder = Wheels(package=Path("kvoffload.whl"), wheelhouse=None)  # the same for every cell
    methods: list[str] = []
    previous: str | None = None
    for cell in cells:
        key = engine_key(cell_extravars(lab, cell, Path(cell.id), placeholder, node))
        reset = lab.campaign.cold_start == "reset" and key == previous
        methods.append("reset" if reset else "restart")
        previous = key
    return methods
