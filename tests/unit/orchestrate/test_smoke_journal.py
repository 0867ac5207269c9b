"""A failed smoke check names the replica's own first error line (kvoffload/orchestrate/checks/round_trip.py
`replica_journal_error`, kvoffload/doctor/smoke.py `judge`): after a failure the teardown keeps every
stopped unit's journal, as after a failed cell (roles/vllm tasks/teardown_journal.yml), and the check
reads the replica's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvoffload.doctor import checks as dc
from kvoffload.orchestrate.playbooks_api import JOURNAL_UNITS_VAR
from kvoffload.playbook import PlaybookResult
from tests.unit.orchestrate.test_doctor import GPU1
from tests.unit.orchestrate.test_smoke import Playbooks, _smoke

JOURNAL = (
    "2026-12-05T08:00:09+0000 gpu01 python[812]: INFO 12-05 08:00:09 [api_server.py:1885] vLLM API server\n"
    "2026-12-05T08:00:31+0000 gpu01 python[901]: (EngineCore_DP0 pid=901) ERROR 12-05 08:00:31 "
    "[core.py:866] EngineCore failed to start.\n"
    "2026-12-05T08:00:32+0000 gpu01 python[812]: RuntimeError: Engine core initialization failed.\n"
)


class KeepsJournals(Playbooks):
    """teardown.yml as the vllm role runs it: with `vllm_teardown_journal_units: all` each stopped unit's
    journal lands in the cell folder's units/ (here: the replica's)."""

    def run(self, playbook: str, extravars: Any = None, **kw: Any) -> PlaybookResult:
        result = super().run(playbook, extravars, **kw)
        if playbook == "teardown.yml" and (extravars or {}).get(JOURNAL_UNITS_VAR) == "all":
            units = Path(extravars["replay_controller_dir"]) / "units"
            units.mkdir(parents=True, exist_ok=True)
            index = extravars["vllm_replicas"][0]["index"]
            (units / f"{GPU1}--kvoffload-vllm@{index}.service.failed-cell.journal.txt").write_text(JOURNAL)
        return result


def test_a_replica_that_fails_to_start_is_named_by_its_journal(tmp_path: Path) -> None:
    playbooks = KeepsJournals({("deploy.yml", "install,model,quiet"): "Wait for replica 0 healthy"})
    smoke, _lab = _smoke(tmp_path, playbooks, None)
    found = smoke([GPU1], None)[GPU1]
    teardown = playbooks.runs[-1]
    assert teardown["playbook"] == "teardown.yml" and teardown["extravars"][JOURNAL_UNITS_VAR] == "all"
    assert found["journal_error"] == (
        "(EngineCore_DP0 pid=901) ERROR 12-05 08:00:31 [core.py:866] EngineCore failed to start."
    )
    verdict = dc.smoke_pair(None, "vllm", True, found)
    assert verdict.status == dc.Status.FAIL
    assert verdict.detail.startswith("start: ") and verdict.detail.endswith(
        "; the replica's journal: (EngineCore_DP0 pid=901) ERROR 12-05 08:00:31 [core.py:866] EngineCore "
        "failed to start."
    )


def test_a_pair_that_works_keeps_no_journal(tmp_path: Path) -> None:
    from tests.unit.doctor.test_doctor_smoke import Servers

    playbooks = KeepsJournals()
    servers = Servers(replica="http://192.0.2.11:8000", cache="http://192.0.2.11:8080")
    smoke, _lab = _smoke(tmp_path, playbooks, servers)
    found = smoke([GPU1], None)[GPU1]
    assert "error" not in found and "journal_error" not in found
    assert JOURNAL_UNITS_VAR not in playbooks.runs[-1]["extravars"]
