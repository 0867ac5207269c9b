"""Command line of the simulated engine: `vllm serve`'s flags, spelled and validated like vLLM does.

Flags the simulator models are parsed into `EngineArgs`. Other flags that `vllm serve` accepts are
accepted and logged as ignored (`IGNORED_VALUE_FLAGS`, `IGNORED_BOOL_FLAGS`); anything else is
rejected the way argparse rejects it in vLLM ("unrecognized arguments", exit status 2). Capacity and
limit checks that vLLM does at start-up live in `derive_capacity`; how long the start-up takes (the
profile's `startup` figures, or the simulator-only `--sim-model-load-s` / `--sim-graph-capture-s`, and
`--enforce-eager`, which skips graph capture as in vLLM) in `derive_startup`. No IO, no networking.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from dataclasses import dataclass
from typing import Any

from kvoffload.errors import UserError
from kvoffload.sim.args_common import add_ignored_flags, args_from, checked_type, json_number, log_ignored
from kvoffload.sim.profile import DEFAULT_PROFILE, CostProfile

log = logging.getLogger(__name__)

# `vllm serve` flags with a value that the simulator accepts but does not model.
IGNORED_VALUE_FLAGS = (
    "--dtype",
    "--seed",
    "--tokenizer",
    "--tokenizer-mode",
    "--revision",
    "--tokenizer-revision",
    "--download-dir",
    "--load-format",
    "--quantization",
    "--kv-cache-dtype",
    "--swap-space",
    "--cpu-offload-gb",
    "--pipeline-parallel-size",
    "--data-parallel-size",
    "--distributed-executor-backend",
    "--compilation-config",
    "-O",
    "--uvicorn-log-level",
    "--api-key",
    "--generation-config",
    "--override-generation-config",
    "--max-logprobs",
    "--reasoning-parser",
    "--tool-call-parser",
    "--chat-template",
    "--limit-mm-per-prompt",
    "--prefix-caching-hash-algo",
    "--kv-offloading-size",
    "--kv-offloading-backend",
    "--max-num-partial-prefills",
    "--long-prefill-token-threshold",
    "--scheduling-policy",
    "--hf-overrides",
    "--root-path",
    "--allowed-origins",
    "--response-role",
    "--config",
    "--worker-extension-cls",
    "--max-seq-len-to-capture",
    "--speculative-config",
    "--model-impl",
    "--mm-processor-kwargs",
    "--hf-config-path",
    "--served-model-name-alias",
    "--max-loras",
    "--max-lora-rank",
    "--lora-modules",
    "--stream-interval",
    "--kv-events-config",
    "--attention-backend",
    "--performance-mode",
    "--cuda-graph-sizes",
    "--max-cudagraph-capture-size",
)
# `vllm serve` boolean flags that the simulator accepts but does not model.
IGNORED_BOOL_FLAGS = (
    "--trust-remote-code",
    "--disable-log-requests",
    "--disable-log-stats",
    "--enable-log-requests",
    "--enable-chunked-prefill",
    "--no-enable-chunked-prefill",
    "--enable-auto-tool-choice",
    "--disable-custom-all-reduce",
    "--enable-expert-parallel",
    "--async-scheduling",
    "--no-async-scheduling",
    "--enable-request-id-headers",
    "--disable-fastapi-docs",
    "--disable-frontend-multiprocessing",
    "--enable-lora",
    "--enable-server-load-tracking",
    "--enable-force-include-usage",
    "--disable-uvicorn-access-log",
    "--enable-sleep-mode",
    "--skip-tokenizer-init",
    "--enable-log-outputs",
)

_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
_CONNECTORS = ("LMCacheMPConnector",)
# Where vLLM 0.32 loads LMCacheMPConnector from (its log: "Using external LMCacheMPConnector from ...").
LMCACHE_MP_MODULE = "lmcache.integration.vllm.lmcache_mp_connector"
_KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")


class VllmArgumentParser(argparse.ArgumentParser):
    """argparse that reports errors as vLLM's CLI does (prog `vllm serve`, exit status 2)."""


_positive_int = checked_type("_positive_int", int, lambda v: v <= 0, "must be a positive integer, got {}")
_utilization = checked_type("_utilization", float, lambda v: not 0.0 < v <= 1.0, "must be in (0, 1], got {}")
_seconds = checked_type(
    "_seconds",
    float,
    lambda v: not math.isfinite(v) or v < 0,
    "must be a number of seconds >= 0, got {}",
)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _memory_bytes(text: str) -> int:
    """vLLM accepts plain bytes or a human size such as 2GiB / 512M."""
    units = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
    t = text.strip().lower().removesuffix("b")
    suffix = next((s for s in sorted(units, key=len, reverse=True) if t.endswith(s)), "")
    value = float(t[: len(t) - len(suffix)]) * units.get(suffix, 1.0)
    if not math.isfinite(value) or value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive size")
    return int(value)


