"""docs/campaign.md and docs/inventory.md are what kvoffload/cli/keydoc.py writes from the models, and
each key's block says its type, default, meaning and example (from the field or from an example file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field, PositiveInt

from kvoffload.cli import keydoc
from kvoffload.cli.keydoc import (
    CAMPAIGN_DOC,
    INVENTORY_DOC,
    REGENERATE,
    Examples,
    KeyDoc,
    build_docs,
    campaign_doc,
    inventory_doc,
    render,
    type_words,
)

ROOT = Path(__file__).resolve().parents[3]


def _keys(*docs: Any) -> dict[str, KeyDoc]:
    return {k.key: k for doc in docs for s in doc.sections for k in s.keys}


@pytest.mark.parametrize("index", [0, 1], ids=[CAMPAIGN_DOC, INVENTORY_DOC])
def test_committed_docs_equal_the_models(index: int) -> None:
    doc = build_docs(ROOT)[index]
    path = ROOT / doc.path
    assert path.is_file(), f"{doc.path} is missing: regenerate it with {REGENERATE}"
    assert path.read_text() == render(doc), (
        f"{doc.path} differs from the models: regenerate it with {REGENERATE}"
    )


def test_every_key_has_an_example() -> None:
    missing = [k.key for k in _keys(*build_docs(ROOT)).values() if k.example is None]
    assert missing == [], (
        f"keys without an example: {missing}; give the Field `examples=[...]` (or the key to an example "
        f"file under inventories/), then {REGENERATE}"
    )


@pytest.fixture
def examples(tmp_path: Path) -> Examples:
    """Example files of a repository of our own: a campaign file and an inventory with a campaign."""
    (tmp_path / "inventories" / "lab").mkdir(parents=True)
    campaign = {"name": "first", "concurrency": [4, 8], "knee_search": {"resolution": 16}}
    (tmp_path / "inventories" / "lab" / "campaign-a.yml").write_text(
        yaml.safe_dump(campaign, sort_keys=False)
    )
    hosts = {
        "all": {
            "vars": {"kvoffload_campaign": {"name": "second", "isl": 4096}},
            "hosts": {"g1": {"vllm_replicas": [{"index": 0}, {"index": 1, "gpus": "1,2"}]}},
            "children": {"vllm": {"vars": {"kvoffload_bind_all": True}, "hosts": {"g1": None}}},
        }
    }
    (tmp_path / "inventories" / "lab" / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return Examples.read(tmp_path)


def test_a_nested_key_with_an_example_from_a_file(examples: Examples) -> None:
    key = _keys(campaign_doc(examples))["knee_search.resolution"]
    assert (key.type, key.default, key.section) == ("positive integer", "`1`", "`knee_search`")
    assert (key.example, key.example_source) == ("resolution: 16", "inventories/lab/campaign-a.yml")
    assert keydoc.render_key(key).splitlines() == [
        "### `knee_search.resolution`",
        "",
        "stop bisecting once the knee's bracket is this narrow (in concurrency)",
        "",
        "- type: positive integer",
        "- default: `1`",
        "- example: `resolution: 16` (inventories/lab/campaign-a.yml)",
    ]


def test_a_required_list_key_and_the_first_file_that_gives_one(examples: Examples) -> None:
    keys = _keys(campaign_doc(examples))
    concurrency = keys["concurrency"]
    assert concurrency.type == "list of positive integers (at least 1)"
    assert concurrency.default == "required"
    assert concurrency.example == "concurrency: [4, 8]"
    # campaign files come before an inventory's all.vars.kvoffload_campaign
    assert (keys["name"].example, keys["name"].example_source) == (
        "name: first",
        "inventories/lab/campaign-a.yml",
    )
    assert (keys["isl"].example, keys["isl"].example_source) == ("isl: 4096", "inventories/lab/hosts.yml")
    assert keys["tiers"].type == "list of gpu|cpu|nvme (at least 1)"


def test_the_fields_own_example_wins_and_a_key_without_any_says_so(examples: Examples) -> None:
    keys = _keys(campaign_doc(examples))
    assert (keys["duration_s"].example, keys["duration_s"].example_source) == (
        "duration_s: 600",
        "the model's examples",
    )
    assert keys["honor_gaps"].example is None
    assert "- example: none in the example files" in keydoc.render_key(keys["honor_gaps"])


def test_inventory_keys_of_list_items_role_variables_and_model_variables(examples: Examples) -> None:
    keys = _keys(inventory_doc(examples, ROOT, frozenset({"kvoffload_tier"})))
    gpus = keys["vllm_replicas[].gpus"]
    assert (gpus.type, gpus.default) == ("string", "required")
    # the first replica without gpus is passed over for the first that has them
    assert (gpus.example, gpus.example_source) == ("gpus: '1,2'", "inventories/lab/hosts.yml")
    assert keys["vllm_replicas[].index"].type == "non-negative integer"
    # a shared role variable, typed and described by roles/kvoffload's argument spec, found in a group's vars
    bind_all = keys["kvoffload_bind_all"]
    assert (bind_all.type, bind_all.default, bind_all.example) == (
        "true or false",
        "`false`",
        "kvoffload_bind_all: true",
    )
    # one the orchestrator passes per cell is left out, and named as such
    assert "kvoffload_tier" not in keys
    shared = inventory_doc(examples, ROOT, frozenset({"kvoffload_tier"})).sections[-1]
    assert "Not listed: `kvoffload_tier`" in shared.intro
    assert "kvoffload_engine" in keys  # ...which holds only for the names passed
    # kvoffload_prices has the campaign's `prices` keys: no example here, so none in either
    assert keys["kvoffload_prices"].example is None


def test_a_variable_with_the_campaigns_model_takes_the_campaigns_example(tmp_path: Path) -> None:
    (tmp_path / "inventories" / "x").mkdir(parents=True)
    campaign = {"prices": {"gpu_hour": 2.5, "example": True}}
    (tmp_path / "inventories" / "x" / "campaign-p.yml").write_text(yaml.safe_dump(campaign, sort_keys=False))
    keys = _keys(inventory_doc(Examples.read(tmp_path), tmp_path, frozenset()))
    prices = keys["kvoffload_prices"]
    assert (prices.example, prices.example_source) == (
        "kvoffload_prices: {gpu_hour: 2.5, example: true}",
        "inventories/x/campaign-p.yml",
    )
    assert "docs/campaign.md, section `prices`" in prices.meaning


class _Item(BaseModel):
    size: PositiveInt = Field(description="how big")


class _Top(BaseModel):
    sets: dict[str, _Item] = Field(default={}, description="by name")
    items: list[_Item] | None = Field(default=None, description="in order")
    ratio: float | None = Field(default=None, gt=0, le=1, description="a share")


def test_the_walk_follows_lists_and_mappings_of_models() -> None:
    sections = keydoc.walk_model(_Top, "", "docs/x.md", "Top", lambda key, field: None)
    assert [s.title for s in sections] == ["Top", "`sets.<name>`", "`items[]`"]
    keys = _keys(*[type("D", (), {"sections": sections})])
    assert list(keys) == ["sets", "items", "ratio", "sets.<name>.size", "items[].size"]
    assert keys["sets"].type == "mapping of names to mappings (its keys follow)"
    assert keys["items"].type == "list of mappings (its keys follow)"
    assert (keys["ratio"].type, keys["ratio"].default) == ("number > 0, <= 1", "not set")
    assert keys["sets"].default == "`{}`"


@pytest.mark.parametrize(
    ("annotation", "words"),
    [
        (int, "integer"),
        (dict[str, Any], "mapping"),
        (list[str], "list of strings"),
        (int | str, "integer or string"),
    ],
)
def test_type_words(annotation: Any, words: str) -> None:
    assert type_words(annotation) == words


def test_check_names_the_stale_file_and_write_fixes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(keydoc, "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    assert keydoc.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert CAMPAIGN_DOC in err and INVENTORY_DOC in err and REGENERATE in err
    assert keydoc.main(["--write"]) == 0
    assert keydoc.main(["--check"]) == 0
    (tmp_path / INVENTORY_DOC).write_text("edited by hand\n")
    assert keydoc.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert INVENTORY_DOC in err and CAMPAIGN_DOC not in err
