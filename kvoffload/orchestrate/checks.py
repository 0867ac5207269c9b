"""Checks the lab commands (`plan`, `run`, `demo`, `doctor`) make on the controller, before any host.

Orchestration layer, below the CLI (which calls them before it creates a results folder).

What the config models cannot know on their own (they read only the YAML): that the dataset on this
machine loads and yields virtual users at every num_rounds, that a simulator profile name is one we
ship, that a folder given as a flag is not a file, that an engine set's pins agree on one torch. Every
failure is a `UserError` naming the file and the key, or the flag. Reads local files only; never a
host, never the network.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kvoffload.errors import UserError

if TYPE_CHECKING:
    from kvoffload.config import Campaign, LabConfig
    from kvoffload.datasets import Session

Where = Callable[[str], str]


def campaign_where(campaign_file: Path | str, key: str) -> Where:
    """`<file>: <key path>` of a campaign key, for a campaign under `key` ('' for a file's top level)."""
    return lambda name: f"{campaign_file}: {key + '.' if key else ''}{name}"


def check_folder_flag(path: Path, flag: str) -> None:
    """A folder the command creates or fills must not be an existing file."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path}: exists and is not a folder; give a folder (created if missing)")


def check_sim_profile(campaign: Campaign, where: Where) -> None:
    """A simulator profile given by name must be a shipped one (a path is resolved on the hosts)."""
    name = campaign.sim_profile
    if campaign.engine != "sim" or name is None or "/" in name or name.endswith((".yaml", ".yml")):
        return
    from kvoffload.sim.profile import shipped_profiles

    shipped = shipped_profiles()
    if name not in shipped:
        raise UserError(
            f"{where('sim_profile')}: unknown simulator profile {name!r}; shipped profiles are "
            f"{', '.join(shipped)} (or give the path of a profile YAML on the vLLM hosts)"
        )


def check_engine_pins(lab: LabConfig) -> list[str]:
    """Every engine set the lab's vLLM hosts install must agree on one torch (orchestrate/engine_pins.py):
    a set that cannot work is a UserError naming the file, the key and both pins, before the wheelhouse
    is built or anything is installed. Returns warnings: what could not be checked (a release the table
    does not know, a pin that is not exact) and an inventory override the wheelhouse does not ship."""
    from kvoffload.orchestrate.engine_pins import check_engine_set, lab_engine_sets

    sets, warnings = lab_engine_sets(lab)
    for engine_set in sets:
        warnings += check_engine_set(engine_set)
    return warnings


def load_campaign_dataset(campaign: Campaign, dataset_path: Path, where: Where) -> list[Session]:
    """The campaign's dataset, loaded as the replay will; it must yield users at every num_rounds."""
    from kvoffload.datasets import load_dataset

    try:
        sessions = load_dataset(campaign.dataset.code, dataset_path)
    except UserError as exc:
        raise UserError(f"{where('dataset')} (code {campaign.dataset.code}): {exc}") from exc
    longest = max(len(s.calls) for s in sessions)
    for i, rounds in enumerate(campaign.num_rounds):
        if rounds > longest:
            raise UserError(
                f"{where(f'num_rounds[{i}]')}: {rounds} yields no virtual users from dataset {dataset_path} "
                f"(its longest session has {longest} calls)"
            )
    return sessions
