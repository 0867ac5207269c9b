"""Golden tests of the extravars each tier profile resolves to (regenerate: KVOFFLOAD_REGEN_GOLDEN=1)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from kvoffload.errors import UserError
from kvoffload.profiles import resolve as r
from kvoffload.tiers import TIERS

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("KVOFFLOAD_REGEN_GOLDEN") == "1"

TWO_REPLICAS = (
    r.Replica(host="gpu1", address="10.0.0.11", index=0, gpus="0"),
    r.Replica(host="gpu1", address="10.0.0.11", index=1, gpus="1"),
)
NODES = {"gpu1": "10.0.0.11", "cache": "10.0.0.12", "client": "10.0.0.13"}


def deployment(**overrides: object) -> r.Deployment:
    base: dict[str, object] = {
        "tier": "cpu",
        "gpu_vendor": "nvidia",
        "engine": "vllm",
        "model": "Qwen/Qwen3-8B",
        "replicas": TWO_REPLICAS,
        "lmcache_address": "10.0.0.12",
        "lb_address": "10.0.0.12",
        "node_addresses": NODES,
    }
    base.update(overrides)
    return r.Deployment(**base)  # type: ignore[arg-type]


def check_golden(name: str, value: object) -> None:
    path = GOLDEN / f"{name}.json"
    text = json.dumps(value, indent=2, sort_keys=True) + "\n"
    if REGEN:
        path.write_text(text)
    assert path.exists(), f"missing golden {path}: run with KVOFFLOAD_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs; inspect, then regenerate with KVOFFLOAD_REGEN_GOLDEN=1"


@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
@pytest.mark.parametrize("tier", ["gpu", "cpu", "nvme"])
def test_vllm_engine_extravars_match_golden(vendor: str, tier: str) -> None:
    check_golden(f"vllm-{vendor}-{tier}", r.resolve(deployment(tier=tier, gpu_vendor=vendor)))


@pytest.mark.parametrize("tier", ["gpu", "cpu", "nvme"])
def test_sim_engine_single_replica_extravars_match_golden(tier: str) -> None:
    dep = deployment(
        tier=tier,
        engine="sim",
        sim_profile="tiny",
        replicas=TWO_REPLICAS[:1],
        lb_address=None,
        kv_cache_memory_bytes=268435456,
    )
    check_golden(f"sim-{tier}-1replica", r.resolve(dep))


def test_every_profile_passes_prefix_caching_and_prompt_token_details() -> None:
    for vendor in ("nvidia", "amd"):
        for tier in TIERS:
            args = r.engine_args(deployment(tier=tier, gpu_vendor=vendor))
            assert "--enable-prefix-caching" in args
            assert "--enable-prompt-tokens-details" in args


def test_offload_tiers_connect_to_the_one_lmcache_server() -> None:
    args = r.engine_args(deployment(tier="nvme"))
    config = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert config == {
        "kv_connector": "LMCacheMPConnector",
        # vLLM imports this module, so a broken LMCache fails loudly (no fallback to vLLM's own copy)
        "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "lmcache.mp.host": "tcp://10.0.0.12",
            "lmcache.mp.port": 5555,
            "lmcache.mp.mq_timeout": 300,
        },
    }
    assert "--kv-transfer-config" not in r.engine_args(deployment(tier="gpu"))


def test_nvme_l2_adapter_points_at_the_mount() -> None:
    dep = deployment(tier="nvme", nvme_mount="/srv/nvme/")
    # O_DIRECT files (fs_native), bounded with LRU eviction; the role adds max_capacity_gb from the mount
    assert r.l2_adapter(dep) == {
        "type": "fs_native",
        "base_path": "/srv/nvme/lmcache-l2",
        "use_odirect": True,
        "num_workers": 4,
        "eviction": {"eviction_policy": "LRU"},
    }
    out = r.resolve(dep)
    assert out["lmcache_server_l2_adapter"] == r.l2_adapter(dep)
    assert out["lmcache_server_l2_capacity_fraction"] == 0.9
    assert "--l2-adapter" not in r.lmcache_args(dep)
    assert r.l2_adapter(deployment(tier="cpu")) is None
    assert r.lmcache_args(deployment(tier="gpu")) == []


def test_lmcache_workers_cover_every_replica_and_metrics_are_on_the_http_port() -> None:
    many = tuple(r.Replica("gpu1", "10.0.0.11", i, str(i)) for i in range(8))
    dep = deployment(tier="cpu", replicas=many)
    args = r.lmcache_args(dep)
    assert args[args.index("--max-workers") + 1] == "8"  # LMCache: workers >= replicas served
    assert "--prometheus-port" not in args  # `lmcache server` ignores it
    assert args[args.index("--supported-transfer-mode") + 1] == "auto"
    # registered but never pinged (a replica pings from its first request on): reaped after two start
    # waves of the vllm role's health timeout and 5 minutes, not LMCache's hour
    assert args[args.index("--worker-registration-grace-seconds") + 1] == "2100"
    lmcache = next(t for t in r.metrics_targets(dep) if t["name"] == "lmcache")
    assert lmcache["url"] == "http://10.0.0.12:8080/metrics"
    two = r.lmcache_args(deployment(tier="cpu"))
    assert two[two.index("--max-workers") + 1] == "4"  # the profile's floor


@pytest.mark.parametrize(
    ("gpus", "workers"),
    [
        # two TP-4 replicas: 8 ranks, each its own LMCache client, so 8 threads (not 2, floored to 4)
        (("0,1,2,3", "4,5,6,7"), 8),
        # TP-2 x 3: 6 ranks
        (("0,1", "2,3", "4,5"), 6),
        # TP-1 unchanged: one rank per replica, the profile's floor of 4 below 4 replicas
        (("0", "1"), 4),
        (tuple(str(i) for i in range(6)), 6),
    ],
)
def test_lmcache_workers_count_tensor_parallel_ranks(gpus: tuple[str, ...], workers: int) -> None:
    replicas = tuple(r.Replica("gpu1", "10.0.0.11", i, g) for i, g in enumerate(gpus))
    for tier in ("cpu", "nvme"):
        dep = deployment(tier=tier, replicas=replicas)
        assert r.lmcache_workers(dep) == workers
        args = r.lmcache_args(dep)
        assert args[args.index("--max-workers") + 1] == str(workers)


def test_lmcache_args_leave_the_bind_to_the_role_and_clients_use_the_bound_address() -> None:
    # The lmcache_server role binds kvoffload_bind_address (the address lmcache_address is), never 0.0.0.0
    # by default; the resolver's flags carry no address for it to clash with.
    args = r.lmcache_args(deployment(tier="nvme"))
    assert "--host" not in args and "--http-host" not in args and "0.0.0.0" not in args
    out = r.resolve(deployment(tier="nvme"))
    assert {t["url"] for t in out["replay_metrics_targets"] if t["name"] in ("lmcache", "caddy")} == {
        "http://10.0.0.12:8080/metrics",
        "http://10.0.0.12:8101/metrics",
    }
    assert out["caddy_upstreams"] == ["10.0.0.11:8000", "10.0.0.11:8001"]


def test_l1_override_and_kv_cache_size_flags() -> None:
    dep = deployment(l1_size_gb=0.5, num_gpu_blocks_override=64)
    lm = r.lmcache_args(dep)
    assert lm[lm.index("--l1-size-gb") + 1] == "0.5"
    args = r.engine_args(dep)
    assert args[args.index("--num-gpu-blocks-override") + 1] == "64"
    assert "--kv-cache-memory-bytes" not in args


def test_single_replica_goes_direct_and_without_caddy() -> None:
    out = r.resolve(deployment(replicas=TWO_REPLICAS[1:], lb_address=None))
    assert out["replay_base_url"] == "http://10.0.0.11:8001"
    assert out["caddy_enabled"] is False
    assert all(t["name"] != "caddy" for t in out["replay_metrics_targets"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"replicas": ()}, "no vLLM replica"),
        ({"lmcache_address": None}, "needs the `lmcache` group"),
        ({"lb_address": None}, "need the `lb` group"),
        ({"engine": "sim"}, "sim_profile"),
        ({"model": "my model"}, "whitespace"),
        ({"kv_cache_memory_bytes": 1, "num_gpu_blocks_override": 2}, "not both"),
        ({"replicas": (r.Replica("h", "a", 0, "0"), r.Replica("h", "a", 0, "1"))}, "share a host and index"),
        ({"replicas": (r.Replica("h", "a", 0, "gpu0"),)}, "gpus"),
        ({"extra_engine_args": ("--foo", "it's")}, "single quote"),
        ({"extra_engine_args": ("--tensor-parallel-size", "2")}, r"extra_engine_args\[0\]: .*derived"),
    ],
)
def test_bad_deployments_are_refused_with_the_reason(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        r.resolve(deployment(**overrides))


def test_gpu_tier_has_no_lmcache_profile() -> None:
    with pytest.raises(UserError, match="no lmcache-server"):
        r.lmcache_profile("gpu")


def test_invalid_profile_names_the_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("description: x\nlb_policy: round_robin\n")
    with pytest.raises(UserError, match=r"(?s)bad\.yaml.*lb_policy"):
        r._load(bad, r.CaddyProfile)


def test_a_tensor_parallel_flag_in_an_engine_profile_is_refused_naming_the_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shipped = r.engine_profile("nvidia", "cpu")
    with_tp = shipped.model_copy(update={"args": [*shipped.args, "-tp", "2"]})
    monkeypatch.setattr(r, "engine_profile", lambda vendor, tier: with_tp)
    with pytest.raises(UserError, match=r"engine/nvidia-cpu\.yaml: args\[\d+\]: '-tp': .*derived"):
        r.resolve(deployment())


def test_the_registration_grace_follows_the_vllm_roles_health_timeout() -> None:
    defaults = yaml.safe_load(
        (Path(__file__).resolve().parents[3] / "roles" / "vllm" / "defaults" / "main.yml").read_text()
    )
    assert defaults["vllm_health_timeout"] == r.VLLM_HEALTH_TIMEOUT_S
    # LMCache refuses a grace below its reap timeout (120 s by default)
    assert r.LMCACHE_REGISTRATION_GRACE_S >= 120
