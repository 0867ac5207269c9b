"""What a tier's operating point delivers and costs: goodput, resources, cost and GPU energy.

Pure (no IO), part of kvoffload/analysis/decision.py; docs/metrics.md "Decision" defines every figure.
Goodput follows GuideLLM: a request counts only when its own TTFT is within the target's p95 limit (and
its TPOT within the TPOT limit, when one is set); requests/s and tokens/s over the replay's wall time
(client.run_seconds), the mean over the level's cells, and per GPU. Cost per hour adds the prices of
what the tier uses (kvoffload/config/slo.py `Prices`): the node, its GPUs, the L1 pool's DRAM (cpu and
nvme), the L2 NVMe (nvme), the measured GPU energy; a price not given for DRAM or NVMe is taken as
paid by the node's price, a base price (node or GPU) must be given, and a price given for a quantity
that is unknown leaves the cost null. Cost per million tokens = cost per hour / (goodput tokens/s x
3600) x 10^6. Energy = the cells' summed mean GPU power x their wall time, per million goodput tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvoffload.analysis.capacity import Stated, l1_pool
from kvoffload.analysis.compare import OFFLOAD_TIERS
from kvoffload.analysis.crossing import Bound, Level, column
from kvoffload.analysis.steady import Held
from kvoffload.config.slo import HOURS_PER_MONTH, Prices, Slo

# A cost needs one of these: the other prices are added to a node's or its GPUs' price.
BASE_PRICES = "prices.node_hour or prices.gpu_hour"


def number(v: Any) -> float | None:
    """A summary value as a float; None for a missing, NaN or non-numeric one."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _first(rows: pd.DataFrame, column: str) -> float | None:
    """The first known value of a column over some rows."""
    if column not in rows:
        return None
    v = pd.to_numeric(rows[column], errors="coerce").dropna()
    return float(v.iloc[0]) if len(v) else None


@dataclass(frozen=True)
class Goodput:
    """Requests that met the target on their own, at the operating level (GuideLLM's goodput)."""

    # the sessions at once it was measured at: a level, or the interpolated crossing
    sessions_at_once: float
    cells: list[str]
    requests_ok: int
    requests_good: int
    requests_per_s: float | None
    tokens_per_s: float | None
    completion_tokens_per_s: float | None
    gpus: int | None
    tokens_per_s_per_gpu: float | None
    requests_per_s_per_gpu: float | None
    # ">=": the tier never missed the target, so it could carry more than this level.
    bound: Bound = "="
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Resources:
    """What a tier's node uses that a price may be attached to."""

    gpus: int | None
    dram_gb: float | None  # LMCache L1 pool, GB = 10^9 bytes; 0 on gpu
    nvme_tb: float | None  # nvme's L2 capacity, TB = 10^12 bytes; 0 on gpu and cpu
    sources: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Cost:
    """What an hour of the tier's node and a million tokens of its goodput cost, and the GPU energy."""

    per_hour: float | None
    parts: dict[str, float]
    per_million_tokens: float | None
    per_million_completion_tokens: float | None
    energy_kwh_per_million_tokens: float | None
    # "<=": the operating level is censored (never missed), so a million tokens costs at most this.
    bound: Bound = "="
    missing_prices: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # the 95 % interval of per_million_tokens, from the crossing's replicates (None: no interval)
    per_million_tokens_ci: list[float] | None = None


def gpus_of(row: pd.Series) -> int | None:
    """GPUs the cell's replicas use: replicas (cell.json targets, else the records) x their common
    tensor-parallel size, else the GPUs the telemetry sampled; None when neither is known."""
    replicas = number(row.get("replicas_configured")) or number(row.get("replicas_answering"))
    tp = number(row.get("vllm_tensor_parallel_size"))
    if replicas and tp:
        return int(replicas * tp)
    sampled = number(row.get("gpus"))
    return int(sampled) if sampled else None


def resources(
    rows: pd.DataFrame, tier: str, profile_l1: Mapping[str, Stated], l2: Mapping[str, Stated]
) -> Resources:
    """GPUs, L1 DRAM and L2 NVMe of a tier's cells. L1: the pool the capacity prediction uses
    (capacity.l1_pool: the server's own pool size, else the campaign's `lmcache_l1_size_gb`, else the
    lmcache profile's, never more than the lmcache-server host's memory), in GB; L2: the capacity the
    capacity prediction uses."""
    gpus = [g for _, r in rows.iterrows() if (g := gpus_of(r)) is not None]
    sources: list[str] = []
    dram: float | None = 0.0
    nvme: float | None = 0.0
    if tier in OFFLOAD_TIERS:
        pool = l1_pool(rows, profile_l1)
        dram = None if pool.value is None else pool.value / 1e9
        sources.append(f"L1: {pool.source}" if pool.value is not None else "L1: size unknown")
    if tier == "nvme":
        stated = next(
            (s for c in rows["cell_id"].astype(str) if (s := l2.get(c)) is not None and s.value is not None),
            None,
        )
        nvme = None if stated is None or stated.value is None else stated.value / 1e12
        sources.append(f"L2: {stated.source}" if stated is not None else "L2: capacity unknown")
    return Resources(max(gpus) if gpus else None, dram, nvme, sources)


