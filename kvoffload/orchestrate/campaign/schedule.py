"""Which node runs which cells, and in which order (docs/architecture.md sections 3 and 5).

A run is node-local, and a tier comparison never mixes hardware: every cell of a comparison group
(the cells that differ only in tier), and of its repeats, runs on one node. Groups are spread over the
nodes so that their expected work is balanced (longest first, onto the least loaded node; ties go to
the earlier node, so the plan is the same every time). On a node, cells run repeat by repeat, and
within a repeat tier by tier, so that cells sharing an engine configuration follow each other and the
engines restart only when the tier changes; within a tier the campaign's order is kept. The tier order
turns round between repeats (gpu, cpu, nvme; then nvme, cpu, gpu; ...): a tier is not always the first
on fresh engines or the last after the node has run for a while, and the repeat boundary keeps its tier
(the engines are reset there, not redeployed). Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvoffload.config import Cell
from kvoffload.config.campaign import TIER_ORDER

# The keys a comparison group holds fixed (kvoffload/analysis/compare.py GROUP_KEYS, the model being
# the campaign's own) but the repeat: the repeats of a group run on its node too, so that the report's
# confidence intervals across repeats never mix hardware either.
GROUP_KEYS = ("concurrency", "num_rounds", "isl", "osl")


def group_key(cell: Cell) -> tuple[object, ...]:
    return tuple(cell.config[k] for k in GROUP_KEYS)


def tier_turn(tier: str, repeat: int) -> int:
    """A tier's place in its repeat: TIER_ORDER on odd repeats, reversed on even ones."""
    place = TIER_ORDER.index(tier)
    return place if repeat % 2 else len(TIER_ORDER) - 1 - place


@dataclass(frozen=True)
class NodePlan:
    """The cells one node runs, in order."""

    node: str
    cells: tuple[Cell, ...]

    @property
    def groups(self) -> int:
        return len({group_key(c) for c in self.cells})


def schedule(
    cells: Sequence[Cell],
    nodes: Sequence[str],
    cost: Callable[[Cell], float] | None = None,
    repeat_order: str = "turned",
) -> list[NodePlan]:
    """Every node's cells (a node with no group gets an empty plan). `cost` estimates a cell's work
    (for example its requests); by default every cell costs the same. `repeat_order` (the campaign's):
    "turned" runs repeat by repeat with the tier order turned round (module docstring); "together" runs
    a cell's repeats back to back, tier by tier (the engines reset between them, never redeployed)."""
    if not nodes:
        raise ValueError("schedule needs at least one node")
    weigh = cost or (lambda _cell: 1.0)
    groups: dict[tuple[object, ...], list[Cell]] = {}
    for cell in cells:
        groups.setdefault(group_key(cell), []).append(cell)
    order = {key: i for i, key in enumerate(groups)}
    load = dict.fromkeys(nodes, 0.0)
    assigned: dict[str, list[tuple[object, ...]]] = {node: [] for node in nodes}
    # Longest processing time first: the heaviest group goes to the node with the least work so far.
    by_weight = sorted(groups, key=lambda key: (-sum(weigh(c) for c in groups[key]), order[key]))
    for key in by_weight:
        node = min(nodes, key=lambda n: (load[n], nodes.index(n)))
        assigned[node].append(key)
        load[node] += sum(weigh(c) for c in groups[key])
    plans = []
    for node in nodes:
        mine = sorted(assigned[node], key=order.__getitem__)
        if repeat_order == "together":
            ordered = sorted(
                (cell for key in mine for cell in groups[key]),
                key=lambda c: (TIER_ORDER.index(c.tier), mine.index(group_key(c)), c.repeat),
            )
        else:
            ordered = sorted(
                (cell for key in mine for cell in groups[key]),
                key=lambda c: (c.repeat, tier_turn(c.tier, c.repeat), mine.index(group_key(c))),
            )
        plans.append(NodePlan(node, tuple(ordered)))
    return plans
