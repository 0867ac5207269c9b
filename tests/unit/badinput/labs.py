"""A valid lab on disk to break one thing of: the example inventory (TEST-NET hosts 192.0.2.x, ssh on
port 9 where nothing listens), a small simulator campaign and a generic JSONL dataset of 2 sessions x 10
calls. Cases mutate the dicts (or replace a file's text) before `write()`; needles name the files with
`{inv}` (hosts.yml), `{camp}` (campaign.yml), `{data}` (the dataset folder), `{root}` (their folder)
and `{c}` (the campaign's
key prefix: `{camp}: ` for a campaign file, `{inv}: all.vars.kvoffload_campaign.` inline).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.campaigns import sim_campaign
from tests.support.datasets import generic_lines
from tests.unit.badinput.harness import ROOT, assert_refused, cli, install_traps

EXAMPLE_INVENTORY = ROOT / "inventories" / "example" / "hosts.yml"
NODE = "gpu01.lab.example"
CLIENT = "client01.lab.example"
CAMPAIGN_VAR = "kvoffload_campaign"

BASE_CAMPAIGN: dict[str, Any] = sim_campaign("badinput", model="tiny-llama", osl=32)


SECOND_NODE = "gpu02.lab.example"


def base_inventory() -> dict[str, Any]:
    """The example inventory with its first node only (the cases of a lab of two nodes add the second
    back, see test_inventories.py)."""
    inventory: dict[str, Any] = yaml.safe_load(EXAMPLE_INVENTORY.read_text())
    inventory["all"]["vars"].pop(CAMPAIGN_VAR)
    inventory["all"]["vars"]["ansible_port"] = 9  # discard: nothing listens there
    del inventory["all"]["hosts"][SECOND_NODE]
    for group in ("vllm", "lmcache", "lb"):
        del inventory["all"]["children"][group]["hosts"][SECOND_NODE]
    return inventory


def _or(given: bytes | None, default: Callable[[], bytes]) -> bytes:
    return default() if given is None else given


@dataclass
class Lab:
    """The files of one case; `write()` puts them under `root` and returns the CLI arguments."""

    root: Path
    inline: bool
    inventory: dict[str, Any] = field(default_factory=base_inventory)
    campaign: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(BASE_CAMPAIGN))
    # Replace a file's bytes (syntax errors, binary garbage) instead of dumping the dict.
    inventory_bytes: bytes | None = None
    campaign_bytes: bytes | None = None
    dataset_lines: list[str] = field(default_factory=generic_lines)
    dataset_bytes: bytes | None = None
    # Other files beside the inventory (group_vars/, host_vars/), relative path -> bytes.
    extra: dict[str, bytes] = field(default_factory=dict)
    # Arguments instead of `[inventory, --campaign FILE]` (a missing file, a folder).
    argv: list[str] | None = None

    @property
    def inv(self) -> Path:
        return self.root / "hosts.yml"

    @property
    def camp(self) -> Path:
        return self.root / "campaign.yml"

    @property
    def data(self) -> Path:
        return self.root / "data"

    def hosts(self) -> dict[str, Any]:
        hosts: dict[str, Any] = self.inventory["all"]["hosts"]
        return hosts

    def node(self) -> dict[str, Any]:
        node: dict[str, Any] = self.hosts()[NODE]
        return node

    def children(self) -> dict[str, Any]:
        children: dict[str, Any] = self.inventory["all"]["children"]
        return children

    def fill(self, needle: str) -> str:
        prefix = f"{self.inv}: all.vars.{CAMPAIGN_VAR}." if self.inline else f"{self.camp}: "
        return needle.format(inv=self.inv, camp=self.camp, data=self.data, root=self.root, c=prefix)

    def write(self) -> list[str]:
        self.root.mkdir(parents=True, exist_ok=True)
        inventory = copy.deepcopy(self.inventory)
        if self.inline:
            inventory["all"]["vars"][CAMPAIGN_VAR] = self.campaign
        self.inv.write_bytes(
            _or(self.inventory_bytes, lambda: yaml.safe_dump(inventory, sort_keys=False).encode())
        )
        if not self.inline:
            self.camp.write_bytes(
                _or(self.campaign_bytes, lambda: yaml.safe_dump(self.campaign, sort_keys=False).encode())
            )
        self.data.mkdir(exist_ok=True)
        calls = self.data / "calls.jsonl"
        calls.write_bytes(_or(self.dataset_bytes, lambda: ("\n".join(self.dataset_lines) + "\n").encode()))
        for name, content in self.extra.items():
            (self.root / name).parent.mkdir(parents=True, exist_ok=True)
            (self.root / name).write_bytes(content)
        if self.argv is not None:
            return [self.fill(a) for a in self.argv]
        return [str(self.inv)] if self.inline else [str(self.inv), "--campaign", str(self.camp)]


@dataclass(frozen=True)
class Case:
    """One malformed input: what to break, and what the error must name."""

    id: str
    breaks: Callable[[Lab], Any]
    needles: tuple[str, ...]
    # Some breakages exist only in one place (a campaign file's own syntax): None runs both.
    inline: bool | None = None


def modes(cases: list[Case]) -> list[Any]:
    """pytest params (case, inline) for every mode a case applies to."""
    out = []
    for case in cases:
        for inline in (True, False) if case.inline is None else (case.inline,):
            out.append(pytest.param(case, inline, id=f"{case.id}-{'inline' if inline else 'file'}"))
    return out


def assert_plan_and_run_refuse(
    lab: Lab,
    needles: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`plan` and `run` both exit 2 naming the needles; `run` creates nothing under --results or the
    wheel cache and reaches for no host (nor pip, nor ansible)."""
    args = lab.write()
    touched = install_traps(monkeypatch)
    results, wheels = lab.root / "results", lab.root / "wheels"
    filled = tuple(lab.fill(n) for n in needles)
    assert_refused(cli(["plan", *args, "--results", str(results)], capsys), *filled)
    run = cli(["run", *args, "--results", str(results), "--wheel-cache", str(wheels)], capsys)
    assert_refused(run, *filled)
    assert not results.exists() and not wheels.exists()
    assert touched == []
