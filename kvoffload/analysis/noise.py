"""Whether a tier verdict stands above its noise: the repeats behind it, the repeats that would separate
it, and host CPU that differed between the cells being compared (docs/metrics.md "Noise").

Pure: numbers and summary rows in, numbers, dataclasses and warning rows out; no IO. Used by
kvoffload/analysis/findings.py (per finding), kvoffload/analysis/recommend.py (per level) and
kvoffload/analysis/compare.py (the `cpu_differs` warning). It must not import compare or findings
(both import it).

- A comparison rests on **one repeat** when a side of it (the tier's cells or gpu's) has one cell: its
  bootstrap interval then resamples that one run's sessions and cannot contain the run-to-run noise
  (host load, what else the machine ran, cache state) that flips a verdict between identical runs.
- A verdict is **within noise** when the 95 % interval of its change includes 0. The repeats that would
  separate it, with 80 % power at two-sided alpha 0.05: the smallest n with
  n > n0 x ((z(0.975) + z(0.80)) / z(0.975))^2 x (w / |e|)^2, n0 the repeats behind it, e the change,
  w the interval's half-width on the side towards 0 (the bootstrap's stand-in for z(0.975) x se; an
  interval narrows as 1/sqrt(repeats)). Strictly greater: at equality the change stands just that many
  standard errors from 0, not beyond (at 50 % power, an interval ending on 0). Within noise w >= |e|, so
  n > 2 n0 always. Null without an interval or with a change of exactly 0.
- Host CPU **differs widely** when one role's CPU utilization (the client host's, the node's, any other
  sampled host's) spans WIDE_CPU_SPREAD_PCT points or more between the cells of one comparison group.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import pandas as pd

# Points of CPU utilization between the cells of one group from which the host's load, not the tier,
# may explain a TTFT difference. Why 25: a task waiting for a core waits about u / (1 - u) service
# times at utilization u (M/M/1, a model, not a measurement); 25 points more multiplies that wait by at
# least 2.7 whatever the lower level (the least at u = 0.375: 0.625 x 0.625 / (0.375 x 0.375)), from
# 1.0 at 50 % to 3.0 at 75 %, more than the tiers' differences the findings weigh at low load.
WIDE_CPU_SPREAD_PCT = 25.0

# The power at which `repeats_to_separate` counts (the usual 80 %: a change that holds is separated in 4
# campaigns of 5), and z(0.975), what the 95 % interval's half-width stands for in standard errors.
SEPARATE_POWER = 0.80
_Z_CI = NormalDist().inv_cdf(0.975)


def one_repeat(repeats: int, base_repeats: int | None) -> bool:
    """Whether a comparison rests on one repeat: a side (the tier's cells, gpu's) has a single cell."""
    return min(repeats, base_repeats if base_repeats is not None else repeats) == 1


def within_noise(ci: Sequence[float] | None) -> bool | None:
    """True when the 95 % interval of a change includes 0, False when it excludes it, None without one."""
    if ci is None:
        return None
    return bool(ci[0] <= 0.0 <= ci[1])


def repeats_to_separate(
    estimate: float | None, ci: Sequence[float] | None, repeats: int, power: float = SEPARATE_POWER
) -> int | None:
    """The repeats per cell at which a change `estimate` (%) with interval `ci` from `repeats` repeats
    would leave 0 outside its 95 % interval with probability `power` (module docstring); None without
    an interval, with a change of 0, or when the interval already excludes 0."""
    if estimate is None or ci is None or estimate == 0.0 or not within_noise(ci):
        return None
    toward_zero = ci[1] - estimate if estimate < 0 else estimate - ci[0]
    z_power = NormalDist().inv_cdf(power)
    bound = repeats * ((_Z_CI + z_power) / _Z_CI) ** 2 * (toward_zero / abs(estimate)) ** 2
    # the smallest integer strictly above the bound: at a whole-number bound the change would stand only
    # z(0.975) + z(power) standard errors from 0, not beyond (ceil stopped there, one short)
    return math.floor(bound) + 1


def noise_text(estimate: float | None, ci: Sequence[float] | None, repeats: int) -> str:
    """ "within noise: about N repeats per cell ... would separate it with 80 % power" for a change inside
    its noise; "" for one outside it or without an interval."""
    if not within_noise(ci):
        return ""
    n = repeats_to_separate(estimate, ci, repeats)
    if n is None:
        return "within noise: the change is 0, and no number of repeats separates it"
    return (
        f"within noise: about {n} repeats per cell (campaign `repeats: {n}`, now {repeats}) would "
        f"separate it with {SEPARATE_POWER * 100:.0f} % power if the change holds"
    )


def one_repeat_text(has_interval: bool, counted: bool) -> str:
    """The caveat of a comparison resting on one repeat; `has_interval`: the change has a bootstrap
    interval; `counted`: a repeat count was just given, which one repeat can only give as a lower bound."""
    noise = "the run-to-run noise (host load, cache state)"
    if has_interval:
        held = f"the interval holds this run's sessions, not {noise}, which this campaign cannot judge"
    else:
        held = f"{noise} is not measured, and this campaign cannot judge it"
    bound = ", so that count is a lower bound" if counted else ""
    return f"one repeat per cell: {held}{bound}; set `repeats` to 2 or more to measure it"


@dataclass(frozen=True)
class CpuSpread:
    """One role's CPU utilization over the cells of a group: lowest and highest, with their cells."""

    role: str  # "client", "node", "client and node", or "host <name>" for another sampled host
    low_pct: float
    high_pct: float
    low_cell: str
    high_cell: str
    cells: int

    @property
    def spread_pct(self) -> float:
        return self.high_pct - self.low_pct

    @property
    def wide(self) -> bool:
        return self.spread_pct >= WIDE_CPU_SPREAD_PCT

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "spread_pct": self.spread_pct, "wide": self.wide}

    def text(self) -> str:
        who = f"the {self.role} host's" if not self.role.startswith("host ") else f"{self.role}'s"
        return (
            f"{who} CPU utilization ranged {self.low_pct:.0f}-{self.high_pct:.0f} % between this group's "
            f"cells ({self.low_cell} {self.low_pct:.0f} %, {self.high_cell} {self.high_pct:.0f} %; "
            f"{WIDE_CPU_SPREAD_PCT:.0f} points or more is wide): a TTFT difference between them may be the "
            "host's load, not the tier's"
        )


