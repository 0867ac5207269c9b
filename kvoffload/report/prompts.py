"""Shared-prefix reuse per cell: the replayed prompts, rebuilt from the cell's dataset, as token ids.

The report's IO edge for `kvoffload.analysis.reuse.records_prefix_reuse`: each request record names its
conversation (session_id), chunk and round; the prompt it sent is that virtual user's call at that round,
rendered as the replay client renders it (`kvoffload.tokenizer.render_chat`) and tokenized message by
message with the model's own tokenizer when one is on this machine, the fallback tokenizer otherwise
(the figure is approximate then, like the ISL filter's counts). A dataset that is not on this machine
(the report is built elsewhere) or that does not load leaves the figure null, with a note.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from kvoffload.analysis.reuse import records_prefix_reuse
from kvoffload.datasets import Call, load_dataset, virtual_users
from kvoffload.errors import UserError
from kvoffload.tokenizer import GENERATION_PROMPT, Tokenizer, load_tokenizer, render_message


class _Prompts:
    """Token ids of the calls of one dataset at one num_rounds, memoised per message."""

    def __init__(self, calls: dict[tuple[str, int, int], Call], tokenizer: Tokenizer) -> None:
        self._calls = calls
        self._tokenizer = tokenizer
        self._memo: dict[str, list[int]] = {}

    def _ids(self, text: str) -> list[int]:
        ids = self._memo.get(text)
        if ids is None:
            ids = self._memo[text] = self._tokenizer.encode(text)
        return ids

    def __call__(self, session: str, chunk: int, rnd: int) -> Sequence[int] | None:
        call = self._calls.get((session, chunk, rnd))
        if call is None:
            return None
        out: list[int] = []
        for message in call.messages:
            out += self._ids(render_message(message))
        return out + self._ids(GENERATION_PROMPT)


def shared_prefix_reuse(
    cells: pd.DataFrame, requests: pd.DataFrame
) -> dict[str, tuple[float | None, str | None]]:
    """cell_id -> (shared-prefix reuse share, why it is null or None)."""
    loaded: dict[tuple[str, str, int, str], _Prompts | str] = {}
    by_cell = {str(k): g for k, g in requests.groupby("cell_id", sort=False)}
    out: dict[str, tuple[float | None, str | None]] = {}
    for _, cell in cells.iterrows():
        cid = str(cell["cell_id"])
        code, path = cell.get("dataset_code"), cell.get("dataset_path")
        if not isinstance(code, str) or not isinstance(path, str) or not code or not path:
            out[cid] = (None, "the cell names no dataset")
            continue
        key = (code, path, int(cell["num_rounds"]), str(cell["model"]))
        if key not in loaded:
            loaded[key] = _load(*key)
        prompts = loaded[key]
        if isinstance(prompts, str):
            out[cid] = (None, prompts)
            continue
        value = records_prefix_reuse(by_cell.get(cid, requests.iloc[0:0]), prompts)
        out[cid] = (value, None if value is not None else "some request matches no call of the dataset")
    return out


def _load(code: str, path: str, num_rounds: int, model: str) -> _Prompts | str:
    if not Path(path).exists():
        return f"dataset {path} is not on this machine"
    try:
        sessions = load_dataset(code, path)
    except UserError as exc:
        return f"dataset {path} does not load ({exc})"
    calls = {
        (u.session_id, u.chunk, r): call
        for u in virtual_users(sessions, code, num_rounds, min_chunk_rounds=1)
        for r, call in enumerate(u.calls, start=1)
    }
    return _Prompts(calls, load_tokenizer(model))
