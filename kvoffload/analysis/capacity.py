"""How much conversation history each tier retains: predicted from sizes, measured as a sweep's knee.

Pure: summary rows, one cell's samples or small dicts in; frozen dataclasses and dicts out. Inputs that
need files (a model's config.json, the simulator and lmcache-server profiles) are read at the report's
edge and passed in as `Stated` values, each carrying where it came from; an input that is unavailable
stays None with the reason, and nothing is predicted from it.

Predicted, per tier, in tokens of KV history and in sessions of the replayed dataset at that num_rounds:
- gpu: the vLLM prefix cache, sum over replicas of `num_gpu_blocks x block_size` (labels of
  `vllm:cache_config_info`);
- cpu: LMCache's L1 pool bytes / KV bytes per token, the pool never more than the memory of the
  lmcache-server's host (cell.json `hosts.<host>.ram_gib`): a pool configured beyond it (the simulator
  counts one without allocating it) is bounded by that memory, and its source says so;
- nvme: the L2 capacity bytes / KV bytes per token.
KV bytes per token are those of one whole replica, summed over its tensor-parallel ranks (each rank
stores its own shard in LMCache): from the model's config.json (see kv_bytes_from_model_config), else
from vLLM's per-GPU `kv_cache_memory_bytes` x the replica's tensor-parallel size (its GPUs in cell.json
`targets`) / its `kv_cache_size_tokens`.
An offload tier's capacity is that of its largest store: LMCache stores every chunk in L1 (and the
nvme tier's L1 copies it on to L2), so the smaller stores hold copies of it. A store retains only up to
its eviction watermark: LMCache's eviction loop trims a store once its usage reaches
`trigger_watermark` (L1: `--eviction-trigger-watermark`, from the lmcache profile; L2: the adapter's
`eviction` block), so the capacity is that fraction of the store (right after a pass it holds
watermark x (1 - eviction_ratio)). Sessions = tokens / the
mean live context per session (client.live_context) pooled over every cell of the same model,
num_rounds, ISL and OSL.

Measured: along a sweep (the cells of one tier that differ only in concurrency, or only in num_rounds
when the campaign has one concurrency), the knee is the first point whose later-round hit rate (cached
share of rounds >= 2) falls below HIT_COLLAPSE_FRACTION of the sweep's first point; without hit rates,
the first point whose p50 TTFT degradation exceeds the first point's by DEGRADATION_RISE_POINTS. It is
reported with the bracket of measured points around it, or as not reached in the measured range. Live
history at a point = the sessions live at once x mean live context, where the sessions live at once
are min(requested concurrency, the sessions the cell achieved, the virtual users it could replay:
available less those the isl filter dropped), never the requested concurrency alone: concurrency
beyond the users replayed adds no history.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from kvoffload.analysis.series import labels_of
from kvoffload.parallelism import tensor_parallel_size

GIB = 2.0**30  # LMCache sizes: `--l1-size-gb` and `max_capacity_gb` count GiB (status.json shows it)
HIT_COLLAPSE_FRACTION = 0.5
DEGRADATION_RISE_POINTS = 50.0
SWEEP_KEYS = ["model", "num_rounds", "isl", "osl"]
CACHE_CONFIG = "vllm:cache_config_info"
L1_BYTES = "lmcache_mp_l1_memory_usage_bytes"
L1_RATIO = "lmcache_mp_l1_usage_ratio"
L2_BYTES = "lmcache_mp_l2_usage_bytes"
# LMCache 0.5.6's default eviction watermark, for L1 (`--eviction-trigger-watermark`) and for an L2
# adapter's `eviction` block without `trigger_watermark` (ours: kvoffload/profiles/resolve.py
# l2_adapter): `EvictionConfig.trigger_watermark = 0.8` in lmcache/v1/distributed/config.py; the real
# server's status.json shows it (/work/shared/fixtures/lmcache-0.5.6-cpu: l1_eviction_controller
# trigger_watermark 0.8, eviction_ratio 0.2).
LMCACHE_DEFAULT_WATERMARK = 0.8
# How the source of an L1 pool bounded by its host's memory ends: its figure follows (within_host_memory).
BOUNDED = "at most"
# Below this usage ratio the bytes/ratio quotient is too coarse to give the pool size.
_MIN_RATIO = 0.01
DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "bf16": 2,
    "fp16": 2,
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "fp8": 1,
}
# A float32 checkpoint runs in 2-byte precision under vLLM's default `--dtype auto`: vLLM 0.32
# downcasts it to the platform's first supported dtype, bfloat16 or float16 on every CUDA GPU it runs on
# and on its CPU builds (vllm/config/model.py _resolve_auto_dtype "Downcast for float32 models";
# vllm/platforms/cuda.py and vllm/platforms/cpu.py supported_dtypes).
AUTO_DOWNCAST = {"float32": 2, "float": 2, "fp32": 2}
# `--kv-cache-dtype` values whose element size is plain (vllm/config/cache.py CacheDType); the others
# (nvfp4, turboquant, per-token-head scales, ...) store scales beside the values, so no size is assumed.
KV_CACHE_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class Stated:
    """One input of a prediction: its value (None: unavailable), unit, and where it came from (or why
    it is unavailable)."""

    name: str
    value: float | None
    unit: str
    source: str


@dataclass(frozen=True)
class TierCapacity:
    """Predicted history a tier retains, with every input it used."""

    model: str
    num_rounds: int
    isl: int
    osl: str
    tier: str
    tokens: float | None
    sessions: float | None
    inputs: list[Stated] = field(default_factory=list)
    missing: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class KneePoint:
    """One measured point of a sweep."""

    axis_value: int
    cells: list[str]
    live_history_tokens: float | None
    later_hit_rate: float | None
    degradation_p50_pct: float | None
    later_p95_s: float | None


@dataclass(frozen=True)
class Knee:
    """Where a sweep's later-round hit rate collapses (or TTFT degradation rises)."""

    model: str
    tier: str
    axis: str  # concurrency | num_rounds
    fixed: dict[str, Any]
    status: str  # found | not_reached | too_few_points | no_figures
    criterion: str
    bracket: list[int] | None
    history_bracket_tokens: list[float | None] | None
    points: list[KneePoint]
    statement: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def as_int(v: Any) -> int:
    """int() of a pandas group key or scalar (typed Any: pandas types them as Hashable)."""
    return int(v)


