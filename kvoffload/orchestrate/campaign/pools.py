"""Each cell's virtual users, on the controller: what a cell will send and the request that proves it cold.

Orchestration layer, below the CLI (`run` and `plan` build one `CellPools` per lab) and beside
`CampaignRunner`, which takes its two methods as callbacks: `expected` (the requests a cell sends: the
progress display, the node schedule, the wall-time estimate) and `probe` (the request that proves a
reset cell cold, kvoffload/orchestrate/cell/coldstart.py). Reads the campaign's dataset from this machine
(once, unless the caller has loaded it already) and selects users as the replay on the client will
(kvoffload/replay/users.py); never touches a host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvoffload.config import Cell, LabConfig
from kvoffload.datasets import Session, VirtualUser, load_dataset
from kvoffload.replay.command import is_gpt_oss
from kvoffload.replay.requests import RequestOptions, build_payload
from kvoffload.replay.users import UserPool, select_users
from kvoffload.tokenizer import load_tokenizer


class CellPools:
    """Each cell's virtual users, computed once per shape (num_rounds, isl): the requests a cell will
    send and the probe that proves a reset cell cold (a request the cell sent: its last user's last
    round, the most recent and the longest)."""

    def __init__(self, lab: LabConfig, sessions: Sequence[Session] | None = None) -> None:
        self.lab = lab
        self.sessions: list[Session] = list(sessions or [])
        self._pools: dict[tuple[int, int], UserPool] = {}

    def _pool(self, cell: Cell) -> UserPool:
        key = (cell.num_rounds, cell.isl)
        if key not in self._pools:
            if not self.sessions:
                self.sessions.extend(load_dataset(self.lab.campaign.dataset.code, self.lab.dataset_path))
            self._pools[key] = select_users(
                self.sessions,
                self.lab.campaign.dataset.code,
                cell.num_rounds,
                isl=cell.isl,
                tokenizer=load_tokenizer(self.lab.campaign.model),
                max_sessions=self.lab.campaign.max_sessions,
            )
        return self._pools[key]

    def expected(self, cell: Cell) -> int:
        """The requests the cell sends: its virtual users times its rounds."""
        return len(self._pool(cell).users) * cell.num_rounds

    def users(self, cell: Cell) -> tuple[VirtualUser, ...]:
        """The virtual users the cell's replay runs, in order (the run-time estimate plays them)."""
        return self._pool(cell).users

    def probe(self, cell: Cell) -> dict[str, Any] | None:
        """The payload of the cold check's probe request (None: the cell has no users)."""
        users = self._pool(cell).users
        if not users:
            return None
        gpt_oss = is_gpt_oss(self.lab.served_model_name)
        options = RequestOptions(
            model=self.lab.served_model_name,
            osl=1,
            sanitize_harmony_tokens=gpt_oss,
            agentic_tools=gpt_oss,
            ask_mode=gpt_oss,
        )
        # a replay cut short by duration_s may never reach the last user; the first one always runs
        user = users[0] if self.lab.campaign.duration_s else users[-1]
        payload: dict[str, Any] = build_payload(user.calls[-1], options)
        return payload
