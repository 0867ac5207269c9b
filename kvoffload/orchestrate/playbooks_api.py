"""What the orchestrator relies on in playbooks/*.yml: playbook names, tags, play titles and the
switches it sets on the playbooks themselves, the one place these are spelled on the Python side; and
`fetch_answers`, the way every check reads a playbook that answers one JSON file per host.

The ground floor of `kvoffload.orchestrate` (campaign/, cell/, checks/ and installs/ import it); it
imports only kvoffload.playbook. A play title here is matched against what
ansible-runner reports (`PlaybookResult.plays`, `l2_trims`, `TaskFailure.play`), so renaming a play in
playbooks/ means renaming it here; tests/unit/orchestrate/test_playbooks_api.py reads the playbooks and
holds the two together.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from kvoffload.playbook import PlaybookFailed, PlaybookResult

# -- playbooks (playbooks/<name>) -----------------------------------------------------------------------
PREFLIGHT = "preflight.yml"
PROVISION = "provision.yml"
DEPLOY = "deploy.yml"
# the replay on the client, then (imported) collect.yml and, when TEARDOWN_AFTER_VAR, teardown.yml
REPLAY = "replay.yml"
TEARDOWN = "teardown.yml"
DOCTOR = "doctor.yml"
# doctor's cell-free pair check: LMCache's server and bench as two transient units
# (orchestrate/checks/cellfree.py)
DOCTOR_PAIR = "doctor_pair.yml"
HOST_PYTHON = "host_python.yml"

# -- tags ----------------------------------------------------------------------------------------------
INSTALL_TAG = "install"
MODEL_TAG = "model"
QUIET_TAG = "quiet"
UNQUIET_TAG = "unquiet"
COLLECT_SOFTWARE_TAG = "collect-software"
# A node's once-per-run install (deploy.yml with these tags): software and model.
NODE_INSTALL_TAGS = (INSTALL_TAG, MODEL_TAG)
# Tags a cell's deploy and replay skip: installing software, staging the model and masking the periodic
# disk jobs happen once per node and campaign (the first cell's `install` phase), not in every cell.
CELL_SKIP_TAGS = (INSTALL_TAG, MODEL_TAG, QUIET_TAG)
# What a teardown between two cells of a node skips: the disk jobs come back after the node's last cell.
BETWEEN_CELLS_SKIP_TAGS = (UNQUIET_TAG,)

# -- switches the orchestrator sets on the playbooks (declared by the playbooks, not by a role) --------
# The extravars that empty the L2 of a running lmcache-server: LMCache 0.5.6's `/cache/clear` takes L1
# only, so the lmcache_server role deletes L2's objects through `DELETE /cache/objects` (its clear_l2
# tasks). CLEAR_L2_VAR: replay.yml's first play, after a reset (the probes' KV); CLEAR_L2_NEXT_VAR: its
# collect play (collect.yml), before a next cell that keeps these engines. Riding on the playbook that
# runs anyway costs no extra playbook start per cell.
CLEAR_L2_VAR = "kvoffload_clear_l2"
CLEAR_L2_NEXT_VAR = "kvoffload_clear_l2_next"
# replay.yml ends with teardown.yml when this extravar is true (no next cell keeps the engines): the
# teardown rides on the playbook that runs anyway.
TEARDOWN_AFTER_VAR = "kvoffload_teardown_after"
PLAYBOOK_SWITCHES = (CLEAR_L2_VAR, CLEAR_L2_NEXT_VAR, TEARDOWN_AFTER_VAR)
# teardown.yml keeps the journal of every unit it stops when this role variable (the vllm role's) is
# "all": the orchestrator sets it after a failed cell, whose collect did not run.
JOURNAL_UNITS_VAR = "vllm_teardown_journal_units"

# -- play titles ---------------------------------------------------------------------------------------
# The first play of collect.yml, which replay.yml runs after the replay: the cell's `collect` timing is
# measured from its start.
COLLECT_PLAY = "Unit states, journal excerpts and software versions of every lab host"
# teardown.yml's first play, from whose start the cell's `teardown` timing is measured and the watch of
# the targets ends.
TEARDOWN_PLAY = "Stop the cell's units"
# replay.yml's first play: an fstrim there (after the reset's L2 clear) is this cell's, before its
# replay; one in a later play (the collect's clear for the next cell, the teardown) is the next cell's.
CLEAR_L2_PLAY = "Empty L2 of the reset's probes"


def ident_of(playbook: str) -> str:
    """A playbook's name in a run's ident (`deploy.yml` -> `deploy`)."""
    return playbook.removesuffix(".yml")


# -- running a playbook that answers per host ------------------------------------------------------
class Runner(Protocol):
    """What the doctor needs of `PlaybookRunner` (tests give a fake)."""

    def run(
        self, playbook: str, extravars: Mapping[str, Any] | None = None, *, ident: str | None = None
    ) -> PlaybookResult: ...


def fetch_answers(
    runner: Runner,
    playbook: str,
    extravars: Mapping[str, Any],
    ident: str,
    folder: Path,
    hosts: Iterable[str],
    *,
    missing: str,
) -> dict[str, dict[str, Any] | str]:
    """Run a playbook that fetches one JSON answer per host into `folder/<host>.json` (the probe's,
    the cell-free pair check's): host -> its answer, or why there is none (the playbook's failure on
    that host, else `missing` and the read error). A playbook that failed on no host re-raises."""
    failures: dict[str, str] = {}
    try:
        runner.run(playbook, extravars, ident=ident)
    except PlaybookFailed as exc:
        for f in exc.result.failures:
            failures.setdefault(
                f.host, f"{'unreachable' if f.unreachable else 'failed'} at '{f.task}': {f.message}"
            )
        if not exc.result.failures:
            raise
    answers: dict[str, dict[str, Any] | str] = {}
    for host in hosts:
        try:
            answers[host] = json.loads((folder / f"{host}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            answers[host] = failures.get(host, f"{missing} ({exc})")
    return answers
