"""The campaign's latency target (`slo:`) and price list (`prices:`), and where a lab's prices come from.

Models only, plus one pure resolver: `Campaign` (config/campaign.py) holds an `Slo` and a `Prices`;
the decision analysis (kvoffload/analysis/decision.py) and the knee search (orchestrate/campaign/knee.py) read
the target from there, so both judge a concurrency by the same limits. Prices may instead come from the
inventory, as the variable `kvoffload_prices` of the `vllm` hosts (any layer: all.vars, group_vars/,
host_vars/), the same keys: a lab's prices belong to its hardware, so one campaign file can be run on
labs with different prices. Giving both, or different prices on two nodes, is an error naming both
places (`lab_prices`). Strict like every campaign model: unknown keys are errors, each field says what
it is, a rule that ties two keys names both. No file IO.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvoffload.config.errors import KeyedError

# The inventory variable that carries a lab's prices (docs/contracts.md "Campaign keys").
PRICES_VAR = "kvoffload_prices"
# Hours in a month, for the per-month prices of DRAM and NVMe: 365 x 24 / 12.
HOURS_PER_MONTH = 730.0
# Fewest later-round ok requests a level's steady window needs to be judged (kvoffload/analysis/steady.py):
# a p95 of fewer rests on one or two requests.
MIN_WINDOW_REQUESTS = 40
# The priced resources of `Prices`, in the order the report lists them.
PRICE_KEYS = ("node_hour", "gpu_hour", "dram_gb_month", "nvme_tb_month", "kwh")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


@dataclass(frozen=True)
class Limit:
    """One limit of a latency target: a later-round figure (`key`: ttft_p95 | ttft_p50 | tpot_p95 |
    hit_rate) and its threshold; `upper`: a figure above the threshold misses (else one below it)."""

    key: str
    threshold: float
    upper: bool
    words: str

    def missed(self, value: float) -> bool:
        return value > self.threshold if self.upper else value < self.threshold

    def text(self, value: float) -> str:
        """ "p95 TTFT 0.61 s > 0.5 s": how a figure missed this limit."""
        if self.key == "hit_rate":
            return f"{self.words} {100 * value:.0f} % < {100 * self.threshold:g} %"
        scale, unit = (1000.0, "ms") if self.key == "tpot_p95" else (1.0, "s")
        return f"{self.words} {scale * value:.3g} {unit} > {scale * self.threshold:g} {unit}"


# The words of each limit's figure, as judgements and the report name them.
LIMIT_WORDS = {"ttft_p95": "p95 TTFT", "ttft_p50": "p50 TTFT", "tpot_p95": "p95 TPOT", "hit_rate": "hit rate"}


@dataclass(frozen=True)
class Judgement:
    """Whether a level meets a target: True, False (a limit missed), or None (not judged: no limit
    missed, but a figure is unknown or the load was not held). `missed` and `unknown` name why."""

    meets: bool | None
    missed: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def judge(
    limits: Sequence[Limit], figures: Mapping[str, float | None], not_held: str | None = None
) -> Judgement:
    """The one judge of a level against a target (docs/metrics.md "Decision": "Meeting the target"),
    used by the knee search, the decision table, goodput's operating point and the plot. `figures`: the
    level's later-round figures by limit key (None: unknown), from its steady window; `not_held`: why
    the level's load was not held (analysis/steady.py), if it was not. A missed limit decides (whatever
    else is unknown); otherwise a level whose load was not held, or whose figure of a set limit is
    unknown, is not judged, and the judgement names what was missing."""
    missed, unknown = [], []
    for lim in limits:
        value = figures.get(lim.key)
        if value is None:
            unknown.append(lim.words)
        elif lim.missed(value):
            missed.append(lim.text(value))
    if not_held is not None:
        # the figures of a load not held are unknown for that reason alone: name only it
        unknown = [
            f"a held load ({not_held})",
            *([] if all(figures.get(k.key) is None for k in limits) else unknown),
        ]
    if missed:
        return Judgement(False, missed, unknown)
    return Judgement(None if unknown else True, missed, unknown)


class Slo(_Strict):
    """The latency target a tier must meet at a concurrency: later rounds (>= 2) only, as the findings
    judge them. The knee search ramps until a concurrency misses it; the report's decision table gives
    each tier's sessions at it."""

    ttft_p95_s: float = Field(
        gt=0, allow_inf_nan=False, description="later-round p95 TTFT (s) a concurrency may not exceed"
    )
    ttft_p50_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        examples=[0.2],
        description="later-round p50 TTFT (s) a concurrency may not exceed (optional)",
    )
    tpot_p95_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        examples=[0.05],
        description="later-round p95 time per output token (s) a concurrency may not exceed (optional)",
    )
    min_later_hit_rate: float | None = Field(
        default=None,
        gt=0,
        le=1,
        allow_inf_nan=False,
        examples=[0.5],
        description="later-round prefix hit rate (0-1, cached / prompt tokens of rounds >= 2) a "
        "concurrency may not fall below (optional)",
    )
    min_window_requests: int = Field(
        default=MIN_WINDOW_REQUESTS,
        ge=1,
        examples=[40],
        description="fewest later-round requests in a cell's steady window (the span that held its load) "
        "for its level to be judged",
    )

    @model_validator(mode="after")
    def _p50_within_p95(self) -> Slo:
        if self.ttft_p50_s is not None and self.ttft_p50_s > self.ttft_p95_s:
            raise KeyedError(
                "ttft_p50_s",
                f"{self.ttft_p50_s:g} s is above ttft_p95_s {self.ttft_p95_s:g} s: a median cannot exceed "
                "the 95th percentile, so the p95 limit could never bind; lower ttft_p50_s or raise "
                "ttft_p95_s",
            )
        return self

    def limits(self) -> list[Limit]:
        """The limits this target sets, p95 TTFT first."""
        out = [Limit("ttft_p95", self.ttft_p95_s, True, LIMIT_WORDS["ttft_p95"])]
        if self.ttft_p50_s is not None:
            out.append(Limit("ttft_p50", self.ttft_p50_s, True, LIMIT_WORDS["ttft_p50"]))
        if self.tpot_p95_s is not None:
            out.append(Limit("tpot_p95", self.tpot_p95_s, True, LIMIT_WORDS["tpot_p95"]))
        if self.min_later_hit_rate is not None:
            out.append(Limit("hit_rate", self.min_later_hit_rate, False, LIMIT_WORDS["hit_rate"]))
        return out

    def limits_text(self) -> str:
        """ "p95 TTFT <= 0.5 s, p50 TTFT <= 0.2 s, hit rate >= 50 %" (later rounds)."""
        parts = [f"p95 TTFT <= {self.ttft_p95_s:g} s"]
        if self.ttft_p50_s is not None:
            parts.append(f"p50 TTFT <= {self.ttft_p50_s:g} s")
        if self.tpot_p95_s is not None:
            parts.append(f"p95 TPOT <= {1000 * self.tpot_p95_s:g} ms")
        if self.min_later_hit_rate is not None:
            parts.append(f"hit rate >= {100 * self.min_later_hit_rate:g} %")
        return ", ".join(parts)


