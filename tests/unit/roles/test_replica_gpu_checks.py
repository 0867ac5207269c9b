"""Replicas of one host may not share a GPU: the inventory check of the preflight role (a plain
ansible-playbook run, on the controller before any host is touched) and the vllm role's own variable check.

`plan` refuses the same in kvoffload/config (tests/unit/config); here the roles' assert expressions are
templated the way Ansible does, against inventories whose replicas share a GPU or do not.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests.unit.roles.render import ROLES, role_defaults


def _task(role: str, name: str) -> dict[str, Any]:
    tasks = yaml.safe_load(
        (ROLES / role / "tasks" / ("main.yml" if role == "preflight" else "preflight.yml")).read_text()
    )
    found: dict[str, Any] = next(t for t in tasks if t["name"] == name)
    return found


def _assert(role: str, name: str, variables: dict[str, Any]) -> tuple[bool, str]:
    task = _task(role, name)
    merged = {**role_defaults(role), **variables}
    merged.update({k: trust_as_template(v) for k, v in task.get("vars", {}).items()})
    templar = Templar(loader=DataLoader(), variables=merged)
    that = task["ansible.builtin.assert"]["that"]
    # as Ansible evaluates `that` (a conditional, whose string literals keep their regex escapes)
    ok = all(templar.evaluate_conditional(trust_as_template(t)) for t in that)
    return ok, " ".join(
        str(templar.template(trust_as_template(task["ansible.builtin.assert"]["fail_msg"]))).split()
    )


SHARED = [{"index": 0, "gpus": "0,1"}, {"index": 1, "gpus": "1,2"}, {"index": 2, "gpus": "3"}]
APART = [{"index": 0, "gpus": "0,1"}, {"index": 1, "gpus": "2"}, {"index": 2, "gpus": "3"}]


@pytest.mark.parametrize(("replicas", "ok"), [(APART, True), (SHARED, False)])
def test_the_inventory_preflight_refuses_a_gpu_given_to_two_replicas(replicas: list[Any], ok: bool) -> None:
    variables = {"item": "gpu1", "hostvars": {"gpu1": {"vllm_replicas": replicas}}}
    holds, message = _assert("preflight", "Check every vllm host's replicas", variables)
    assert holds is ok
    if not ok:
        assert message.startswith(
            "inventory host gpu1: vllm_replicas must list replicas with unique `index`, and no GPU given "
            "to two of them (GPU 1 is): replicas of one machine cannot share a GPU; give each replica GPUs "
            "of its own (got "
        )


def test_the_inventory_preflight_message_without_a_shared_gpu_is_unchanged() -> None:
    twice = [{"index": 0, "gpus": "0"}, {"index": 0, "gpus": "1"}]
    holds, message = _assert(
        "preflight",
        "Check every vllm host's replicas",
        {"item": "gpu1", "hostvars": {"gpu1": {"vllm_replicas": twice}}},
    )
    assert holds is False
    assert message.startswith(
        "inventory host gpu1: vllm_replicas must list replicas with unique `index` (got "
    )


@pytest.mark.parametrize(
    ("replicas", "ok"),
    [(APART, True), (SHARED, False), ([{"index": 0, "gpus": "0"}, {"index": 1, "gpus": "0"}], False)],
)
def test_the_vllm_role_refuses_a_gpu_given_to_two_replicas(replicas: list[Any], ok: bool) -> None:
    variables = {"vllm_replicas": replicas, "kvoffload_engine": "vllm", "kvoffload_model": "Qwen/Qwen3-8B"}
    holds, message = _assert("vllm", "Check the vllm variables", variables)
    assert holds is ok
    assert (
        "no GPU given twice (replicas of one machine cannot share a GPU: give each replica GPUs of its own)"
        in (message)
    )