def as_number(v: Any) -> float | None:
    """A figure as a float; None for a missing, text or NaN value."""
    if v is None or isinstance(v, str):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _label_int(labels: Mapping[str, str], key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, ValueError):
        return None


def replica_tensor_parallel_sizes(targets: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """vllm target name -> its replica's tensor-parallel size, from cell.json `targets` (the `gpus` the
    orchestrator records per vllm target; a file older than that field has none, and is left out)."""
    out: dict[str, int] = {}
    for name, ref in targets.items():
        if not isinstance(ref, Mapping) or ref.get("kind") != "vllm":
            continue
        gpus = ref.get("gpus")
        if isinstance(gpus, str) and gpus:
            out[name] = tensor_parallel_size(gpus)
    return out


def gpu_cache_figures(
    samples: pd.DataFrame, targets: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """From `vllm:cache_config_info` of one cell: replicas reporting it, blocks and block size per
    replica (None when they differ), total prefix-cache tokens, the replicas' tensor-parallel size (from
    `targets`, cell.json's; None when unknown or when they differ), and KV bytes per token of a replica
    where vLLM gives both `kv_cache_memory_bytes` and `kv_cache_size_tokens`.

    vLLM 0.32 exports `kv_cache_memory_bytes` only when it was given (the label reads "None" otherwise),
    and then per GPU ("Size of KV Cache per GPU in bytes", vllm/config/cache.py), while
    `kv_cache_size_tokens` is the replica's (per engine; every tensor-parallel rank holds the same blocks,
    each of its own KV heads: vllm/v1/core/kv_cache_utils.py update_kv_cache_capacity,
    generate_scheduler_kv_cache_config). So a replica's bytes per token are memory x its tensor-parallel
    size / tokens; a replica whose size `targets` does not give (an older cell.json) counts as 1."""
    rows = samples[samples["name"] == CACHE_CONFIG]
    out: dict[str, Any] = {
        "gpu_replicas": None,
        "gpu_num_blocks": None,
        "gpu_block_size": None,
        "gpu_cache_tokens": None,
        "vllm_tensor_parallel_size": None,
        "vllm_kv_bytes_per_token": None,
    }
    if rows.empty:
        return out
    sizes_tp = replica_tensor_parallel_sizes(targets or {})
    per_target = rows.drop_duplicates("target", keep="last")
    blocks, sizes, ratios, tps = [], [], [], []
    for target, text in zip(per_target["target"], per_target["labels"], strict=True):
        labels = labels_of(str(text))
        n, b = _label_int(labels, "num_gpu_blocks"), _label_int(labels, "block_size")
        if n is None or b is None:
            return out
        blocks.append(n)
        sizes.append(b)
        tp = sizes_tp.get(str(target))
        tps.append(tp)
        mem, toks = _label_int(labels, "kv_cache_memory_bytes"), _label_int(labels, "kv_cache_size_tokens")
        if mem and toks:
            ratios.append(mem * (tp or 1) / toks)
    out["gpu_replicas"] = len(blocks)
    out["gpu_num_blocks"] = blocks[0] if len(set(blocks)) == 1 else None
    out["gpu_block_size"] = sizes[0] if len(set(sizes)) == 1 else None
    out["gpu_cache_tokens"] = float(sum(n * b for n, b in zip(blocks, sizes, strict=True)))
    out["vllm_tensor_parallel_size"] = tps[0] if len(set(tps)) == 1 else None
    # Replicas of different tensor-parallel sizes round their blocks differently: agreeing within 1 %.
    if ratios and max(ratios) <= min(ratios) * 1.01:
        out["vllm_kv_bytes_per_token"] = sum(ratios) / len(ratios)
    return out


def lmcache_capacity_figures(samples: pd.DataFrame) -> dict[str, Any]:
    """L1 pool size as the server reports it (median of usage bytes / usage ratio over samples whose
    ratio is at least 1 %) and the most L2 bytes held (a lower bound of its capacity)."""
    out: dict[str, Any] = {"lmcache_l1_capacity_bytes": None, "lmcache_l2_usage_bytes_max": None}
    used, ratio = samples[samples["name"] == L1_BYTES], samples[samples["name"] == L1_RATIO]
    if not used.empty and not ratio.empty:
        keys = ["phase", "ts", "target", "labels"]
        both = used[[*keys, "value"]].merge(ratio[[*keys, "value"]], on=keys, suffixes=("_b", "_r"))
        both = both[both["value_r"] >= _MIN_RATIO]
        if not both.empty:
            out["lmcache_l1_capacity_bytes"] = float((both["value_b"] / both["value_r"]).median())
    l2 = samples[(samples["name"] == L2_BYTES) & samples["value"].notna()]
    if not l2.empty:
        out["lmcache_l2_usage_bytes_max"] = float(l2.groupby(["phase", "ts"])["value"].sum().max())
    return out


def engine_flag(args: Sequence[str], flag: str) -> str | None:
    """The last value of `--flag` in vLLM arguments (`--flag v`, `--flag=v`, underscores alike), or None."""
    value = None
    for i, arg in enumerate(args):
        name, sep, given = arg.partition("=")
        if name.replace("_", "-") == flag:
            value = given if sep else (args[i + 1] if i + 1 < len(args) else None)
    return value


def _element_bytes(
    cfg: Mapping[str, Any], config: Mapping[str, Any], engine_args: Sequence[str]
) -> tuple[int | None, str]:
    """Bytes of one KV element and how they were found: the engine's `--kv-cache-dtype` when not auto,
    else its `--dtype` when not auto, else the checkpoint's dtype as vLLM's `--dtype auto` runs it."""
    kv_dtype = engine_flag(engine_args, "--kv-cache-dtype")
    if kv_dtype is not None and kv_dtype != "auto":
        size = KV_CACHE_DTYPE_BYTES.get(kv_dtype)
        return size, f"--kv-cache-dtype {kv_dtype}" + ("" if size else " (element size not plain)")
    dtype = engine_flag(engine_args, "--dtype")
    if dtype is not None and dtype != "auto":
        return DTYPE_BYTES.get(dtype), f"--dtype {dtype}"
    # transformers >= 4.56 writes `dtype`, older ones `torch_dtype`; a multimodal config may keep it at
    # the top level only.
    given = next(
        (str(c[k]) for c in (cfg, config) for k in ("dtype", "torch_dtype") if c.get(k) is not None), None
    )
    if given in AUTO_DOWNCAST:
        return AUTO_DOWNCAST[given], f"{given} checkpoint, run in 2-byte precision by vLLM's --dtype auto"
    return (DTYPE_BYTES.get(given) if given else None), f"dtype {given}"


def kv_bytes_from_model_config(
    config: Mapping[str, Any],
    source: str,
    tensor_parallel_sizes: Collection[int] = (),
    engine_args: Sequence[str] = (),
) -> Stated:
    """KV bytes per token of one replica = 2 (K and V) x layers x KV heads x head dim x element bytes of
    a HF config.json (GQA: `num_key_value_heads`; `head_dim`, else hidden_size / attention heads).

    The replica's bytes are the sum over its tensor-parallel ranks, which split the KV heads between
    them: the same for every size up to the number of KV heads. Past it vLLM gives each rank one copy of
    a head (vllm/config/model.py get_num_kv_heads: max(1, heads // tp)), so the replica holds, and
    stores in LMCache, tp heads. `tensor_parallel_sizes`: those of the cell's replicas (empty: unknown,
    heads not replicated assumed). `engine_args`: the campaign's extra_engine_args, whose
    `--kv-cache-dtype` / `--dtype` override the checkpoint's dtype."""
    name = "KV bytes per token"
    text = config.get("text_config")
    cfg: Mapping[str, Any] = text if isinstance(text, Mapping) else config
    if cfg.get("kv_lora_rank") is not None:
        # MLA (DeepSeek-V2/V3): one latent vector per token and layer, not K and V per head
        return Stated(name, None, "B", f"{source}: an MLA model (kv_lora_rank), not sized from its heads")
    layers, heads = (
        cfg.get("num_hidden_layers"),
        cfg.get("num_key_value_heads", cfg.get("num_attention_heads")),
    )
    head_dim = cfg.get("head_dim")
    if head_dim is None and cfg.get("hidden_size") and cfg.get("num_attention_heads"):
        head_dim = int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    dtype, dtype_how = _element_bytes(cfg, config, engine_args)
    if not (isinstance(layers, int) and isinstance(heads, int) and isinstance(head_dim, int) and heads > 0):
        return Stated(name, None, "B", f"{source}: lacks num_hidden_layers, num_key_value_heads or head_dim")
    if not dtype:
        return Stated(name, None, "B", f"{source}: no KV element size ({dtype_how})")
    held = {tp * max(1, heads // tp) for tp in tensor_parallel_sizes} or {heads}
    if len(held) > 1:
        sizes = ", ".join(str(tp) for tp in sorted(set(tensor_parallel_sizes)))
        return Stated(
            name,
            None,
            "B",
            f"{source}: replicas of tensor-parallel sizes {sizes} hold different KV per token "
            f"(vLLM copies a KV head onto every rank past {heads})",
        )
    total = held.pop()
    value = 2 * layers * total * head_dim * dtype
    copies = "" if total == heads else f" (the model's {heads}, one on each of {total} tensor-parallel ranks)"
    how = f"2 x {layers} layers x {total} KV heads{copies} x head_dim {head_dim} x {dtype} B ({dtype_how})"
    return Stated(name, float(value), "B", f"{source} ({how})")


def mean_live_context(summary: pd.DataFrame) -> dict[tuple[Any, ...], tuple[float, int]]:
    """(model, num_rounds, isl, osl) -> (mean live context tokens, sessions) pooled over its cells."""
    out: dict[tuple[Any, ...], tuple[float, int]] = {}
    if summary.empty or "live_context_mean_tokens" not in summary:
        return out
    for key, g in summary.groupby(SWEEP_KEYS, sort=False, dropna=False):
        n = pd.to_numeric(g["sessions_replayed"], errors="coerce").fillna(0)
        m = pd.to_numeric(g["live_context_mean_tokens"], errors="coerce")
        ok = m.notna() & (n > 0)
        if ok.any():
            out[tuple(key)] = (float((m[ok] * n[ok]).sum() / n[ok].sum()), int(n[ok].sum()))
    return out


def configured_l1_gb(config: Any) -> float | None:
    """`lmcache_l1_size_gb` of a cells-table `config` JSON text (None: absent, or the profile's)."""
    parsed = json.loads(config) if isinstance(config, str) and config else {}
    return as_number(parsed.get("lmcache_l1_size_gb")) if isinstance(parsed, dict) else None


def _first(rows: pd.DataFrame, column: str) -> tuple[float | None, str | None]:
    for _, r in rows.iterrows():
        v = as_number(r.get(column))
        if v is not None:
            return v, str(r["cell_id"])
    return None, None


def _first_stated(rows: pd.DataFrame, stated: Mapping[str, Stated]) -> Stated | None:
    """The first of `rows`' cells whose `stated` figure has a value, in row order; None when none has."""
    for cid in rows["cell_id"].astype(str):
        s = stated.get(cid)
        if s is not None and s.value is not None:
            return s
    return None


def _kv_bytes(rows: pd.DataFrame, stated: Mapping[str, Stated]) -> Stated:
    if (s := _first_stated(rows, stated)) is not None:
        return s
    v, first = _first(rows, "vllm_kv_bytes_per_token")
    if v is not None:
        row = rows[rows["cell_id"].astype(str) == first].iloc[0]
        tp = as_number(row.get("vllm_tensor_parallel_size"))
        size = (
            f"tensor-parallel size {tp:g} (cell.json targets' gpus)"
            if tp is not None
            else "each replica's tensor-parallel size (cell.json targets' gpus; 1 where an older file "
            "names none)"
        )
        return Stated(
            "KV bytes per token",
            v,
            "B",
            f"vllm:cache_config_info kv_cache_memory_bytes (per GPU) x {size} / kv_cache_size_tokens "
            f"(per replica) (cell {first})",
        )
    reasons = sorted({s.source for cid in rows["cell_id"].astype(str) if (s := stated.get(cid)) is not None})
    why = "; ".join(reasons) or "no model config.json or profile was readable"
    return Stated(
        "KV bytes per token", None, "B", f"unavailable: {why}; vLLM did not report kv_cache_memory_bytes"
    )


def lmcache_host_memory(hosts: Mapping[str, Any], targets: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The lmcache-server's host of one cell (its `lmcache` target in cell.json `targets`) and that
    host's memory in bytes (cell.json `hosts.<host>.ram_gib`, Ansible's MemTotal in GiB to 0.1); None
    where the cell has no lmcache-server or the file does not say."""
    host = next(
        (str(ref["host"]) for ref in targets.values() if ref.get("kind") == "lmcache" and ref.get("host")),
        None,
    )
    record = hosts.get(host) if host is not None else None
    gib = as_number(record.get("ram_gib")) if isinstance(record, Mapping) else None
    return {"lmcache_host": host, "lmcache_host_memory_bytes": gib * GIB if gib else None}


@dataclass(frozen=True)
class HostMemory:
    """The memory of an lmcache-server's host: the smallest among some cells'."""

    total_bytes: float
    host: str
    cell_id: str


def smallest_host_memory(rows: pd.DataFrame) -> HostMemory | None:
    """The smallest lmcache-server host memory among `rows` (columns `cell_id`, `lmcache_host`,
    `lmcache_host_memory_bytes`, as lmcache_host_memory gives them); None when none is known."""
    found: HostMemory | None = None
    for _, r in rows.iterrows():
        v = as_number(r.get("lmcache_host_memory_bytes"))
        if v is not None and (found is None or v < found.total_bytes):
            found = HostMemory(v, str(r.get("lmcache_host")), str(r["cell_id"]))
    return found


def within_host_memory(pool: Stated, memory: HostMemory | None) -> Stated:
    """An L1 pool (unit "B" or "GiB") no larger than its host's memory: one configured beyond it comes
    back as that memory, an upper bound of what the host can give (the OS and the replicas need part of
    it), its source saying so and ending where a figure in the pool's unit follows ("... at most").
    A real lmcache-server pins its pool (its role's preflight refuses one beyond MemTotal); the simulator
    counts the configured bytes without allocating them, so its cells ran as if the host had them."""
    scale = GIB if pool.unit == "GiB" else 1.0
    if pool.value is None or memory is None or pool.value * scale <= memory.total_bytes:
        return pool
    configured = pool.value * scale / GIB
    return Stated(
        pool.name,
        memory.total_bytes / scale,
        pool.unit,
        f"{pool.source} = {configured:g} GiB, more than the "
        f"{memory.total_bytes / GIB:g} GiB of memory of {memory.host}, the lmcache-server host of cell "
        f"{memory.cell_id} (cell.json hosts ram_gib): bounded by that memory (a real server could pin no "
        f"more; the simulator counts the configured bytes without allocating them), {BOUNDED}",
    )


def _with_figure(source: str, gib: float) -> str:
    """A pool's source with its figure: "... = 64 GiB", or "... at most 23.5 GiB" when it was bounded."""
    return f"{source}{'' if source.endswith(BOUNDED) else ' ='} {gib:g} GiB"


def l1_pool(rows: pd.DataFrame, profile_l1_gb: Mapping[str, Stated]) -> Stated:
    """The L1 pool of a tier's cells in bytes: the server's own figure (usage bytes / usage ratio),
    else the campaign's `lmcache_l1_size_gb`, else the lmcache profile's (GiB as LMCache counts them),
    never more than the smallest memory of the cells' lmcache-server hosts (within_host_memory)."""
    v, cid = _first(rows, "lmcache_l1_capacity_bytes")
    gb, gb_cid = _first(rows, "lmcache_l1_size_gb")
    prof = profile_l1_gb.get(str(rows["tier"].iloc[0]))
    if v is not None:
        pool = Stated("L1 pool", v, "B", f"lmcache /metrics: {L1_BYTES} / {L1_RATIO} (cell {cid})")
        plain = pool.source
    elif gb is not None:
        pool = Stated("L1 pool", gb, "GiB", f"cell.json config.lmcache_l1_size_gb (cell {gb_cid})")
        plain = f"cell.json config.lmcache_l1_size_gb = {gb:g} GiB (cell {gb_cid})"
    elif prof is not None and prof.value is not None:
        # the report's profile figure may come bounded already (report/build.py capacity_inputs)
        pool, plain = prof, _with_figure(prof.source, prof.value)
    else:
        return Stated(
            "L1 pool", None, "B", "unavailable: no L1 usage ratio sampled, no lmcache_l1_size_gb, no profile"
        )
    bounded = within_host_memory(pool, smallest_host_memory(rows))
    assert bounded.value is not None
    value = bounded.value * (GIB if bounded.unit == "GiB" else 1.0)
    source = plain if bounded is pool else _with_figure(bounded.source, value / GIB)
    return Stated("L1 pool", value, "B", source)


def _l2_bytes(rows: pd.DataFrame, stated: Mapping[str, Stated]) -> Stated:
    if (s := _first_stated(rows, stated)) is not None:
        return s
    seen, where = _first(rows, "lmcache_l2_usage_bytes_max")
    floor = f"; the most it held was {seen / 1e9:.3g} GB (cell {where})" if seen else ""
    why = next((s.source for c in rows["cell_id"].astype(str) if (s := stated.get(c)) is not None), None)
    return Stated(
        "L2 capacity",
        None,
        "B",
        "unavailable: "
        + (why or "LMCache exports no L2 capacity and cell.json records no NVMe device size").removeprefix(
            "unavailable: "
        )
        + floor,
    )


def default_watermark(tier: str) -> Stated:
    """The eviction watermark of a tier's capacity store when nothing states another (see
    LMCACHE_DEFAULT_WATERMARK)."""
    store = "L1 --eviction-trigger-watermark" if tier == "cpu" else "L2 adapter eviction.trigger_watermark"
    return Stated(
        "eviction watermark",
        LMCACHE_DEFAULT_WATERMARK,
        "",
        f"LMCache 0.5.6 default of {store} (lmcache/v1/distributed/config.py EvictionConfig)",
    )


def predict(
    summary: pd.DataFrame,
    kv_bytes: Mapping[str, Stated] | None = None,
    profile_l1_gb: Mapping[str, Stated] | None = None,
    l2_bytes: Mapping[str, Stated] | None = None,
    watermarks: Mapping[str, Stated] | None = None,
) -> list[TierCapacity]:
    """One prediction per (model, num_rounds, isl, osl) and tier present in `summary`.

    `summary` rows need the gpu_cache_figures / lmcache_capacity_figures / lmcache_host_memory columns
    and `lmcache_l1_size_gb`. `kv_bytes` and `l2_bytes` are per cell id, `profile_l1_gb` per tier (value
    in GiB),
    `watermarks` per tier: the eviction watermark of its capacity store (default: LMCache's).
    """
    kv_bytes, profile_l1_gb, l2_bytes = kv_bytes or {}, profile_l1_gb or {}, l2_bytes or {}
    watermarks = watermarks or {}
    contexts = mean_live_context(summary)
    out: list[TierCapacity] = []
    if summary.empty:
        return out
    for key, rows in summary.groupby([*SWEEP_KEYS, "tier"], sort=False, dropna=False):
        model, num_rounds, isl, osl, tier = key
        context = contexts.get((model, num_rounds, isl, osl))
        ctx_input = Stated(
            "mean live context per session",
            None if context is None else context[0],
            "tokens",
            "unavailable: no request recorded prompt tokens"
            if context is None
            else f"requests.jsonl: mean over {context[1]} sessions of their largest prompt + completion, "
            f"num_rounds={num_rounds}",
        )
        inputs: list[Stated] = []
        tokens: float | None = None
        if tier == "gpu":
            total, cid = _first(rows, "gpu_cache_tokens")
            blocks, _ = _first(rows, "gpu_num_blocks")
            size, _ = _first(rows, "gpu_block_size")
            replicas, _ = _first(rows, "gpu_replicas")
            src = (
                f"vllm:cache_config_info (cell {cid})"
                if cid
                else "unavailable: no vllm:cache_config_info sampled"
            )
            inputs += [
                Stated("num_gpu_blocks per replica", blocks, "blocks", src),
                Stated("block_size", size, "tokens", src),
                Stated("replicas", replicas, "", src),
            ]
            tokens = total
        else:
            kv = _kv_bytes(rows, kv_bytes)
            store = l1_pool(rows, profile_l1_gb) if tier == "cpu" else _l2_bytes(rows, l2_bytes)
            mark = watermarks.get(str(tier)) or default_watermark(str(tier))
            inputs += [store, mark, kv]
            if store.value is not None and mark.value is not None and kv.value:
                tokens = store.value * mark.value / kv.value
        inputs.append(ctx_input)
        missing = [f"{s.name} ({s.source.removeprefix('unavailable: ')})" for s in inputs if s.value is None]
        sessions = tokens / context[0] if tokens is not None and context and context[0] > 0 else None
        out.append(
            TierCapacity(
                model=str(model),
                num_rounds=as_int(num_rounds),
                isl=as_int(isl),
                osl=str(osl),
                tier=str(tier),
                tokens=tokens,
                sessions=sessions,
                inputs=inputs,
                missing="; ".join(missing) or None,
            )
        )
    return out


def _mean(g: pd.DataFrame, column: str) -> float | None:
    if column not in g:
        return None
    v = pd.to_numeric(g[column], errors="coerce").dropna()
    return float(v.mean()) if len(v) else None


def _numbers(rows: pd.DataFrame, column: str) -> pd.Series:
    """A column as floats (NaN where missing or not a number; all NaN when the column is absent)."""
    if column not in rows:
        return pd.Series(float("nan"), index=rows.index, dtype=float)
    return pd.to_numeric(rows[column], errors="coerce").astype(float)


def replayable_users(rows: pd.DataFrame) -> pd.Series:
    """Per row: the virtual users the cell could replay (sessions.json virtual_users_available less
    dropped_by_isl; NaN when unknown). The available count is taken before the isl filter and
    max_sessions; achieved_sessions reflects the max_sessions cut."""
    return _numbers(rows, "virtual_users_available") - _numbers(rows, "sessions_dropped_by_isl").fillna(0)


def live_sessions(rows: pd.DataFrame) -> pd.Series:
    """Per row: the sessions live at once, min(requested concurrency, achieved sessions, replayable
    users), each where known."""
    out = _numbers(rows, "concurrency")
    for bound in (_numbers(rows, "achieved_sessions"), replayable_users(rows)):
        # an achieved count of 0 (nothing ran) bounds nothing: its figures are missing anyway
        ok = bound.notna() & (bound > 0)
        out = out.where(~ok, out.clip(upper=bound.where(ok)))
    return out


def load_ceiling(rows: pd.DataFrame) -> float | None:
    """The most sessions the cells of a sweep could run at once: the most any of them achieved when
    that is known (it carries the max_sessions cut), bounded by the users replayable after the isl
    filter; None when neither is recorded."""
    users = replayable_users(rows).dropna()
    a = _numbers(rows, "achieved_sessions").dropna()
    a = a[a > 0]
    bounds = []
    if len(a):
        bounds.append(float(a.max()))
    if len(users):
        bounds.append(float(users.min()))
    return min(bounds) if bounds else None


def _effective(g: pd.DataFrame) -> float | None:
    if _mean(g, "concurrency") is None:
        return None
    live = live_sessions(g).dropna()
    return float(live.mean()) if len(live) else None


def sweep_points(rows: pd.DataFrame, axis: str, context: float | None) -> list[KneePoint]:
    """Points of one sweep (rows of one tier), repeats averaged, sorted along `axis`."""
    points = []
    for value, g in rows.groupby(axis, sort=True):
        eff = _effective(g)
        points.append(
            KneePoint(
                axis_value=as_int(value),
                cells=sorted(g["cell_id"].astype(str)),
                live_history_tokens=None if eff is None or context is None else eff * context,
                later_hit_rate=_mean(g, "later_round_cached_share"),
                degradation_p50_pct=_mean(g, "ttft_degradation_p50_pct"),
                later_p95_s=_mean(g, "ttft_later_p95_s"),
            )
        )
    return points


def tokens_text(tokens: float | None) -> str:
    """0.4 M / 12 k / 830 tokens."""
    if tokens is None:
        return "unknown"
    if tokens >= 1e6:
        return f"{tokens / 1e6:.3g} M"
    if tokens >= 1e3:
        return f"{tokens / 1e3:.3g} k"
    return f"{tokens:.0f}"


def _point_text(axis: str, p: KneePoint) -> str:
    hit = "–" if p.later_hit_rate is None else f"{100 * p.later_hit_rate:.0f} %"
    deg = "–" if p.degradation_p50_pct is None else f"{p.degradation_p50_pct:+.0f} %"
    return (
        f"{axis} {p.axis_value} ({tokens_text(p.live_history_tokens)} tokens of live history, "
        "later-round hit "
        f"rate {hit}, p50 TTFT degradation {deg})"
    )


def find_knee(points: Sequence[KneePoint], axis: str) -> tuple[str, str, int | None]:
    """(status, criterion, index of the knee point) over points sorted along the axis."""
    if len(points) < 2:
        return "too_few_points", "a knee needs at least two points along the sweep", None
    base = points[0]
    if (
        base.later_hit_rate is not None
        and base.later_hit_rate > 0
        and all(p.later_hit_rate is not None for p in points)
    ):
        limit = HIT_COLLAPSE_FRACTION * base.later_hit_rate
        criterion = (
            f"later-round hit rate below {HIT_COLLAPSE_FRACTION:.0%} of its value at {axis} "
            f"{base.axis_value} ({100 * base.later_hit_rate:.0f} %), i.e. below {100 * limit:.0f} %"
        )
        for i, p in enumerate(points[1:], start=1):
            if p.later_hit_rate is not None and p.later_hit_rate < limit:
                return "found", criterion, i
        return "not_reached", criterion, None
    if base.degradation_p50_pct is not None and all(p.degradation_p50_pct is not None for p in points):
        limit = base.degradation_p50_pct + DEGRADATION_RISE_POINTS
        criterion = (
            f"no hit rates were recorded; p50 TTFT degradation above {limit:+.0f} % "
            f"({DEGRADATION_RISE_POINTS:.0f} points over its value at {axis} {base.axis_value})"
        )
        for i, p in enumerate(points[1:], start=1):
            if p.degradation_p50_pct is not None and p.degradation_p50_pct > limit:
                return "found", criterion, i
        return "not_reached", criterion, None
    return (
        "no_figures",
        "neither later-round hit rates nor TTFT degradation were measured at every point",
        None,
    )


def knees(summary: pd.DataFrame) -> list[Knee]:
    """The measured knee of every sweep of `summary` (one per tier and fixed configuration)."""
    out: list[Knee] = []
    if summary.empty:
        return out
    contexts = mean_live_context(summary)
    by_concurrency = summary.groupby([*SWEEP_KEYS, "tier"], sort=False, dropna=False)
    multi = any(len(set(g["concurrency"])) > 1 for _, g in by_concurrency)
    axis = "concurrency" if multi or len(set(summary["num_rounds"])) <= 1 else "num_rounds"
    fixed_keys = [k for k in ["model", "concurrency", "num_rounds", "isl", "osl"] if k != axis]
    for key, rows in summary.groupby([*fixed_keys, "tier"], sort=False, dropna=False):
        fixed = dict(zip(fixed_keys, (v.item() if hasattr(v, "item") else v for v in key[:-1]), strict=True))
        tier = str(key[-1])
        if axis == "concurrency":
            ctx = contexts.get((fixed["model"], fixed["num_rounds"], fixed["isl"], fixed["osl"]))
            points = sweep_points(rows, axis, ctx[0] if ctx else None)
        else:
            points = []
            for _, g in rows.groupby("num_rounds", sort=True):
                ctx = contexts.get((fixed["model"], g["num_rounds"].iloc[0], fixed["isl"], fixed["osl"]))
                points += sweep_points(g, axis, ctx[0] if ctx else None)
        status, criterion, i = find_knee(points, axis)
        fixed_text = ", ".join(f"{k}={v}" for k, v in fixed.items() if k != "model")
        if status == "found" and i is not None:
            lo, hi = points[i - 1], points[i]
            statement = (
                f"{tier} ({fixed_text}): the knee lies between {_point_text(axis, lo)} and "
                f"{_point_text(axis, hi)}"
            )
            bracket: list[int] | None = [lo.axis_value, hi.axis_value]
            history: list[float | None] | None = [lo.live_history_tokens, hi.live_history_tokens]
        elif status == "not_reached":
            last = points[-1]
            reach = _point_text(axis, last)
            statement = f"{tier} ({fixed_text}): knee not reached in the measured range, up to {reach}"
            bracket, history = None, None
        else:
            statement = f"{tier} ({fixed_text}): no knee can be measured: {criterion}"
            bracket, history = None, None
        out.append(
            Knee(
                model=str(fixed["model"]),
                tier=tier,
                axis=axis,
                fixed=fixed,
                status=status,
                criterion=criterion,
                bracket=bracket,
                history_bracket_tokens=history,
                points=points,
                statement=statement,
            )
        )
    return out


def l2_from_hosts(hosts: Mapping[str, Any], l2_device: str | None, fraction: Stated) -> Stated:
    """L2 capacity = the profile's capacity fraction x the size of the NVMe device behind the L2 path,
    from cell.json `hosts.<host>.nvme` (the lmcache_server role applies the fraction to the mounted
    filesystem's size, a little smaller than the device, so this is an upper bound)."""
    name = "L2 capacity"
    if not l2_device:
        return Stated(name, None, "B", "unavailable: cell.json names no l2_device")
    if fraction.value is None:
        return Stated(name, None, "B", f"unavailable: {fraction.source}")
    for host, record in sorted(hosts.items()):
        for dev in (record or {}).get("nvme") or []:
            if not isinstance(dev, Mapping) or str(dev.get("device", "")).rsplit("/", 1)[-1] != l2_device:
                continue
            size = as_number(dev.get("size_bytes"))
            if size:
                return Stated(
                    name,
                    fraction.value * size,
                    "B",
                    f"{fraction.value:g} ({fraction.source}) x {size / 1e12:.3g} TB, the size of "
                    f"{l2_device} on {host} (cell.json hosts); the role applies the fraction to the "
                    "filesystem's size, a little smaller",
                )
    return Stated(
        name, None, "B", f"unavailable: cell.json hosts record no size for the L2 device {l2_device}"
    )
