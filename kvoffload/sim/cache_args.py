"""Command line of the simulated cache server: `lmcache server`'s flags, spelled like LMCache does.

Modelled flags become `CacheArgs`; other flags of `lmcache server` are accepted and logged as ignored;
unknown ones are rejected by argparse (exit status 2). Flag names and defaults follow
`lmcache/v1/multiprocess/config.py` and `lmcache/v1/distributed/config.py` in LMCache; the fs adapter
JSON follows `FSL2AdapterConfig` (`base_path`, `relative_tmp_dir`, `read_ahead_size`, `use_odirect`,
`max_capacity_gb`, `recover_on_start`). Two flags are the simulator's own: `--sim-profile` (disk
bandwidth) and `--sim-l2-scale` (how much smaller the files are than the KV they stand for).
No IO.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass

from kvoffload.errors import UserError
from kvoffload.sim.ignored_flags import add_ignored_flags, log_ignored
from kvoffload.sim.profile import DEFAULT_PROFILE

log = logging.getLogger(__name__)

DEFAULT_L2_SCALE = 64

IGNORED_VALUE_FLAGS = (
    "--instance-id", "--max-workers", "--max-gpu-workers", "--max-cpu-workers", "--hash-algorithm",
    "--engine-type", "--supported-transfer-mode", "--runtime-plugin-config", "--shm-name",
    "--worker-reap-timeout-seconds", "--worker-registration-grace-seconds", "--l1-init-size-gb",
    "--l1-align-bytes", "--l1-write-ttl-seconds", "--l1-read-ttl-seconds", "--l2-store-policy",
    "--l2-prefetch-policy", "--l2-prefetch-max-in-flight", "--prometheus-port", "--coordinator-url",
    "--trace-level", "--trace-output", "--log-level",
)  # fmt: skip
IGNORED_BOOL_FLAGS = ("--l1-use-lazy", "--no-l1-use-lazy", "--disable-prometheus", "--separate-object-groups")
_FS_KEYS = {"type", "base_path", "relative_tmp_dir", "read_ahead_size", "use_odirect", "max_capacity_gb",
            "recover_on_start", "eviction", "num_workers"}  # fmt: skip


@dataclass(frozen=True)
class FsAdapter:
    """One `--l2-adapter '{"type": "fs"|"fs_native", ...}'`."""

    type_name: str
    base_path: str
    use_odirect: bool
    max_capacity_gb: float
    recover_on_start: bool


@dataclass(frozen=True)
class CacheArgs:
    """The flags the simulated cache server models."""

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
    sim_profile: str
    sim_l2_scale: int
    ignored: tuple[str, ...]


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0.0 and 1.0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


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
    p.add_argument("--eviction-policy", choices=["LRU", "IsolatedLRU", "noop"], required=True)
    p.add_argument("--eviction-trigger-watermark", type=_fraction, default=0.8)
    p.add_argument("--eviction-ratio", type=_fraction, default=0.2)
    p.add_argument("--l2-adapter", action="append", default=[], help="L2 adapter JSON (repeatable)")
    p.add_argument("--http-host", default="0.0.0.0")
    p.add_argument("--http-port", type=int, default=8080)
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


def _adapter(text: str) -> FsAdapter:
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"--l2-adapter {text!r}: not valid JSON ({exc})") from exc
    if not isinstance(spec, dict):
        raise UserError(f"--l2-adapter {text!r}: must be a JSON object")
    kind = spec.get("type")
    if kind not in ("fs", "fs_native"):
        raise UserError(
            f"--l2-adapter: type {kind!r} is not modelled by the simulator; use 'fs' or 'fs_native'"
        )
    unknown = set(spec) - _FS_KEYS
    if unknown:
        raise UserError(f"--l2-adapter: unknown key(s) {', '.join(sorted(unknown))} for type {kind}")
    base = spec.get("base_path")
    if not isinstance(base, str) or not base:
        raise UserError("--l2-adapter: base_path must be a non-empty string")
    cap = spec.get("max_capacity_gb", 0)
    if isinstance(cap, bool) or not isinstance(cap, int | float) or cap < 0:
        raise UserError("--l2-adapter: max_capacity_gb must be a non-negative number")
    odirect = spec.get("use_odirect", False)
    recover = spec.get("recover_on_start", True)
    if not isinstance(odirect, bool) or not isinstance(recover, bool):
        raise UserError("--l2-adapter: use_odirect and recover_on_start must be booleans")
    return FsAdapter(str(kind), base, odirect, float(cap), recover)


def parse_cache_args(argv: list[str]) -> CacheArgs:
    ns = build_parser().parse_args(argv)
    if ns.chunk_size <= 0:
        raise UserError(f"--chunk-size {ns.chunk_size}: must be a positive number of tokens")
    if ns.sim_l2_scale < 1:
        raise UserError(f"--sim-l2-scale {ns.sim_l2_scale}: must be >= 1")
    ignored = log_ignored(ns, log, "lmcache server")
    return CacheArgs(
        host=ns.host,
        port=ns.port,
        chunk_size=ns.chunk_size,
        l1_size_gb=ns.l1_size_gb,
        eviction_policy=ns.eviction_policy,
        eviction_trigger_watermark=ns.eviction_trigger_watermark,
        eviction_ratio=ns.eviction_ratio,
        l2_adapters=tuple(_adapter(a) for a in ns.l2_adapter),
        http_host=ns.http_host,
        http_port=ns.http_port,
        sim_profile=ns.sim_profile,
        sim_l2_scale=ns.sim_l2_scale,
        ignored=ignored,
    )
