"""`plan` and `run` resolve the engine set of every node (kvoffload/engines/lab.py) and refuse one whose
pins need two torches (kvoffload/engines/pins.py), naming the file and key where the set is written and
both pins; `plan` prints each set with where each requirement comes from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kvoffload.cli.main import main
from kvoffload.engines.sets import sets_file
from tests.support.datasets import generic_lines

ROOT = Path(__file__).resolve().parents[3]
BAD = ["torch==2.13.0", "vllm==0.33.0", "lmcache==0.5.6"]
REFUSED = ".requirements: vllm==0.33.0 and lmcache==0.5.6 cannot share one venv: vllm 0.33.0 requires"


def _inventory(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """The example inventory (two nodes, real vLLM, cuda build) in `tmp_path`, its dataset the sample in
    data/ (`plan` refuses a dataset that is not on this machine)."""
    inventory: dict[str, Any] = yaml.safe_load((ROOT / "inventories" / "example" / "hosts.yml").read_text())
    inventory["all"]["vars"]["kvoffload_campaign"]["dataset"]["path"] = str(ROOT / "data" / "sammshen-sample")
    return tmp_path / "hosts.yml", inventory


def _campaign(inventory: dict[str, Any]) -> dict[str, Any]:
    campaign: dict[str, Any] = inventory["all"]["vars"]["kvoffload_campaign"]
    return campaign


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))


def _plan(inv: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["plan", str(inv)])
    out, err = capsys.readouterr()
    return code, " ".join(out.split()), err


@pytest.mark.parametrize("where", ["campaign", "group_vars/all.yml", "host_vars/gpu02.lab.example.yml"])
def test_a_user_set_whose_pins_need_two_torches_is_refused_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    inv, inventory = _inventory(tmp_path)
    body = {"build": "cuda", "requirements": BAD}
    _campaign(inventory)["engine_set"] = "mine"
    if where == "campaign":
        _campaign(inventory)["engine_sets"] = {"mine": body}
        key = f"{inv}: all.vars.kvoffload_campaign.engine_sets.mine"
    else:
        _write(tmp_path / where, {"kvoffload_engine_sets": {"mine": body}})
        key = f"{tmp_path / where}: kvoffload_engine_sets.mine"
    _write(inv, inventory)
    code, _out, err = _plan(inv, capsys)
    assert code == 2
    assert f"kvoffload-lab: error: {key}{REFUSED} torch==2.14.0" in err, err
    assert "torch==2.13.0 and vllm==0.33.0 cannot share one venv" in err


def test_the_built_in_sets_plan_and_show_where_each_requirement_comes_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv, inventory = _inventory(tmp_path)
    _write(inv, inventory)
    code, out, _err = _plan(inv, capsys)
    assert code == 0
    assert (
        "engine set cuda-vllm0.32 (build cuda, built-in) on gpu01.lab.example, gpu02.lab.example: "
        "torch==2.13.0 from the default index (pip's configuration) vllm==0.32.0 from the default index"
    ) in out
    assert "is not a release whose wheel" not in out and "not pinned to one version" not in out


def test_a_set_named_like_a_built_in_one_is_refused_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv, inventory = _inventory(tmp_path)
    _campaign(inventory)["engine_sets"] = {
        "cuda-vllm0.32": {"build": "cuda", "requirements": ["vllm==0.32.0"]}
    }
    _write(inv, inventory)
    code, _out, err = _plan(inv, capsys)
    assert code == 2
    assert (
        f"{inv}: all.vars.kvoffload_campaign.engine_sets.cuda-vllm0.32: the name cuda-vllm0.32 is taken by "
        f"a built-in engine set ({sets_file()}: kvoffload_python_engine_sets.cuda-vllm0.32): "
        "give yours another name"
    ) in err, err


def test_the_old_engine_builds_variable_is_refused_naming_the_new_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv, inventory = _inventory(tmp_path)
    inventory["all"]["vars"]["kvoffload_python_engine_builds"] = {"cuda": {"requirements": BAD}}
    _write(inv, inventory)
    code, _out, err = _plan(inv, capsys)
    assert code == 2
    assert (
        f"{inv}: all.vars.kvoffload_python_engine_builds: engine software is now chosen by engine sets" in err
    )
    assert "campaign's engine_set" in err and "kvoffload_engine_sets" in err


def test_an_amd_lab_plans_the_rocm_set_from_the_folder_it_gives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv, inventory = _inventory(tmp_path)
    _campaign(inventory)["gpu_vendor"] = "amd"
    # an air-gapped lab's folder of ROCm wheels, relative to the inventory, and a patched vLLM wheel
    wheel = "vllm-0.32.0+rocm.lab1-cp311-cp311-linux_x86_64.whl"
    source = {"wheels_dir": "rocm-wheels", "wheels": [f"patched/{wheel}"]}
    _write(tmp_path / "group_vars" / "all.yml", {"kvoffload_engine_source": source})
    _write(inv, inventory)
    code, out, err = _plan(inv, capsys)
    assert code == 0, err
    folder = tmp_path / "group_vars" / "rocm-wheels"
    patched = tmp_path / "group_vars" / "patched" / wheel
    assert (
        "engine set rocm-vllm0.32 (build rocm, built-in) on gpu01.lab.example, gpu02.lab.example: "
        f"torch==2.13.0 from folder {folder} (offline, no index) vllm==0.32.0 from wheel file {patched} "
        f"lmcache==0.5.6 from folder {folder} (offline, no index) "
        f"(source from {tmp_path / 'group_vars' / 'all.yml'}: kvoffload_engine_source)"
    ) in out


def test_an_amd_lab_without_a_source_for_the_rocm_set_is_refused_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv, inventory = _inventory(tmp_path)
    _campaign(inventory)["gpu_vendor"] = "amd"
    _write(inv, inventory)
    code, _out, err = _plan(inv, capsys)
    assert code == 2
    assert (
        f"{sets_file()}: kvoffload_python_engine_sets.rocm-vllm0.32: engine set rocm-vllm0.32 (build rocm)"
        in err
    )
    assert "set engine_source.wheels_dir (a folder of its wheels" in err
    assert f"in {inv}: all.vars.kvoffload_campaign.engine_source" in err


@pytest.mark.parametrize(("vendor", "chosen"), [("amd", "cuda-vllm0.32"), ("nvidia", "rocm-vllm0.32")])
def test_a_vendor_and_a_set_of_another_build_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], vendor: str, chosen: str
) -> None:
    inv, inventory = _inventory(tmp_path)
    _campaign(inventory).update(gpu_vendor=vendor, engine_set=chosen, engine_source={"wheels_dir": "w"})
    _write(inv, inventory)
    code, _out, err = _plan(inv, capsys)
    assert code == 2
    where = f"{inv}: all.vars.kvoffload_campaign.gpu_vendor"
    if vendor == "amd":
        assert f"{where}: amd needs an engine set of build rocm, but " in err, err
        assert f"picks {chosen} ({sets_file()}: kvoffload_python_engine_sets.{chosen}), of build cuda" in err
    else:
        assert f"{where}: nvidia cannot run {chosen}" in err and "of build rocm" in err, err


def test_an_inline_set_of_the_wrong_build_for_the_vendor_is_refused_by_the_campaign_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv, inventory = _inventory(tmp_path)
    _campaign(inventory).update(
        gpu_vendor="amd", engine_set="mine", engine_sets={"mine": {"build": "cuda", "requirements": BAD}}
    )
    _write(inv, inventory)
    code, _out, err = _plan(inv, capsys)
    assert code == 2
    assert "kvoffload_campaign.gpu_vendor: amd needs an engine set of build rocm, but engine_set mine" in err


def test_run_refuses_before_a_results_folder_or_a_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvoffload.orchestrate.campaign import runner as campaign
    from kvoffload.playbook import PlaybookRunner

    def no_host(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("a playbook ran, or the wheelhouse was built")

    monkeypatch.setattr(PlaybookRunner, "run", no_host)
    monkeypatch.setattr(campaign, "build_wheels", no_host)
    inv, inventory = _inventory(tmp_path)
    _campaign(inventory).update(
        engine_set="mine", engine_sets={"mine": {"build": "cuda", "requirements": BAD}}
    )
    # a dataset that loads: without the check, run would go on to create the results folder
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "calls.jsonl").write_text("\n".join(generic_lines(4, 30)) + "\n")
    _campaign(inventory)["dataset"] = {"code": "generic", "path": "data"}
    _write(inv, inventory)
    results = tmp_path / "results"
    assert main(["run", str(inv), "--results", str(results), "--wheel-cache", str(tmp_path / "cache")]) == 2
    assert f"{inv}: all.vars.kvoffload_campaign.engine_sets.mine{REFUSED}" in capsys.readouterr().err
    assert not results.exists() and not (tmp_path / "cache").exists()