def _price(description: str, example: float | None = None) -> Any:
    """One optional price of `Prices`: not negative, finite (`example`: where no example file has one)."""
    examples = None if example is None else [example]
    return Field(default=None, ge=0, allow_inf_nan=False, examples=examples, description=description)


class Prices(_Strict):
    """What a node's resources cost, each optional and used only where a tier uses that resource
    (docs/metrics.md "Decision"). All in one currency."""

    node_hour: float | None = _price(
        "one node for one hour (rented, or its purchase amortized), everything in it that the other "
        "prices do not price separately",
        30.0,
    )
    gpu_hour: float | None = _price("one GPU for one hour, counted per GPU the cell's replicas use")
    dram_gb_month: float | None = _price(
        "one GB (10^9 bytes) of host DRAM for one month, counted for the LMCache L1 pool the cpu and nvme "
        "tiers reserve (leave out when node_hour already pays for it)"
    )
    nvme_tb_month: float | None = _price(
        "one TB (10^12 bytes) of NVMe for one month, counted for the nvme tier's L2 capacity (leave out "
        "when node_hour already pays for it)"
    )
    kwh: float | None = _price("one kWh of energy, counted for the GPU energy the cells measured", 0.15)
    currency: str = Field(
        default="USD",
        min_length=1,
        max_length=8,
        examples=["EUR"],
        description="the prices' currency, as the report names it",
    )
    example: bool = Field(
        default=False, description="true: these are example prices, and the report says so beside each cost"
    )

    @model_validator(mode="after")
    def _a_price(self) -> Prices:
        if all(getattr(self, k) is None for k in PRICE_KEYS):
            raise KeyedError(
                "node_hour", f"give at least one price ({', '.join(PRICE_KEYS)}), or leave out prices"
            )
        return self


