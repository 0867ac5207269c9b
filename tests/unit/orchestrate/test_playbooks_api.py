"""kvoffload/orchestrate/playbooks_api.py against playbooks/ and roles/: every playbook, tag, play title
and playbook switch the orchestrator names exists where it says, so a rename on one side fails here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kvoffload.orchestrate import playbooks_api as api

ROOT = Path(__file__).resolve().parents[3]
PLAYBOOKS = (api.PREFLIGHT, api.PROVISION, api.DEPLOY, api.REPLAY, api.TEARDOWN, api.DOCTOR, api.HOST_PYTHON)


def _plays(playbook: str) -> list[dict[str, Any]]:
    plays = yaml.safe_load((ROOT / "playbooks" / playbook).read_text())
    assert isinstance(plays, list), playbook
    return plays


def _tags(node: Any) -> set[str]:
    """Every tag set anywhere in a loaded YAML document."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "tags":
                found |= {value} if isinstance(value, str) else set(value)
            found |= _tags(value)
    elif isinstance(node, list):
        for item in node:
            found |= _tags(item)
    return found


def test_every_playbook_the_orchestrator_runs_exists() -> None:
    for playbook in PLAYBOOKS:
        assert _plays(playbook), playbook
    assert api.ident_of(api.REPLAY) == "replay"


def test_the_play_titles_are_the_first_plays_of_their_playbooks() -> None:
    assert _plays(api.REPLAY)[0]["name"] == api.CLEAR_L2_PLAY
    assert _plays("collect.yml")[0]["name"] == api.COLLECT_PLAY
    assert _plays(api.TEARDOWN)[0]["name"] == api.TEARDOWN_PLAY


def test_every_tag_the_orchestrator_runs_or_skips_is_set_in_the_playbooks_or_roles() -> None:
    tags: set[str] = set()
    for path in [*(ROOT / "playbooks").glob("*.yml"), *(ROOT / "roles").glob("*/tasks/*.yml")]:
        tags |= _tags(yaml.safe_load(path.read_text()))
    named = {api.INSTALL_TAG, api.MODEL_TAG, api.QUIET_TAG, api.UNQUIET_TAG, api.COLLECT_SOFTWARE_TAG}
    assert named <= tags, sorted(named - tags)
    assert set(api.CELL_SKIP_TAGS) | set(api.NODE_INSTALL_TAGS) | set(api.BETWEEN_CELLS_SKIP_TAGS) <= named


def test_every_playbook_switch_is_read_by_a_playbook() -> None:
    text = "".join(p.read_text() for p in (ROOT / "playbooks").glob("*.yml"))
    for switch in api.PLAYBOOK_SWITCHES:
        assert f"{switch} | default(false) | bool" in text, switch
