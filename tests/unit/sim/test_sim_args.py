"""Command lines of the simulated engine and cache server: vLLM/LMCache spellings, checks, capacity."""

from __future__ import annotations

import json

import pytest

from kvoffload.errors import UserError
from kvoffload.sim.cache_args import parse_cache_args
from kvoffload.sim.engine_args import LMCACHE_MP_MODULE, derive_capacity, derive_startup, parse_engine_args
from kvoffload.sim.profile import load_profile

LMCACHE = {
    "kv_connector": "LMCacheMPConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {
        "lmcache.mp.host": "tcp://10.0.0.5",
        "lmcache.mp.port": 5566,
        "lmcache.mp.mq_timeout": 30,
    },
}


def test_profile_flags_are_parsed_with_vllm_spelling() -> None:
    flags = [
        "Qwen/Qwen3-8B",
        "--host",
        "0.0.0.0",
        "--port",
        "8001",
        "--served-model-name",
        "q",
        "--block-size",
        "16",
        "--gpu-memory-utilization",
        "0.85",
        "--max-model-len",
        "32768",
        "--max-num-seqs",
        "128",
        "--max-num-batched-tokens",
        "4096",
        "--enable-prefix-caching",
        "--tensor-parallel-size",
        "1",
        "--enable-prompt-tokens-details",
        "--dtype",
        "bfloat16",
        "--enforce-eager",
        "--sim-profile",
        "h100-llama-8b",
    ]
    args = parse_engine_args([*flags, "--kv-transfer-config", json.dumps(LMCACHE)])
    assert args.served_model_names == ("q",)
    assert args.max_model_len == 32768 and args.max_num_seqs == 128
    assert args.connector is not None
    assert (args.connector.host, args.connector.port, args.connector.mq_timeout_s) == ("10.0.0.5", 5566, 30.0)
    assert set(args.ignored) == {"--dtype"}
    assert args.enforce_eager  # modelled: no graph capture at start-up
    assert args.connector.module_path == LMCACHE_MP_MODULE


def test_kv_connector_module_path_is_the_lmcache_module_or_refused() -> None:
    cfg = {**LMCACHE, "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector"}
    args = parse_engine_args(["m", "--kv-transfer-config", json.dumps(cfg)])
    assert args.connector is not None and args.connector.module_path == LMCACHE_MP_MODULE
    other = {**LMCACHE, "kv_connector_module_path": "my.own.connector"}
    with pytest.raises(UserError, match=r"kv_connector_module_path 'my\.own\.connector'"):
        parse_engine_args(["m", "--kv-transfer-config", json.dumps(other)])


