"""Every extravar the orchestrator hands to a playbook, declared one by one: does it change the engines?

A cell's extravars (kvoffload/orchestrate/cell/deployment.py `cell_extravars`) and the switches a run adds
(kvoffload/orchestrate/playbooks_api.py, and the role variables the orchestrator turns off) are listed
here, each ENGINE (part of what a deploy sets up: a change needs new engines, `engine_key` digests it)
or NOT_ENGINE (read by the replay, the sampler or the bookkeeping only: cells that differ in it share
running engines). A key that is not listed is refused before ansible-runner runs (`check_declared`),
so a new extravar cannot slip past the engine identity unseen. Keys no role's
`meta/argument_specs.yml` declares are named in ORCHESTRATOR_ONLY (tests/unit/orchestrate/
test_extravar_keys.py holds both lists to the roles). Pure data; no IO.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

from kvoffload.orchestrate.playbooks_api import (
    CLEAR_L2_NEXT_VAR,
    CLEAR_L2_VAR,
    JOURNAL_UNITS_VAR,
    TEARDOWN_AFTER_VAR,
)


class Identity(Enum):
    ENGINE = "engine"
    NOT_ENGINE = "not-engine"


E, N = Identity.ENGINE, Identity.NOT_ENGINE

EXTRAVARS: Mapping[str, Identity] = {
    # the cell's tier, engine, GPU build and model (profiles/resolve.py)
    "kvoffload_tier": E,
    "kvoffload_engine": E,
    "kvoffload_gpu_vendor": E,
    "kvoffload_model": E,
    # the node the cell runs on, and what its hosts install from (the wheels of this run)
    "kvoffload_node": E,
    "kvoffload_wheelhouse": E,
    "kvoffload_package_wheel": E,
    "kvoffload_python_uv_wheel": E,
    "kvoffload_wheelhouse_python": E,
    # the node's engine set (what the engine venv holds, and the engine units' environment)
    "kvoffload_engine_set": E,
    "kvoffload_campaign_name": N,
    # vLLM replicas (the vllm role)
    "vllm_engine_args": E,
    "vllm_env": E,
    "vllm_sim_profile": E,
    "vllm_visible_devices_env": E,
    "vllm_base_port": E,
    "vllm_model_source": E,
    "vllm_model_hub_id": E,
    "vllm_model_dir": E,
    "vllm_gpu_telemetry_interval": N,
    # the replicas to start (the role's default: the host's inventory `replicas`); only the doctor's
    # smoke check narrows it, to the node's first replica (orchestrate/checks/round_trip.py)
    "vllm_replicas": E,  # the GPU telemetry beside the engines, as often as the sampler
    # the node's lmcache-server (the lmcache_server role)
    "lmcache_server_enabled": E,
    "lmcache_server_args": E,
    "lmcache_server_port": E,
    "lmcache_server_http_port": E,
    "lmcache_server_l2_path": E,
    "lmcache_server_l2_adapter": E,
    "lmcache_server_l2_capacity_fraction": E,
    # Caddy in front of 2+ replicas (the caddy role)
    "caddy_enabled": E,
    "caddy_wheel": E,
    "caddy_upstreams": E,
    "caddy_listen_port": E,
    "caddy_metrics_port": E,
    "caddy_lb_policy": E,
    "caddy_health_uri": E,
    "caddy_health_interval": E,
    "caddy_health_timeout": E,
    "caddy_fail_duration": E,
    "caddy_max_fails": E,
    "caddy_lb_try_duration": E,
    "caddy_lb_try_interval": E,
    # the replay and the sampler on the client host (the replay role)
    "replay_base_url": N,
    "replay_metrics_targets": N,
    "replay_model": N,
    "replay_tokenizer": N,
    "replay_tokenizer_src": N,
    "replay_cell_id": N,
    "replay_remote_root": N,
    "replay_controller_dir": N,
    "replay_dataset_code": N,
    "replay_dataset_path": N,
    "replay_dataset_src": N,
    "replay_concurrency": N,
    "replay_num_rounds": N,
    "replay_isl": N,
    "replay_osl": N,
    "replay_max_sessions": N,
    "replay_extra_args": N,
    "replay_metrics_interval": N,
    # the whole replay command line (kvoffload/replay/command.py) and the client host that runs it
    "replay_argv": N,
    "replay_client_host": N,
    # what a run of the orchestrator turns off or on in its own playbook runs (cell_run.py)
    "replay_unpack_on_controller": N,
    "replay_keep_attempts": N,
    "collect_units_to_controller": N,
    "collect_software_to_controller": N,
    JOURNAL_UNITS_VAR: N,  # the vllm role's: every stopped unit's journal after a failed cell
    CLEAR_L2_VAR: N,
    CLEAR_L2_NEXT_VAR: N,
    TEARDOWN_AFTER_VAR: N,
}

# Declared by no role's argument_specs: the playbooks' own switches (playbooks_api.py) and the campaign's
# name, which only the orchestrator's bookkeeping reads.
ORCHESTRATOR_ONLY = frozenset(
    {"kvoffload_campaign_name", CLEAR_L2_VAR, CLEAR_L2_NEXT_VAR, TEARDOWN_AFTER_VAR}
)


class UndeclaredExtravar(ValueError):
    """An extravar this module does not declare: a bug of the orchestrator, not of the user's input."""


def undeclared(keys: Iterable[str]) -> list[str]:
    return sorted(set(keys) - set(EXTRAVARS))


def check_declared(extravars: Mapping[str, Any]) -> None:
    """Refuse extravars with a key not declared in EXTRAVARS (before a playbook or an engine key)."""
    unknown = undeclared(extravars)
    if unknown:
        raise UndeclaredExtravar(
            f"extravars {unknown} are not declared in kvoffload/orchestrate/cell/extravar_keys.py EXTRAVARS: "
            "say there whether each changes the engines"
        )


def engine_part(extravars: Mapping[str, Any]) -> dict[str, Any]:
    """The ENGINE extravars of `extravars` (checked first): what a deploy sets up."""
    check_declared(extravars)
    return {k: v for k, v in extravars.items() if EXTRAVARS[k] is Identity.ENGINE}
