"""The vllm role's GPU checks without a GPU: the preflight's bound-driver check and the telemetry unit's
readiness wait (its regex against the sampler's own textfile, for a poll that worked and one that failed);
also the preflight's refusal of a tensor-parallel flag and the one-replica-first start of real vLLM.

The GPU tasks carry molecule-notest or need a GPU tool on the host; here their expressions are templated and
matched the way Ansible does (wait_for compiles search_regex with re.MULTILINE).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from kvoffload.metrics.samples import Sample
from kvoffload.metrics.textfile import Poll, render_textfile
from tests.unit.roles.render import ROLES, role_defaults

TASKS = ROLES / "vllm" / "tasks"


def _task(path: Path, name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(t for t in yaml.safe_load(path.read_text()) if t["name"] == name)
    return found


def _template(expression: str, variables: dict[str, Any]) -> Any:
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression))


@pytest.mark.parametrize(
    ("drivers", "vendor", "ok"),
    [
        (["nvidia", "nvidia"], "nvidia", True),
        (["nvidia", None], "nvidia", False),  # installed, not rebooted: the second GPU has no driver
        (["nvidia", "vfio-pci"], "nvidia", False),
        (["amdgpu", "amdgpu"], "amd", True),
    ],
)
def test_preflight_checks_the_bound_driver_of_the_replicas_gpus(
    drivers: list[str | None], vendor: str, ok: bool
) -> None:
    task = _task(TASKS / "preflight.yml", "Check that the replicas' GPUs are bound to the vendor's driver")
    variables: dict[str, Any] = {
        **role_defaults("vllm"),
        "kvoffload_gpu_vendor": vendor,
        "vllm_replicas": [{"index": 0, "gpus": "0"}, {"index": 1, "gpus": "1"}],
        "ansible_local": {
            "kvoffload_gpu": {
                "devices": [{"pci": f"0000:1{i}:00.0", "driver": d} for i, d in enumerate(drivers)]
            }
        },
    }
    variables.update({k: trust_as_template(v) for k, v in task["vars"].items()})
    assert _template("{{ " + task["ansible.builtin.assert"]["that"] + " }}", variables) is ok
    if not ok:
        message = _template(
            task["ansible.builtin.assert"]["fail_msg"], {**variables, "inventory_hostname": "gpu1"}
        )
        assert f"bound to {', '.join(d or 'none' for d in drivers)}," in message


def test_telemetry_wait_needs_a_successful_poll_not_only_the_metric_name() -> None:
    task = _task(TASKS / "service.yml", "Wait for the telemetry's first successful poll")
    pattern = re.compile(task["ansible.builtin.wait_for"]["search_regex"], re.MULTILINE)
    sample = Sample(ts=0.0, target="gpu1", name="gpu_power_watts", labels={"gpu": "0"}, value=120.5)
    worked = render_textfile(Poll(tool="nvidia-smi", samples=(sample,)))
    failed = render_textfile(Poll(tool="amd-smi", samples=(), error="FileNotFoundError: amd-smi"))
    assert "kvoffload_gpu_telemetry_up" in failed  # the old check matched this
    assert pattern.search(worked)
    assert not pattern.search(failed)


@pytest.mark.parametrize(
    ("args", "ok"),
    [
        (["--enable-prefix-caching", "--max-model-len", "16384"], True),
        (["--enable-prefix-caching", "--tensor-parallel-size", "2"], False),
        (["-tp", "2"], False),
        (["--tensor_parallel_size=2"], False),
        (["--tpx"], True),
    ],
)
def test_preflight_refuses_a_tensor_parallel_flag_in_the_engine_args(args: list[str], ok: bool) -> None:
    task = _task(
        TASKS / "preflight.yml",
        "Check that vllm_engine_args leave the tensor-parallel size to the replicas' GPUs",
    )
    variables: dict[str, Any] = {**role_defaults("vllm"), "vllm_engine_args": args}
    assert _template("{{ " + task["ansible.builtin.assert"]["that"] + " }}", variables) is ok


@pytest.mark.parametrize(
    ("engine", "build", "one_first"), [("vllm", "auto", True), ("vllm", "cpu", False), ("sim", "auto", False)]
)
def test_real_replicas_start_one_first_to_fill_the_shared_compile_cache(
    engine: str, build: str, one_first: bool
) -> None:
    task = _task(
        TASKS / "service.yml",
        "Start every replica, restarting those whose configuration changed, and wait for each /health",
    )
    variables: dict[str, Any] = {
        **role_defaults("vllm"),
        "kvoffload_engine": engine,
        "kvoffload_engine_build": build,
    }
    assert _template(task["kvoffload.lab.kvoffload_start_units"]["one_first"], variables) is one_first
