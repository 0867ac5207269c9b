"""Command line of the simulated cache server: `lmcache server`'s flags, spelled like LMCache 0.5.6.

Modelled flags become `CacheArgs`; other flags of `lmcache server` are accepted and logged as ignored;
unknown ones are rejected by argparse (exit status 2). Flag names, choices and defaults follow
`lmcache/v1/multiprocess/config.py` and `lmcache/v1/distributed/config.py` of the 0.5.6 wheel. The
`--l2-adapter` JSON follows that wheel's adapter configs (`l2_adapters/config.py`,
`fs_l2_adapter.py`, `fs_native_l2_adapter.py`): keys common to every adapter (`affinity_tag`,
`shared`, `eviction`, `persist_enabled`) plus the type's own. LMCache ignores keys it does not know;
the simulator refuses them, so that a typo fails on the simulator instead of being silently dropped.
Two flags are the simulator's own: `--sim-profile` (disk bandwidth) and `--sim-l2-scale` (how much
smaller the files are than the KV they stand for). No IO.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass
from typing import Any

from kvoffload.errors import UserError
from kvoffload.sim.args_common import add_ignored_flags, args_from, checked_type, json_number, log_ignored
from kvoffload.sim.profile import DEFAULT_PROFILE

log = logging.getLogger(__name__)

DEFAULT_L2_SCALE = 64
EVICTION_POLICIES = ("LRU", "ARC", "IsolatedLRU", "noop")
TRANSFER_MODES = ("lmcache_driven", "engine_driven", "auto")

IGNORED_VALUE_FLAGS = (
    "--instance-id", "--max-workers", "--max-gpu-workers", "--max-cpu-workers", "--hash-algorithm",
    "--engine-type", "--runtime-plugin-config", "--shm-name",
    "--worker-reap-timeout-seconds", "--worker-registration-grace-seconds", "--l1-init-size-gb",
    "--l1-align-bytes", "--l1-write-ttl-seconds", "--l1-read-ttl-seconds", "--l2-store-policy",
    "--l2-prefetch-policy", "--l2-prefetch-max-in-flight", "--prometheus-port", "--coordinator-url",
    "--trace-level", "--trace-output",
)  # fmt: skip
IGNORED_BOOL_FLAGS = ("--l1-use-lazy", "--no-l1-use-lazy", "--separate-object-groups")

# Keys every adapter type takes (parse_args_to_l2_adapters_config), then each modelled type's own.
_COMMON_KEYS = {"type", "affinity_tag", "shared", "eviction", "persist_enabled"}
_TYPE_KEYS = {
    "fs": {"base_path", "relative_tmp_dir", "read_ahead_size", "use_odirect"},
    "fs_native": {
        "base_path", "num_workers", "relative_tmp_dir", "use_odirect", "read_ahead_size", "max_capacity_gb",
    },
}  # fmt: skip
# What `GET /status` names each adapter type (report_status of the real adapters).
STATUS_TYPE = {"fs": "FSL2Adapter", "fs_native": "FSNativeL2Adapter"}
FS_NATIVE_DEFAULT_WORKERS = 4


@dataclass(frozen=True)
class L2Eviction:
    """The optional `"eviction": {...}` block of an adapter: without it LMCache never evicts from L2."""

    eviction_policy: str
    trigger_watermark: float
    eviction_ratio: float


@dataclass(frozen=True)
class FsAdapter:
    """One `--l2-adapter '{"type": "fs"|"fs_native", ...}'`."""

    type_name: str
    base_path: str
    use_odirect: bool
    # GiB; 0 = no capacity. Only fs_native has it, and only an `eviction` block makes it a bound.
    max_capacity_gb: float
    num_workers: int | None
    read_ahead_size: int | None
    relative_tmp_dir: str
    eviction: L2Eviction | None
    persist_enabled: bool


@dataclass(frozen=True)
class CacheArgs:
    """The flags the simulated cache server models (a field without its own line in `parse_cache_args` is
    its flag)."""

    host: str
    port: int
    chunk_size: int
    l1_size_gb: float
    eviction_policy: str
    eviction_trigger_watermark: float
    eviction_ratio: float
    l2_adapters: tuple[FsAdapter, ...]
    http_host: str
    http_port: int
    supported_transfer_mode: str
    sim_profile: str
    sim_l2_scale: int
    ignored: tuple[str, ...]


_fraction = checked_type(
    "_fraction", float, lambda v: not 0.0 <= v <= 1.0, "must be between 0.0 and 1.0, got {}"
)
_positive_float = checked_type("_positive_float", float, lambda v: v <= 0, "must be > 0, got {}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lmcache server",
        usage="lmcache server --l1-size-gb GB --eviction-policy LRU [options]",
        description="Simulated LMCache MP cache server (docs/simulator.md).",
    )
    p.add_argument("--host", default="localhost")
    p.add_argument("--port", type=int, default=5555)
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--l1-size-gb", type=_positive_float, required=True)
    p.add_argument("--eviction-policy", choices=EVICTION_POLICIES, required=True)
    p.add_argument("--eviction-trigger-watermark", type=_fraction, default=0.8)
    p.add_argument("--eviction-ratio", type=_fraction, default=0.2)
    p.add_argument("--l2-adapter", action="append", default=[], help="L2 adapter JSON (repeatable)")
    p.add_argument("--http-host", default="127.0.0.1")
    p.add_argument("--http-port", type=int, default=8080)
    # Accepted with LMCache's choices: the simulated engines' transfer path does not depend on it.
    p.add_argument("--supported-transfer-mode", choices=TRANSFER_MODES, default="lmcache_driven")
    p.add_argument(
        "--sim-profile", default=DEFAULT_PROFILE, help="simulator only: cost profile (disk bandwidth)"
    )
    p.add_argument(
        "--sim-l2-scale",
        type=int,
        default=DEFAULT_L2_SCALE,
        help="simulator only: L2 files are this many times smaller than the KV bytes they stand for",
    )
    add_ignored_flags(p, IGNORED_VALUE_FLAGS, IGNORED_BOOL_FLAGS)
    return p


def _positive_int(spec: dict[str, Any], key: str) -> int | None:
    value = spec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UserError(f"--l2-adapter: {key} must be a positive integer, got {value!r}")
    return value


def _flag(spec: dict[str, Any], key: str, default: bool) -> bool:
    value = spec.get(key, default)
    if not isinstance(value, bool):
        raise UserError(f"--l2-adapter: {key} must be a boolean, got {value!r}")
    return value


def _eviction(spec: dict[str, Any]) -> L2Eviction | None:
    block = spec.get("eviction")
    if block is None:
        return None
    if not isinstance(block, dict):
        raise UserError("--l2-adapter: eviction must be a JSON object")
    unknown = set(block) - {"eviction_policy", "trigger_watermark", "eviction_ratio"}
    if unknown:
        raise UserError(f"--l2-adapter: unknown eviction key(s) {', '.join(sorted(unknown))}")
    policy = block.get("eviction_policy")
    if policy not in EVICTION_POLICIES:
        raise UserError(
            f"--l2-adapter: eviction.eviction_policy must be one of {', '.join(EVICTION_POLICIES)}, "
            f"got {policy!r}"
        )
    bad = "--l2-adapter: eviction.trigger_watermark and eviction_ratio must be numbers"
    watermark = json_number(block, "trigger_watermark", 0.8, float, bad)
    ratio = json_number(block, "eviction_ratio", 0.2, float, bad)
    return L2Eviction(str(policy), watermark, ratio)


def _adapter(text: str) -> FsAdapter:
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"--l2-adapter {text!r}: not valid JSON ({exc})") from exc
    if not isinstance(spec, dict):
        raise UserError(f"--l2-adapter {text!r}: must be a JSON object")
    kind = spec.get("type")
    if kind not in _TYPE_KEYS:
        raise UserError(
            f"--l2-adapter: type {kind!r} is not modelled by the simulator; use 'fs' or 'fs_native'"
        )
    unknown = set(spec) - _COMMON_KEYS - _TYPE_KEYS[kind]
    if unknown:
        raise UserError(
            f"--l2-adapter: key(s) {', '.join(sorted(unknown))} are not keys of LMCache 0.5.6's {kind} "
            f"adapter (it takes {', '.join(sorted(_TYPE_KEYS[kind] | _COMMON_KEYS))})"
        )
    base = spec.get("base_path")
    if not isinstance(base, str) or not base:
        raise UserError("--l2-adapter: base_path must be a non-empty string")
    cap = spec.get("max_capacity_gb", 0)
    if isinstance(cap, bool) or not isinstance(cap, int | float) or cap < 0:
        raise UserError("--l2-adapter: max_capacity_gb must be a non-negative number")
    tmp = spec.get("relative_tmp_dir") or ""
    if not isinstance(tmp, str):
        raise UserError("--l2-adapter: relative_tmp_dir must be a string")
    eviction = _eviction(spec)
    workers = _positive_int(spec, "num_workers")
    if kind == "fs_native":
        workers = workers or FS_NATIVE_DEFAULT_WORKERS
        if cap > 0 and eviction is None:
            # LMCache 0.5.6 logs the same: the capacity is accounted, never enforced.
            log.warning(
                "fs_native: max_capacity_gb=%s is declared for %s but no 'eviction' block is configured, "
                "so it is used for usage accounting only and will NOT bound disk usage. Add an eviction "
                'block to enforce it, e.g. "eviction": {"eviction_policy": "LRU"}.',
                cap,
                base,
            )
    return FsAdapter(
        type_name=str(kind),
        base_path=base,
        use_odirect=_flag(spec, "use_odirect", False),
        max_capacity_gb=float(cap),
        num_workers=workers,
        read_ahead_size=_positive_int(spec, "read_ahead_size"),
        relative_tmp_dir=tmp,
        eviction=eviction,
        persist_enabled=_flag(spec, "persist_enabled", True),
    )


def parse_cache_args(argv: list[str]) -> CacheArgs:
    ns = build_parser().parse_args(argv)
    if ns.chunk_size <= 0:
        raise UserError(f"--chunk-size {ns.chunk_size}: must be a positive number of tokens")
    if ns.sim_l2_scale < 1:
        raise UserError(f"--sim-l2-scale {ns.sim_l2_scale}: must be >= 1")
    if ns.eviction_policy in ("ARC", "IsolatedLRU"):
        log.info("--eviction-policy %s is modelled as LRU", ns.eviction_policy)
    ignored = log_ignored(ns, log, "lmcache server")
    return args_from(CacheArgs, ns, l2_adapters=tuple(_adapter(a) for a in ns.l2_adapter), ignored=ignored)