def goodput(
    level: Level, rows: pd.DataFrame, held: Mapping[str, Held], slo: Slo, bound: Bound
) -> tuple[Goodput, float | None, float | None]:
    """The level's goodput over its cells' steady windows (`held`: crossing.levels' windows and
    in-window records), and its GPU energy in kWh per million goodput tokens and mean GPU power (W),
    each None when a cell lacks the figure."""
    mine = rows[rows["cell_id"].astype(str).isin(level.cells)]
    rates: dict[str, list[float | None]] = {"req": [], "tok": [], "out": []}
    ok_n = good_n = 0
    gpus: list[int] = []
    joules: list[float | None] = []
    powers: list[float | None] = []
    good_tokens = 0.0
    notes: list[str] = []
    for _, row in mine.iterrows():
        cell = held.get(str(row["cell_id"]))
        req = cell.records if cell is not None else pd.DataFrame()
        seconds = cell.window.seconds if cell is not None and cell.window.seconds > 0 else None
        ok = req[req["status"] == "ok"] if not req.empty else req
        ttft = column(ok, "ttft_s")
        tpot = column(ok, "tpot_s")
        good = ~np.isnan(ttft) & (ttft <= slo.ttft_p95_s)
        if slo.tpot_p95_s is not None:
            # a request of one output token has no TPOT: nothing of it missed the TPOT limit
            good &= np.isnan(tpot) | (tpot <= slo.tpot_p95_s)
        ok_n += len(ok)
        good_n += int(good.sum())
        prompt, completion = column(ok, "prompt_tokens")[good], column(ok, "completion_tokens")[good]
        usage = not (np.isnan(prompt).any() or np.isnan(completion).any())
        if seconds:
            rates["req"].append(int(good.sum()) / seconds)
            rates["tok"].append(float((prompt + completion).sum()) / seconds if usage else None)
            rates["out"].append(float(completion.sum()) / seconds if usage else None)
        else:
            for k in rates:
                rates[k].append(None)
        if not usage:
            notes.append(f"cell {row['cell_id']}: some requests carry no usage token counts")
        good_tokens += float((prompt + completion).sum()) if usage else math.nan
        g = gpus_of(row)
        if g is not None:
            gpus.append(g)
        power = number(row.get("gpu_power_w"))
        powers.append(power)
        joules.append(None if power is None or not seconds else power * seconds)

    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return None if not values or len(known) < len(values) else float(np.mean(known))

    req_s, tok_s, out_s = mean(rates["req"]), mean(rates["tok"]), mean(rates["out"])
    n_gpu = max(gpus) if gpus else None
    if n_gpu is None:
        notes.append("GPUs per node unknown (cell.json targets name none): no per-GPU figure")
    energy = None
    if joules and all(j is not None for j in joules) and good_tokens > 0:
        energy = sum(j for j in joules if j is not None) / 3.6e6 / good_tokens * 1e6
    power = mean(powers)
    return (
        Goodput(
            sessions_at_once=float(level.sessions_at_once),
            cells=level.cells,
            requests_ok=ok_n,
            requests_good=good_n,
            requests_per_s=req_s,
            tokens_per_s=tok_s,
            completion_tokens_per_s=out_s,
            gpus=n_gpu,
            tokens_per_s_per_gpu=None if tok_s is None or not n_gpu else tok_s / n_gpu,
            requests_per_s_per_gpu=None if req_s is None or not n_gpu else req_s / n_gpu,
            bound=bound,
            notes=notes,
        ),
        energy,
        power,
    )


def _between(a: float | None, b: float | None, share: float) -> float | None:
    return None if a is None or b is None else a + share * (b - a)