def build_parser() -> VllmArgumentParser:
    p = VllmArgumentParser(
        prog="vllm serve",
        usage="vllm serve MODEL [options]",
        description="Simulated vLLM OpenAI-compatible server (docs/simulator.md).",
    )
    p.add_argument("model_tag", nargs="?", default=None, help="model name or path")
    p.add_argument("--model", default=None, help="model name or path (instead of the positional)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--block-size", type=int, choices=_BLOCK_SIZES, default=16)
    p.add_argument("--gpu-memory-utilization", type=_utilization, default=0.9)
    p.add_argument("--kv-cache-memory-bytes", type=_memory_bytes, default=None)
    p.add_argument("--num-gpu-blocks-override", type=_positive_int, default=None)
    p.add_argument("--max-model-len", type=_memory_bytes, default=None)
    p.add_argument("--max-num-seqs", type=_positive_int, default=256)
    p.add_argument("--max-num-batched-tokens", type=_positive_int, default=8192)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--tensor-parallel-size", "-tp", type=_positive_int, default=1)
    p.add_argument("--kv-transfer-config", type=_json_object, default=None)
    p.add_argument("--enable-prompt-tokens-details", action="store_true")
    p.add_argument("--enable-per-request-metrics", action="store_true")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs: start-up skips capture")
    p.add_argument(
        "--sim-profile",
        default=DEFAULT_PROFILE,
        help="simulator only: cost profile name (kvoffload/profiles/sim) or path to a profile YAML",
    )
    p.add_argument(
        "--sim-model-load-s",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="simulator only: start-up weight load time, instead of the profile's startup.model_load_s",
    )
    p.add_argument(
        "--sim-graph-capture-s",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="simulator only: start-up compile + graph capture time, instead of the profile's "
        "startup.graph_capture_s (0 under --enforce-eager whatever is given)",
    )
    add_ignored_flags(p, IGNORED_VALUE_FLAGS, IGNORED_BOOL_FLAGS)
    return p


@dataclass(frozen=True)
class ConnectorConfig:
    """LMCacheMPConnector settings from `--kv-transfer-config`."""

    host: str
    port: int
    mq_timeout_s: float
    kv_role: str
    module_path: str


@dataclass(frozen=True)
class EngineArgs:
    """The flags the simulator models (a field without its own line in `parse_engine_args` is its flag)."""

    model: str
    served_model_names: tuple[str, ...]
    host: str
    port: int
    block_size: int
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    num_gpu_blocks_override: int | None
    max_model_len: int | None
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool
    tensor_parallel_size: int
    connector: ConnectorConfig | None
    enable_prompt_tokens_details: bool
    enable_per_request_metrics: bool
    sim_profile: str
    ignored: tuple[str, ...]
    enforce_eager: bool = False
    sim_model_load_s: float | None = None
    sim_graph_capture_s: float | None = None


def _connector(cfg: dict[str, Any] | None) -> ConnectorConfig | None:
    if cfg is None:
        return None
    name = cfg.get("kv_connector")
    if name not in _CONNECTORS:
        raise UserError(
            f"--kv-transfer-config: kv_connector {name!r} is not modelled by the simulator; "
            f"use one of {', '.join(_CONNECTORS)} or drop the flag"
        )
    module = cfg.get("kv_connector_module_path", LMCACHE_MP_MODULE)
    if module != LMCACHE_MP_MODULE:
        raise UserError(
            f"--kv-transfer-config: kv_connector_module_path {module!r} is not modelled by the simulator; "
            f"{name} comes from {LMCACHE_MP_MODULE} (or leave the key out)"
        )
    role = cfg.get("kv_role", "kv_both")
    if role not in _KV_ROLES:
        raise UserError(f"--kv-transfer-config: kv_role {role!r} must be one of {', '.join(_KV_ROLES)}")
    extra = cfg.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise UserError("--kv-transfer-config: kv_connector_extra_config must be a JSON object")
    host = str(extra.get("lmcache.mp.host", "tcp://localhost"))
    host = host.split("://", 1)[-1]
    bad = "--kv-transfer-config: lmcache.mp.port must be an int and lmcache.mp.mq_timeout a number"
    port = json_number(extra, "lmcache.mp.port", 5555, int, bad)
    timeout = json_number(extra, "lmcache.mp.mq_timeout", 300, float, bad)
    log.info("Using external %s from %s", name, module)
    return ConnectorConfig(host=host, port=port, mq_timeout_s=timeout, kv_role=str(role), module_path=module)