def _role(host: str, row: pd.Series) -> str:
    client, node = row.get("client"), row.get("node")
    is_client = isinstance(client, str) and host == client
    is_node = isinstance(node, str) and host == node
    if is_client and is_node:
        return "client and node"
    return "client" if is_client else "node" if is_node else f"host {host}"


def cpu_spreads(rows: pd.DataFrame) -> list[CpuSpread]:
    """Per role, the CPU utilization spread over `rows` (summary rows with `cpu_util_pct_by_host`,
    `client`, `node`); roles sampled in fewer than two cells are left out."""
    seen: dict[str, list[tuple[float, str]]] = {}
    if "cpu_util_pct_by_host" not in rows:
        return []
    for _, row in rows.iterrows():
        text = row.get("cpu_util_pct_by_host")
        if not isinstance(text, str) or not text:
            continue
        for host, pct in json.loads(text).items():
            if not isinstance(pct, int | float) or not math.isfinite(pct):
                continue  # a host without a figure (JSON null, NaN) has no place in a spread
            seen.setdefault(_role(str(host), row), []).append((float(pct), str(row["cell_id"])))
    out = []
    for role, values in sorted(seen.items()):
        if len(values) < 2:
            continue
        low, high = min(values), max(values)
        out.append(CpuSpread(role, low[0], high[0], low[1], high[1], len(values)))
    return out


def cpu_warnings(
    summary: pd.DataFrame, keys: list[str], label: Callable[[pd.Series], str]
) -> list[dict[str, Any]]:
    """One `cpu_differs` group warning (analysis/compare.py WARNING_COLUMNS) per role whose CPU spans
    WIDE_CPU_SPREAD_PCT or more between the cells of a group of `keys` (the repeats pooled, as the
    findings pool them), labelled by `label` of its first row."""
    out: list[dict[str, Any]] = []
    if summary.empty or "cpu_util_pct_by_host" not in summary:
        return out
    for _, rows in summary.groupby(keys, sort=False, dropna=False):
        for s in cpu_spreads(rows):
            if s.wide:
                group = re.sub(r" repeat=\S+", "", label(rows.iloc[0]))
                out.append(
                    {
                        "scope": "group",
                        "cell_id": None,
                        "group": group,
                        "kind": "cpu_differs",
                        "message": s.text(),
                    }
                )
    return out