def at_crossing(low: Goodput, high: Goodput, x0: float, x1: float, x: float) -> Goodput:
    """Goodput at the crossing x between two measured levels x0 < x1: each rate interpolated linearly
    against the sessions, as the crossing itself is (docs/metrics.md "Decision": "Cost")."""
    share = min(1.0, max(0.0, (x - x0) / (x1 - x0))) if x1 > x0 else 0.0
    tok = _between(low.tokens_per_s, high.tokens_per_s, share)
    req = _between(low.requests_per_s, high.requests_per_s, share)
    gpus = low.gpus if low.gpus == high.gpus else None
    return Goodput(
        sessions_at_once=x,
        cells=[*low.cells, *high.cells],
        requests_ok=low.requests_ok + high.requests_ok,
        requests_good=low.requests_good + high.requests_good,
        requests_per_s=req,
        tokens_per_s=tok,
        completion_tokens_per_s=_between(low.completion_tokens_per_s, high.completion_tokens_per_s, share),
        gpus=gpus,
        tokens_per_s_per_gpu=None if tok is None or not gpus else tok / gpus,
        requests_per_s_per_gpu=None if req is None or not gpus else req / gpus,
        bound="=",
        notes=list(dict.fromkeys([*low.notes, *high.notes])),
    )


def rate_draws(
    low: float | None, high: float | None, x0: float, x1: float, xs: np.ndarray
) -> np.ndarray | None:
    """A rate at each crossing replicate `xs`, interpolated between its two levels' measured rates (a
    replicate beyond the bracket taken at the bracket's end, like the crossing's interval)."""
    if low is None or high is None or x1 <= x0:
        return None
    known = xs[~np.isnan(xs)]
    share = (np.clip(known, x0, x1) - x0) / (x1 - x0)
    out: np.ndarray = low + share * (high - low)
    return out


def cost(
    tier: str,
    res: Resources,
    prices: Prices | None,
    goodput: Goodput | None,
    energy_kwh_per_mtok: float | None,
    gpu_power_w: float | None,
) -> Cost:
    """A tier's cost per hour and per million goodput tokens (docs/metrics.md "Decision": "Cost")."""
    bound: Bound = "<=" if goodput is not None and goodput.bound == ">=" else "="
    uses_dram = tier in OFFLOAD_TIERS
    uses_nvme = tier == "nvme"
    needed = [BASE_PRICES]
    needed += ["prices.dram_gb_month"] if uses_dram else []
    needed += ["prices.nvme_tb_month"] if uses_nvme else []
    if prices is None:
        # a price per kWh would complete it only where the GPU energy was measured
        energy = ["prices.kwh"] if gpu_power_w is not None else []
        return Cost(None, {}, None, None, energy_kwh_per_mtok, bound, [*needed, *energy], [])
    parts: dict[str, float] = {}
    notes: list[str] = []
    missing: list[str] = []
    unknown: list[str] = []
    if prices.node_hour is None and prices.gpu_hour is None:
        missing.append(BASE_PRICES)
    if prices.node_hour is not None:
        parts["node"] = prices.node_hour
    if prices.gpu_hour is not None:
        if res.gpus is None:
            unknown.append("the GPUs the replicas use")
        else:
            parts["gpu"] = prices.gpu_hour * res.gpus
    if uses_dram:
        if prices.dram_gb_month is None:
            notes.append(
                "the L1 pool's DRAM is taken as paid by the node's price "
                "(prices.dram_gb_month would price it)"
            )
        elif res.dram_gb is None:
            unknown.append("the L1 pool's size")
        else:
            parts["dram"] = prices.dram_gb_month * res.dram_gb / HOURS_PER_MONTH
    if uses_nvme:
        if prices.nvme_tb_month is None:
            notes.append(
                "the L2 NVMe is taken as paid by the node's price (prices.nvme_tb_month would price it)"
            )
        elif res.nvme_tb is None:
            unknown.append("the L2 capacity")
        else:
            parts["nvme"] = prices.nvme_tb_month * res.nvme_tb / HOURS_PER_MONTH
    if prices.kwh is not None:
        if gpu_power_w is None:
            unknown.append("the GPU energy (no GPU power telemetry)")
        else:
            parts["energy"] = prices.kwh * gpu_power_w / 1000.0
    if unknown:
        notes.append("no cost: " + ", ".join(unknown) + " unknown")
    per_hour = None if missing or unknown else sum(parts.values())

    def per_million(rate: float | None) -> float | None:
        if per_hour is None or not rate:
            return None
        return per_hour / (rate * 3600.0) * 1e6

    tok = None if goodput is None else goodput.tokens_per_s
    out = None if goodput is None else goodput.completion_tokens_per_s
    return Cost(
        per_hour, parts, per_million(tok), per_million(out), energy_kwh_per_mtok, bound, missing, notes
    )
