"""`plan` and `run` refuse an engine set whose pins need two torches (orchestrate/engine_pins.py), naming
the file and key where the set is written: the role's defaults or an inventory override of
kvoffload_python_engine_builds (Ansible's inventory variables beat a role's defaults)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kvoffload.cli.main import main
from kvoffload.orchestrate import wheelhouse
from tests.support.datasets import generic_lines

ROOT = Path(__file__).resolve().parents[3]
VAR = "kvoffload_python_engine_builds"
BAD = ["torch==2.14.0", "vllm==0.33.0", "lmcache==0.5.6"]
REFUSED = ".cuda.requirements: vllm==0.33.0 and lmcache==0.5.6 cannot share one venv: vllm 0.33.0 requires"


def _builds(requirements: list[str]) -> dict[str, Any]:
    builds: dict[str, Any] = yaml.safe_load(wheelhouse.engine_defaults_file().read_text())[VAR]
    builds["cuda"]["requirements"] = requirements
    return builds


def _inventory(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """The example inventory (two nodes, real vLLM, cuda build) in `tmp_path`, its dataset the sample in
    data/ (`plan` refuses a dataset that is not on this machine)."""
    inventory: dict[str, Any] = yaml.safe_load((ROOT / "inventories" / "example" / "hosts.yml").read_text())
    inventory["all"]["vars"]["kvoffload_campaign"]["dataset"]["path"] = str(ROOT / "data" / "sammshen-sample")
    return tmp_path / "hosts.yml", inventory


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))


@pytest.mark.parametrize(
    ("layer", "where"),
    [
        ("all.vars", "hosts.yml: all.vars.kvoffload_python_engine_builds"),
        ("vllm.vars", "hosts.yml: vllm.vars.kvoffload_python_engine_builds"),
        ("host", "hosts.yml: host gpu02.lab.example: kvoffload_python_engine_builds"),
        ("group_vars/all.yml", "group_vars/all.yml: kvoffload_python_engine_builds"),
        ("group_vars/vllm/engine.yml", "group_vars/vllm/engine.yml: kvoffload_python_engine_builds"),
        (
            "host_vars/gpu02.lab.example.yml",
            "host_vars/gpu02.lab.example.yml: kvoffload_python_engine_builds",
        ),
    ],
)
def test_an_inventory_override_is_refused_naming_its_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], layer: str, where: str
) -> None:
    inv, inventory = _inventory(tmp_path)
    bad = {VAR: _builds(BAD)}
    if layer == "all.vars":
        inventory["all"]["vars"].update(bad)
    elif layer == "vllm.vars":
        inventory["all"]["children"]["vllm"]["vars"] = bad
    elif layer == "host":
        inventory["all"]["hosts"]["gpu02.lab.example"].update(bad)
    else:
        _write(tmp_path / layer, bad)
    _write(inv, inventory)
    assert main(["plan", str(inv)]) == 2
    err = capsys.readouterr().err
    assert f"kvoffload-lab: error: {tmp_path}/{where}{REFUSED} torch==2.14.0" in err, err


def test_an_edited_role_default_is_refused_naming_the_defaults_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    defaults = tmp_path / "roles" / "kvoffload_python" / "defaults" / "main.yml"
    _write(defaults, {VAR: _builds(["torch==2.13.0", "vllm==0.33.0", "lmcache==0.5.6"])})
    monkeypatch.setattr(wheelhouse, "engine_defaults_file", lambda: defaults)
    assert main(["plan", str(ROOT / "inventories" / "example" / "hosts.yml")]) == 2
    err = capsys.readouterr().err
    assert f"kvoffload-lab: error: {defaults}: {VAR}{REFUSED} torch==2.14.0" in err, err
    assert "torch==2.13.0 and vllm==0.33.0 cannot share one venv" in err


def test_the_shipped_sets_plan_without_an_engine_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv, inventory = _inventory(tmp_path)
    _write(inv, inventory)
    assert main(["plan", str(inv)]) == 0
    assert "engine_pins" not in capsys.readouterr().out


def test_a_good_override_plans_with_warnings_for_what_is_unchecked_and_unshipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv, inventory = _inventory(tmp_path)
    inventory["all"]["vars"][VAR] = _builds(["torch==2.14.0", "vllm==0.33.0", "lmcache==0.5.7"])
    _write(inv, inventory)
    assert main(["plan", str(inv)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    where = f"{inv}: all.vars.{VAR}.cuda.requirements"
    assert f"warning: {where}: lmcache==0.5.7 is not a release whose wheel kvoffload-lab has read" in out
    assert f"warning: {where} overrides {wheelhouse.engine_defaults_file()}: {VAR}.cuda.requirements" in out
    assert "the hosts find these pins only with `run --no-wheelhouse`" in out


def test_an_override_without_the_hosts_build_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv, inventory = _inventory(tmp_path)
    inventory["all"]["vars"][VAR] = {"cpu": _builds(BAD)["cpu"]}
    _write(inv, inventory)
    assert main(["plan", str(inv)]) == 2
    err = capsys.readouterr().err
    assert f"{inv}: all.vars.{VAR}: has no build 'cuda', which host gpu01.lab.example installs" in err


def test_run_refuses_before_a_results_folder_or_a_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvoffload.orchestrate import campaign
    from kvoffload.playbook import PlaybookRunner

    def no_host(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("a playbook ran, or the wheelhouse was built")

    monkeypatch.setattr(PlaybookRunner, "run", no_host)
    monkeypatch.setattr(campaign, "build_wheels", no_host)
    inv, inventory = _inventory(tmp_path)
    inventory["all"]["vars"][VAR] = _builds(BAD)
    # a dataset that loads: without the check, run would go on to create the results folder
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "calls.jsonl").write_text("\n".join(generic_lines(4, 30)) + "\n")
    inventory["all"]["vars"]["kvoffload_campaign"]["dataset"] = {"code": "generic", "path": "data"}
    _write(inv, inventory)
    results = tmp_path / "results"
    assert main(["run", str(inv), "--results", str(results), "--wheel-cache", str(tmp_path / "cache")]) == 2
    assert f"{inv}: all.vars.{VAR}{REFUSED}" in capsys.readouterr().err
    assert not results.exists() and not (tmp_path / "cache").exists()
