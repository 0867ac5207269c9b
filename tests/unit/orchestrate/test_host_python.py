"""The hosts' Python learned before the wheelhouse is built (orchestrate/installs/host_python.py,
playbooks/host_python.yml), with the playbook replaced by a fake that answers as the facade does
(`PlaybookResult.facts`: host -> the play's `kvoffload_host_facts`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kvoffload.config import load_lab
from kvoffload.errors import UserError
from kvoffload.orchestrate.campaign import runner as campaign_module
from kvoffload.orchestrate.installs import host_python
from kvoffload.orchestrate.installs.wheelhouse import Wheels
from kvoffload.playbook import PlaybookFailed, PlaybookResult
from kvoffload.playbook.runner import TaskFailure
from tests.unit.orchestrate.test_doctor import CLIENT, GPU1, GPU2, _lab_files, _Progress

ROOT = Path(__file__).resolve().parents[3]


class FakeRunner:
    """Answers host_python.yml with each host's version (or the hosts in `unreachable` fail)."""

    def __init__(self, versions: dict[str, str], unreachable: dict[str, str] | None = None) -> None:
        self.versions = versions
        self.unreachable = unreachable or {}
        self.calls: list[tuple[str, str | None]] = []

    def run(self, playbook: str, extravars: Any = None, **kw: Any) -> PlaybookResult:
        self.calls.append((playbook, kw.get("ident")))
        facts = {h: {"python": v} for h, v in self.versions.items() if h not in self.unreachable}
        failures = tuple(
            TaskFailure(h, "Read the host's Python", why, unreachable=True)
            for h, why in self.unreachable.items()
        )
        result = PlaybookResult(
            playbook, "failed" if failures else "successful", 4 if failures else 0, {}, failures,
            Path("/nonexistent"), 1.0, facts=facts,
        )  # fmt: skip
        if failures:
            raise PlaybookFailed(result)
        return result


def test_hosts_that_agree_give_their_version() -> None:
    fake = FakeRunner({GPU1: "3.12.3", GPU2: "3.12.3", CLIENT: "3.12.3"})
    assert host_python.learn_hosts_python(fake) == "3.12.3"
    assert fake.calls == [("host_python.yml", "host-python")]


def test_hosts_that_differ_are_refused_naming_each() -> None:
    fake = FakeRunner({GPU1: "3.12.3", GPU2: "3.11.2", CLIENT: "3.12.3"})
    with pytest.raises(UserError) as err:
        host_python.learn_hosts_python(fake)
    text = str(err.value)
    assert f"{GPU1}: Python 3.12.3" in text and f"{GPU2}: Python 3.11.2" in text
    assert f"{CLIENT}: Python 3.12.3" in text
    assert "every host of a lab must run the same release" in text
    # a micro release is a difference too: environment markers follow the full version
    with pytest.raises(UserError, match="different Pythons"):
        host_python.agreed_python({GPU1: "3.12.3", GPU2: "3.12.4"})
    with pytest.raises(UserError, match="no host reported"):
        host_python.agreed_python({})


def test_an_unreachable_host_is_named_and_the_others_decide(caplog: pytest.LogCaptureFixture) -> None:
    # A node down takes down only its own cells (tests/lab/test_lab_faults.py): the others decide.
    fake = FakeRunner({GPU1: "3.12.3", GPU2: "3.11.2"}, unreachable={GPU2: "ssh: connect timed out"})
    with caplog.at_level("WARNING"):
        assert host_python.learn_hosts_python(fake) == "3.12.3"
    assert f"{GPU2}: unreachable at 'Read the host's Python': ssh: connect timed out" in caplog.text


def test_no_host_answering_is_named_with_each_reason() -> None:
    fake = FakeRunner({GPU1: "3.12.3"}, unreachable={GPU1: "ssh: connect timed out"})
    with pytest.raises(
        UserError, match=rf"{GPU1}: unreachable at 'Read the host's Python': ssh: connect timed out"
    ):
        host_python.learn_hosts_python(fake)


def _campaign(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> tuple[Any, list[dict[str, Any]]]:
    from kvoffload.orchestrate.results import CampaignResults

    built: list[dict[str, Any]] = []

    def fake_build(cache: Path, **kwargs: Any) -> Wheels:
        built.append(kwargs)
        return Wheels(cache / "pkg.whl", cache / "h.tar", python=kwargs["hosts_python"])

    monkeypatch.setattr(campaign_module, "build_wheels", fake_build)
    inv, camp = _lab_files(tmp_path)
    lab = load_lab(inv, camp)
    results = CampaignResults.open(tmp_path / "results", lab.campaign.name)
    runner = campaign_module.CampaignRunner(lab, inv, results, _Progress(), wheel_cache=tmp_path / "w", **kw)
    return runner, built


def test_the_wheelhouse_is_built_for_the_python_the_hosts_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, built = _campaign(tmp_path, monkeypatch)
    fake = FakeRunner({GPU1: "3.12.3", GPU2: "3.12.3", CLIENT: "3.12.3"})
    runner.playbooks = fake
    extravars = runner._base_extravars()  # what provision passes: the wheels are built first
    assert fake.calls == [("host_python.yml", "host-python")]
    assert built[0]["hosts_python"] == "3.12.3"
    assert extravars["kvoffload_wheelhouse_python"] == "3.12.3"  # what provision's check compares
    assert runner.hosts_python == "3.12.3"  # and what the doctor's cheap gate compares


def test_an_explicit_hosts_python_or_no_wheelhouse_asks_no_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, built = _campaign(tmp_path, monkeypatch, hosts_python="3.11.2")
    runner.playbooks = fake = FakeRunner({GPU1: "3.12.3"})
    runner.prepare_wheelhouse()
    assert fake.calls == [] and built[0]["hosts_python"] == "3.11.2"
    (tmp_path / "b").mkdir()
    runner, built = _campaign(tmp_path / "b", monkeypatch, offline=False)
    runner.playbooks = fake = FakeRunner({GPU1: "3.12.3", GPU2: "3.11.2"})
    runner.prepare_wheelhouse()
    assert fake.calls == [] and built[0]["offline"] is False


def test_the_playbook_reads_only_the_python_fact_of_every_host_the_check_covers() -> None:
    plays = yaml.safe_load((ROOT / "playbooks" / host_python.PLAYBOOK).read_text())
    provision = yaml.safe_load((ROOT / "playbooks" / "provision.yml").read_text())
    assert len(plays) == 1
    play = plays[0]
    # the hosts provision's Python check covers (its first play)
    assert play["hosts"] == provision[0]["hosts"] and play["gather_facts"] is False
    setup, report = play["tasks"]
    assert setup["ansible.builtin.setup"] == {"gather_subset": ["!all", "!min", "python"]}
    # the facade returns `kvoffload_host_facts` of a set_fact as PlaybookResult.facts
    assert set(report["ansible.builtin.set_fact"]["kvoffload_host_facts"]) == {"python"}
    assert "become" not in play
