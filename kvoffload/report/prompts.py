"""Shared-prefix reuse per cell: the replayed prompts, rebuilt from the cell's dataset, as token ids.

The report's IO edge for `kvoffload.analysis.reuse.records_prefix_reuse`: each request record names its
conversation (session_id), chunk and round; the prompt it sent is that virtual user's call at that round,
rendered as the replay client renders it (`kvoffload.tokenizer.render_chat`) and tokenized message by
message with the model's own tokenizer when one is on this machine, the fallback tokenizer otherwise
(the figure is approximate then, like the ISL filter's counts). A dataset that is not on this machine
(the report is built elsewhere) or that does not load leaves the figure null, with a note.

Where the dataset is (`locate_dataset`): a cell records `dataset.path` as the campaign file wrote it,
often relative to that file ("../../data/tau2-bench"), which means nothing from the working directory
of the report (issue 43: every cell of the demo said "not on this machine"). campaign.json `dataset`
keeps the absolute path the run resolved and the dataset's digest (kvoffload/datasets/digest.py); the
report tries that path, the cell's own path if absolute, then relative to the campaign file and to the
working directory, and takes the first copy whose digest is the recorded one (any existing copy when
the run recorded no digest: campaign.json files before it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from kvoffload.analysis.reuse import records_prefix_reuse
from kvoffload.datasets import Call, load_dataset, virtual_users
from kvoffload.datasets.digest import dataset_digest
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


def _recorded(campaign: Mapping[str, Any], code: str, path: str) -> tuple[str | None, str | None]:
    """(absolute path, digest) campaign.json `dataset` recorded for the cells' dataset (code, path as
    written), or Nones: no record (files before it) or another dataset's."""
    record = campaign.get("dataset")
    if not isinstance(record, dict) or record.get("code") != code:
        return None, None
    written = ((campaign.get("campaign") or {}).get("dataset") or {}).get("path")
    if written is not None and written != path:
        return None, None
    at, digest = record.get("path"), record.get("digest")
    return (at if isinstance(at, str) else None), (digest if isinstance(digest, str) else None)


def _candidates(path: str, recorded: str | None, campaign: Mapping[str, Any]) -> list[Path]:
    """Where the dataset may be, most trusted first, without repeats."""
    written = Path(path).expanduser()
    out = [Path(recorded)] if recorded else []
    if written.is_absolute():
        out.append(written)
    else:
        campaign_file = campaign.get("campaign_file")
        if isinstance(campaign_file, str) and campaign_file:
            out.append(Path(campaign_file).expanduser().parent / written)
        out.append(written)
    return list(dict.fromkeys(Path(p).resolve() if p.exists() else p for p in out))


def locate_dataset(code: str, path: str, campaign: Mapping[str, Any]) -> Path | str:
    """The dataset of the cells (code, `path` as the campaign wrote it) on this machine, or why it is
    not found (module doc)."""
    recorded, digest = _recorded(campaign, code, path)
    tried = []
    for candidate in _candidates(path, recorded, campaign):
        if not candidate.exists():
            tried.append(f"{candidate} (absent)")
            continue
        if digest is None:
            return candidate
        try:
            found = dataset_digest(candidate)
        except OSError as exc:
            tried.append(f"{candidate} (unreadable: {exc})")
            continue
        if found == digest:
            return candidate
        tried.append(f"{candidate} (another digest, {found})")
    wanted = f" with digest {digest}" if digest else ""
    return f"dataset {path}{wanted} is not on this machine (tried {'; '.join(tried)})"


def shared_prefix_reuse(
    cells: pd.DataFrame, requests: pd.DataFrame, campaign: Mapping[str, Any] | None = None
) -> dict[str, tuple[float | None, str | None]]:
    """cell_id -> (shared-prefix reuse share, why it is null or None); `campaign`: campaign.json, which
    says where the run found the dataset and its digest (module doc)."""
    loaded: dict[tuple[str, str, int, str], _Prompts | str] = {}
    found: dict[tuple[str, str], Path | str] = {}
    by_cell = {str(k): g for k, g in requests.groupby("cell_id", sort=False)}
    out: dict[str, tuple[float | None, str | None]] = {}
    for _, cell in cells.iterrows():
        cid = str(cell["cell_id"])
        code, path = cell.get("dataset_code"), cell.get("dataset_path")
        if not isinstance(code, str) or not isinstance(path, str) or not code or not path:
            out[cid] = (None, "the cell names no dataset")
            continue
        if (code, path) not in found:
            found[code, path] = locate_dataset(code, path, campaign or {})
        where = found[code, path]
        if isinstance(where, str):
            out[cid] = (None, where)
            continue
        key = (code, str(where), int(cell["num_rounds"]), str(cell["model"]))
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
