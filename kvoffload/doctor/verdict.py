"""One doctor check's verdict and how verdicts combine: the base every doctor module builds on.

Pure data (no IO): kvoffload/doctor/checks.py (the node's records and the controller's checks),
smoke.py, jit.py and pair_cellfree.py (the verdicts on recorded facts) all build `Check`s; nothing here
imports them back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


# worst first: a node's status is the worst of its checks' (a skip counts only when all are skips)
_RANK = {Status.FAIL: 0, Status.WARN: 1, Status.OK: 2, Status.SKIP: 3}


def worst(statuses: Iterable[Status]) -> Status:
    return min(statuses, key=_RANK.__getitem__, default=Status.SKIP)


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""
    facts: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Check:
        """A check of the probe's JSON; an unknown status reads as fail (a newer probe, a garbled one)."""
        try:
            status = Status(str(raw.get("status")))
        except ValueError:
            status = Status.FAIL
        return cls(
            name=str(raw.get("name", "?")),
            status=status,
            detail=str(raw.get("detail", "")),
            fix=str(raw.get("fix", "")),
            facts=dict(raw.get("facts") or {}),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "status": str(self.status), "detail": self.detail}
        if self.fix:
            out["fix"] = self.fix
        if self.facts:
            out["facts"] = dict(self.facts)
        return out