def lab_prices(
    campaign_prices: Prices | None,
    campaign_where: str,
    nodes: Sequence[tuple[str, Mapping[str, Any], str]],
) -> tuple[Prices | None, str | None]:
    """The prices of a run and where they come from: the campaign's `prices`, or the `kvoffload_prices`
    variable of the nodes. `nodes` are (host name, its resolved variables, where its `kvoffload_prices`
    is written, e.g. "hosts.yml: all.vars.kvoffload_prices"). Raises KeyedError (key = the place at
    fault) when both give prices, when two nodes' prices differ, or when a node's are not valid."""
    found: list[tuple[str, Prices, str]] = []
    for host, variables, where in nodes:
        raw = variables.get(PRICES_VAR)
        if raw is None:
            continue
        if not isinstance(raw, Mapping):
            raise KeyedError(where, f"host {host}: {PRICES_VAR} must be a mapping of prices, got {raw!r}")
        try:
            found.append((host, Prices.model_validate(dict(raw)), where))
        except ValidationError as exc:
            first = exc.errors()[0]
            key = ".".join(str(p) for p in first["loc"])
            raise KeyedError(where, f"host {host}: {key}: {first['msg']}") from exc
    if not found:
        return campaign_prices, None if campaign_prices is None else campaign_where
    host, prices, where = found[0]
    for other, theirs, there in found[1:]:
        if theirs != prices:
            raise KeyedError(
                there,
                f"host {other}'s {PRICES_VAR} differs from host {host}'s ({where}): the cells of one "
                "sweep may run on either node, so give every node of the lab one price list",
            )
    if campaign_prices is not None:
        raise KeyedError(
            campaign_where,
            f"prices are given twice: here and as {PRICES_VAR} of the nodes ({where}); keep one (a lab's "
            "prices usually belong in its inventory, the campaign file then runs on any lab)",
        )
    return prices, where


def missing_prices(prices: Prices | None, tiers: Sequence[str]) -> list[str]:
    """What the decision table's cost column would lack for these tiers (`plan` warns with it): per
    resource a tier uses, the price that pays for it. node_hour pays for everything in the node; without
    it, GPUs need gpu_hour, the cpu and nvme tiers' L1 pool dram_gb_month, the nvme tier's L2
    nvme_tb_month. Empty when nothing is missing."""
    if prices is None:
        return [
            "no prices (campaign `prices:` or the nodes' kvoffload_prices): the decision table shows "
            "sessions at the target, goodput and energy, and no cost per million tokens; give node_hour or "
            "gpu_hour"
            + (", dram_gb_month" if any(t in ("cpu", "nvme") for t in tiers) else "")
            + (", nvme_tb_month" if "nvme" in tiers else "")
        ]
    if prices.node_hour is not None:
        return []
    out = []
    if prices.gpu_hour is None:
        out.append("prices: neither node_hour nor gpu_hour is given, so no tier has a cost per 1M tokens")
    if prices.dram_gb_month is None and any(t in ("cpu", "nvme") for t in tiers):
        out.append(
            "prices: no dram_gb_month (nor node_hour): the cpu and nvme tiers' L1 pool is left out of their "
            "cost, which then understates it"
        )
    if prices.nvme_tb_month is None and "nvme" in tiers:
        out.append(
            "prices: no nvme_tb_month (nor node_hour): the nvme tier's L2 is left out of its cost, which "
            "then understates it"
        )
    return out