@pytest.mark.parametrize(
    "argv",
    [
        ["m", "--gpu-memory-utilization", "1.5"],
        ["m", "--block-size", "17"],
        ["m", "--max-num-seqs", "0"],
        ["m", "--kv-transfer-config", "{not json"],
        ["m", "--no-such-flag"],
        ["m", "--sim-model-load-s", "-1"],
        ["m", "--sim-graph-capture-s", "nan"],
    ],
)
def test_invalid_values_exit_like_vllm(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_engine_args(argv)
    assert exc.value.code == 2


def test_unmodelled_connector_is_refused() -> None:
    with pytest.raises(UserError, match="kv_connector"):
        parse_engine_args(["m", "--kv-transfer-config", '{"kv_connector": "NixlConnector"}'])


def test_capacity_from_memory_and_overrides() -> None:
    h100 = load_profile("h100-llama-8b")
    cap = derive_capacity(parse_engine_args(["m", "--gpu-memory-utilization", "0.9"]), h100)
    expected = int((79.6 * 0.9 - 14.96 - 2.0) * 2**30) // (131072 * 16)
    assert cap.num_gpu_blocks == expected
    assert cap.max_model_len == 131072
    small = derive_capacity(
        parse_engine_args(["m", "--kv-cache-memory-bytes", "2GiB", "--max-model-len", "8192"]), h100
    )
    assert small.num_gpu_blocks == 2 * 2**30 // (131072 * 16)
    override = derive_capacity(
        parse_engine_args(["m", "--num-gpu-blocks-override", "600", "--max-model-len", "8192"]), h100
    )
    assert override.num_gpu_blocks == 600


def test_capacity_must_hold_one_max_len_request() -> None:
    with pytest.raises(UserError, match="max seq len"):
        derive_capacity(
            parse_engine_args(["m", "--num-gpu-blocks-override", "10", "--max-model-len", "8192"]),
            load_profile("tiny"),
        )


# The lmcache-0.5.6-cpu capture's server command line (tests/fixtures/lmcache-0.5.6-cpu/README.md).
REAL_SERVER = [
    "--host", "127.0.0.1", "--port", "5555", "--http-host", "127.0.0.1", "--http-port", "8080",
    "--l1-size-gb", "0.01", "--eviction-policy", "LRU", "--chunk-size", "256",
    "--supported-transfer-mode", "auto",
    "--l2-adapter", '{"type":"fs_native","base_path":"/tmp/lmc/l2","num_workers":2,"use_odirect":true}',
]  # fmt: skip


def test_the_real_servers_command_line_is_accepted() -> None:
    args = parse_cache_args(REAL_SERVER)
    assert (args.l1_size_gb, args.chunk_size, args.supported_transfer_mode) == (0.01, 256, "auto")
    (l2,) = args.l2_adapters
    assert (l2.type_name, l2.base_path, l2.num_workers) == ("fs_native", "/tmp/lmc/l2", 2)
    assert l2.use_odirect
    assert (l2.max_capacity_gb, l2.eviction, l2.persist_enabled) == (0.0, None, True)
    assert args.ignored == ()


def test_cache_server_defaults_follow_lmcache() -> None:
    args = parse_cache_args(["--l1-size-gb", "1", "--eviction-policy", "ARC"])
    assert (args.host, args.port, args.http_host, args.http_port) == ("localhost", 5555, "127.0.0.1", 8080)
    assert (args.eviction_trigger_watermark, args.eviction_ratio) == (0.8, 0.2)
    assert args.supported_transfer_mode == "lmcache_driven"
    with pytest.raises(SystemExit):
        parse_cache_args(["--l1-size-gb", "1", "--eviction-policy", "LRU", "--supported-transfer-mode", "x"])


def test_cache_server_flags_and_fs_adapter() -> None:
    flags = [
        "--host",
        "0.0.0.0",
        "--port",
        "5555",
        "--chunk-size",
        "256",
        "--l1-size-gb",
        "8",
        "--eviction-policy",
        "LRU",
        "--eviction-trigger-watermark",
        "0.9",
        "--eviction-ratio",
        "0.1",
        "--http-port",
        "8080",
        "--max-workers",
        "4",
    ]
    spec = {
        "type": "fs_native",
        "base_path": "/mnt/nvme/l2",
        "max_capacity_gb": 100,
        "use_odirect": True,
        "num_workers": 4,
        "eviction": {"eviction_policy": "LRU"},
    }
    args = parse_cache_args([*flags, "--l2-adapter", json.dumps(spec)])
    assert args.l1_size_gb == 8 and args.eviction_trigger_watermark == 0.9
    (l2,) = args.l2_adapters
    assert (l2.base_path, l2.max_capacity_gb, l2.num_workers) == ("/mnt/nvme/l2", 100.0, 4)
    assert l2.eviction is not None
    assert (l2.eviction.eviction_policy, l2.eviction.trigger_watermark, l2.eviction.eviction_ratio) == (
        "LRU",
        0.8,
        0.2,
    )
    fs = parse_cache_args([*flags, "--l2-adapter", '{"type": "fs", "base_path": "/x"}']).l2_adapters[0]
    assert (fs.type_name, fs.num_workers, fs.max_capacity_gb) == ("fs", None, 0.0)
    assert args.ignored == ("--max-workers",)


def test_cache_server_requires_l1_size_and_policy() -> None:
    with pytest.raises(SystemExit):
        parse_cache_args(["--l1-size-gb", "1"])


@pytest.mark.parametrize(
    "spec",
    [
        '{"type": "s3", "base_path": "x"}',
        '{"type": "fs"}',
        '{"type": "fs", "base_path": "x", "bogus": 1}',
        # fs has no capacity in LMCache 0.5.6, and recover_on_start is no key of either adapter
        '{"type": "fs", "base_path": "x", "max_capacity_gb": 1}',
        '{"type": "fs_native", "base_path": "x", "recover_on_start": true}',
        '{"type": "fs_native", "base_path": "x", "num_workers": 0}',
        '{"type": "fs_native", "base_path": "x", "eviction": {"eviction_policy": "FIFO"}}',
    ],
)
def test_bad_l2_adapter_is_refused(spec: str) -> None:
    with pytest.raises(UserError, match="--l2-adapter"):
        parse_cache_args(["--l1-size-gb", "1", "--eviction-policy", "LRU", "--l2-adapter", spec])


def test_startup_comes_from_the_profile_each_part_overridable_and_eager_skips_capture() -> None:
    profile = load_profile("h200-llama-8b-cited")
    assert profile.provenance.startup is not None
    plan = derive_startup(parse_engine_args(["m"]), profile)
    assert (plan.model_load_s, plan.graph_capture_s) == (
        profile.startup.model_load_s,
        profile.startup.graph_capture_s,
    )
    assert plan.total_s > 0
    assert plan.model_load_source == f"profile h200-llama-8b-cited, {profile.provenance.startup.source}"
    plan = derive_startup(parse_engine_args(["m", "--sim-model-load-s", "45"]), profile)
    assert (plan.model_load_s, plan.model_load_source) == (45.0, "--sim-model-load-s")
    assert plan.graph_capture_s == profile.startup.graph_capture_s
    plan = derive_startup(
        parse_engine_args(["m", "--sim-graph-capture-s", "15", "--sim-model-load-s", "0"]), profile
    )
    assert (plan.model_load_s, plan.graph_capture_s) == (0.0, 15.0)
    plan = derive_startup(parse_engine_args(["m", "--enforce-eager", "--sim-graph-capture-s", "15"]), profile)
    assert plan.graph_capture_s == 0.0 and plan.model_load_s == profile.startup.model_load_s


def test_tiny_starts_at_once() -> None:
    plan = derive_startup(parse_engine_args(["m"]), load_profile("tiny"))
    assert plan.total_s == 0.0
