"""CellPools: the requests a cell sends and the probe of its cold check, from the dataset on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvoffload.config import LabConfig, load_lab
from kvoffload.datasets import load_dataset
from kvoffload.orchestrate.campaign import pools
from kvoffload.orchestrate.campaign.pools import CellPools
from kvoffload.replay.users import select_users
from kvoffload.tokenizer import load_tokenizer
from tests.support.campaigns import sim_campaign, write_dataset, write_yaml

EXAMPLE = Path(__file__).resolve().parents[3] / "inventories" / "example" / "hosts.yml"


def _lab(tmp_path: Path, **campaign: Any) -> LabConfig:
    """The example's lab with a small generic dataset here: 3 sessions of 10 calls."""
    data = write_dataset(tmp_path, sessions=3)
    spec = sim_campaign(
        "poolstest",
        sim_profile="h200-qwen3-8b",
        dataset={"code": "generic", "path": str(data)},
        tiers=["gpu"],
        num_rounds=[5, 10],
        **campaign,
    )
    return load_lab(EXAMPLE, write_yaml(tmp_path / "campaign.yml", spec))


def test_expected_is_the_users_rounds_and_the_dataset_loads_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lab = _lab(tmp_path)
    loads: list[str] = []

    def counting(code: str, path: Path | str) -> Any:
        loads.append(code)
        return load_dataset(code, path)

    monkeypatch.setattr(pools, "load_dataset", counting)
    cells = CellPools(lab)
    sessions = load_dataset("generic", tmp_path / "data")
    for cell in lab.cells:
        users = select_users(
            sessions, "generic", cell.num_rounds, isl=cell.isl, tokenizer=load_tokenizer("m")
        )
        assert users.users and cells.expected(cell) == len(users.users) * cell.num_rounds
    assert loads == ["generic"]
    # sessions the caller loaded already are not loaded again
    loads.clear()
    given = CellPools(lab, sessions)
    assert [given.expected(c) for c in lab.cells] == [cells.expected(c) for c in lab.cells]
    assert loads == []


def test_the_probe_is_a_sent_request_cut_to_one_token(tmp_path: Path) -> None:
    lab = _lab(tmp_path)
    cell = next(c for c in lab.cells if c.num_rounds == 5)
    probe = CellPools(lab).probe(cell)
    assert probe is not None
    assert probe["model"] == lab.served_model_name and probe["max_tokens"] == 1 and probe["stream"] is True
    # the last user's last round: session s2's fifth call (chunks of 5 of 10-call sessions, in order)
    questions = [m["content"] for m in probe["messages"] if m["role"] == "user"]
    assert questions[-1] == "question 9" and probe["messages"][0]["content"] == "session 2"
    # with a duration the replay may stop early: the first user's, which always runs
    timed = _lab(tmp_path, duration_s=60)
    first = CellPools(timed).probe(next(c for c in timed.cells if c.num_rounds == 5))
    assert first is not None and first["messages"][0]["content"] == "session 0"
    assert [m["content"] for m in first["messages"] if m["role"] == "user"][-1] == "question 4"


def test_a_cell_without_users_sends_nothing_and_has_no_probe(tmp_path: Path) -> None:
    lab = _lab(tmp_path, isl=1)  # every user's context is longer than one token
    cell = lab.cells[0]
    assert CellPools(lab).expected(cell) == 0
    assert CellPools(lab).probe(cell) is None
