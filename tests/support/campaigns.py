"""Small campaigns and labs the tests build: a simulator campaign as a plain dict, the example
inventory cut down to the hosts a test wants, and the files `load_lab` reads (campaign.yml, hosts.yml,
a generic dataset in data/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.support.datasets import generic_lines

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_INVENTORY = ROOT / "inventories" / "example" / "hosts.yml"


def sim_campaign(name: str, **fields: Any) -> dict[str, Any]:
    """A small campaign: the simulator's tiny profile, all three tiers, concurrency 2, 5 rounds at isl
    4096, over the generic dataset in data/ (beside campaign.yml). `fields` replace or add keys; with an
    engine other than sim, sim_profile is left out (it is only for the simulator)."""
    spec: dict[str, Any] = {
        "name": name,
        "model": "m",
        "gpu_vendor": "nvidia",
        "engine": "sim",
        "sim_profile": "tiny",
        "dataset": {"code": "generic", "path": "data"},
        "tiers": ["gpu", "cpu", "nvme"],
        "concurrency": [2],
        "num_rounds": [5],
        "isl": 4096,
        **fields,
    }
    if spec["engine"] != "sim":
        del spec["sim_profile"]
    return spec


def example_inventory(*, nodes: int = 2, clients: int = 2) -> dict[str, Any]:
    """inventories/example/hosts.yml without its campaign variable, keeping the first `nodes` (1 or 2)
    nodes and `clients` (1 or 2) client hosts (with one, every node replays from it)."""
    inventory: dict[str, Any] = yaml.safe_load(EXAMPLE_INVENTORY.read_text())
    inventory["all"]["vars"].pop("kvoffload_campaign")
    if clients == 1:
        del inventory["all"]["hosts"]["client02.lab.example"]
        del inventory["all"]["children"]["client"]["hosts"]["client02.lab.example"]
        del inventory["all"]["hosts"]["gpu01.lab.example"]["kvoffload_client"]
    if nodes == 1:
        del inventory["all"]["hosts"]["gpu02.lab.example"]
        for group in ("vllm", "lmcache", "lb"):
            del inventory["all"]["children"][group]["hosts"]["gpu02.lab.example"]
    return inventory


def write_dataset(folder: Path, sessions: int) -> Path:
    """`folder`/data/calls.jsonl: `sessions` generic conversations of 10 calls; returns data/."""
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "calls.jsonl").write_text("\n".join(generic_lines(sessions, 10)) + "\n")
    return data


def write_yaml(path: Path, document: dict[str, Any]) -> Path:
    """`document` as YAML at `path`; returns `path`."""
    path.write_text(yaml.safe_dump(document))
    return path