def parse_engine_args(argv: list[str]) -> EngineArgs:
    """Parse `vllm serve` arguments; argparse errors exit with status 2 like vLLM's CLI."""
    ns = build_parser().parse_args(argv)
    model = ns.model or ns.model_tag
    if not model:
        raise UserError("sim serve: give the model as the first argument (or --model), as for vllm serve")
    ignored = log_ignored(ns, log, "vllm serve")
    return args_from(
        EngineArgs,
        ns,
        model=model,
        served_model_names=tuple(ns.served_model_name or [model]),
        connector=_connector(ns.kv_transfer_config),
        ignored=ignored,
    )


@dataclass(frozen=True)
class Capacity:
    """What vLLM would compute at start-up: KV cache size and the resolved limits."""

    num_gpu_blocks: int
    kv_cache_memory_bytes: int
    max_model_len: int

    def tokens(self, block_size: int) -> int:
        return self.num_gpu_blocks * block_size


def derive_capacity(args: EngineArgs, profile: CostProfile) -> Capacity:
    """KV blocks from memory (or the overrides), with vLLM's start-up checks."""
    gib = float(2**30)
    tp = args.tensor_parallel_size
    per_token = profile.model.kv_bytes_per_token
    block_bytes = per_token * args.block_size
    if args.kv_cache_memory_bytes is not None:
        kv_bytes = args.kv_cache_memory_bytes
    else:
        # Weights are split across tensor-parallel ranks; each rank keeps its share of the KV heads.
        per_gpu = (
            profile.hardware.gpu_memory_gib * args.gpu_memory_utilization
            - profile.model.weights_gib / tp
            - profile.model.runtime_overhead_gib
        )
        kv_bytes = int(per_gpu * gib) * tp
        if kv_bytes <= 0:
            raise UserError(
                "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                f"(--gpu-memory-utilization {args.gpu_memory_utilization} on a "
                f"{profile.hardware.gpu_memory_gib} GiB device with {profile.model.weights_gib} GiB weights)"
            )
    num_blocks = args.num_gpu_blocks_override or kv_bytes // block_bytes
    if num_blocks <= 0:
        raise UserError(
            f"--kv-cache-memory-bytes {kv_bytes} holds no {args.block_size}-token block "
            f"({block_bytes} bytes each); give more memory"
        )
    max_model_len = args.max_model_len or profile.model.max_model_len
    if max_model_len > profile.model.max_model_len:
        raise UserError(
            f"--max-model-len {max_model_len} exceeds the model's maximum {profile.model.max_model_len} "
            f"(profile {profile.name}, model.max_model_len)"
        )
    if num_blocks * args.block_size < max_model_len:
        raise UserError(
            f"To serve at least one request with the model's max seq len ({max_model_len}), "
            f"{max_model_len * per_token / gib:.2f} GiB KV cache is needed, which is larger than the "
            f"available KV cache memory ({num_blocks * block_bytes / gib:.2f} GiB). Try increasing "
            "`gpu_memory_utilization` / --kv-cache-memory-bytes or decreasing `max_model_len`."
        )
    return Capacity(num_gpu_blocks=num_blocks, kv_cache_memory_bytes=kv_bytes, max_model_len=max_model_len)


@dataclass(frozen=True)
class StartupPlan:
    """How long the simulated start-up takes before the API server listens, and where each figure is from."""

    model_load_s: float
    graph_capture_s: float
    model_load_source: str
    graph_capture_source: str

    @property
    def total_s(self) -> float:
        return self.model_load_s + self.graph_capture_s


def derive_startup(args: EngineArgs, profile: CostProfile) -> StartupPlan:
    """The profile's `startup` figures, each overridden by its `--sim-...-s` flag; no capture when eager."""
    prov = profile.provenance.startup
    cited = f"profile {profile.name}, {prov.source}" if prov is not None else f"profile {profile.name}"
    if args.sim_model_load_s is not None:
        load, load_src = args.sim_model_load_s, "--sim-model-load-s"
    else:
        load, load_src = profile.startup.model_load_s, cited
    if args.enforce_eager:
        capture, capture_src = 0.0, "--enforce-eager (no CUDA graphs)"
    elif args.sim_graph_capture_s is not None:
        capture, capture_src = args.sim_graph_capture_s, "--sim-graph-capture-s"
    else:
        capture, capture_src = profile.startup.graph_capture_s, cited
    return StartupPlan(load, capture, load_src, capture_src)
