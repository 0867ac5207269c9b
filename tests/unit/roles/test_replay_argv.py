"""The replay argv is built once: the role runs the orchestrator's `replay_argv`, and its own build (for
the role run on its own, e.g. its molecule scenario) gives the same list for the same variables.

Renders roles/replay's `_replay_argv` (vars/main.yml) and the "Replay the dataset" task's argv
(tasks/run.yml) with ansible-core's Templar, for the extravars `cell_extravars` gives a few campaigns.
The task runs the argv under `flock` on the cell's lock file, which the sampler's `--replay-lock` names
(the sampler ends with its replay: kvoffload/metrics/sampler.py ReplayLease).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from kvoffload.config import load_lab
from kvoffload.orchestrate.cell.deployment import cell_extravars, replay_command
from kvoffload.orchestrate.installs.wheelhouse import Wheels
from tests.unit.roles.render import REPO, ROLES, role_defaults

EXAMPLE = REPO / "inventories" / "example" / "hosts.yml"
# Campaign keys that change the replay's argv, beside the example's own campaign.
VARIANTS: dict[str, dict[str, Any]] = {
    "example": {},
    "limits": {"max_sessions": 3, "duration_s": 600, "osl": 256, "honor_gaps": True},
    "tau2-gpt-oss": {"model": "openai/gpt-oss-120b", "dataset": {"code": "tau2-bench-v1", "path": "/data/t"}},
}


def _block_task_argv(name: str) -> str:
    """The argv expression of a task in the block of roles/replay/tasks/run.yml."""
    tasks = yaml.safe_load((ROLES / "replay" / "tasks" / "run.yml").read_text())
    for task in tasks:
        for inner in task.get("block", []):
            if inner["name"] == name:
                argv = inner["ansible.builtin.command"]["argv"]
                assert isinstance(argv, str)
                return argv
    raise AssertionError(f"roles/replay/tasks/run.yml: no task {name!r}")


def _render(expression: str, variables: dict[str, Any]) -> Any:
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression))


def _replay_task_argv() -> str:
    """The argv expression of the role's task that runs the replay, without its `flock FILE` prefix
    (test_the_replay_runs_under_the_lock_the_sampler_watches holds that prefix)."""
    expression = _block_task_argv("Replay the dataset")
    return "{{ (" + expression.removeprefix("{{").removesuffix("}}").strip() + ")[2:] }}"


def _extravars(tmp_path: Path, variant: str) -> list[dict[str, Any]]:
    inventory = yaml.safe_load(EXAMPLE.read_text())
    inventory["all"]["vars"]["kvoffload_campaign"].update(VARIANTS[variant])
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inventory))
    lab = load_lab(path)
    wheels = Wheels(tmp_path / "kvoffload.whl", None)
    cells = [next(c for c in lab.cells if c.tier == tier) for tier in ("gpu", "nvme")]
    return [cell_extravars(lab, cell, tmp_path / cell.id, wheels) for cell in cells]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_role_runs_the_orchestrators_argv_and_its_own_build_is_the_same(
    tmp_path: Path, variant: str
) -> None:
    task_argv = _replay_task_argv()
    for extravars in _extravars(tmp_path, variant):
        built = extravars["replay_argv"]
        assert built == replay_command(extravars)  # what cell.json records
        given = {**role_defaults("replay"), **extravars}
        assert _render(task_argv, given) == built  # the role runs it as given
        own = {**role_defaults("replay"), **{k: v for k, v in extravars.items() if k != "replay_argv"}}
        assert _render("{{ _replay_argv }}", own) == built  # the standalone build: the same list
        assert _render(task_argv, own) == built


def test_the_role_takes_its_own_venvs_executable(tmp_path: Path) -> None:
    extravars = _extravars(tmp_path, "example")[0]
    variables = {**role_defaults("replay"), **extravars, "kvoffload_venv": "/srv/venv"}
    argv = _render(_replay_task_argv(), variables)
    assert argv == ["/srv/venv/bin/kvoffload-lab", *extravars["replay_argv"][1:]]


def test_the_comparison_sees_a_difference(tmp_path: Path) -> None:
    """A flag the orchestrator adds that the role's own build would not: the renders differ."""
    extravars = _extravars(tmp_path, "example")[0]
    own = {**role_defaults("replay"), **{k: v for k, v in extravars.items() if k != "replay_argv"}}
    own["replay_extra_args"] = extravars["replay_extra_args"][:-1]
    assert _render("{{ _replay_argv }}", own) != extravars["replay_argv"]


def test_the_replay_runs_under_the_lock_the_sampler_watches(tmp_path: Path) -> None:
    """The replay holds an flock on the cell's lock file for its whole life, and the sampler is told that
    file: a sampler whose `always:` stop never runs (a Ctrl-C cancels the playbook) ends with the replay."""
    extravars = _extravars(tmp_path, "example")[0]
    cell_id = extravars["replay_cell_id"]
    variables = {
        **role_defaults("replay"),
        **extravars,
        "kvoffload_venv": "/srv/venv",
        "_replay_sampler_unit": f"kvoffload-sampler-{cell_id}.service",
        "_replay_cell_dir": f"{extravars['replay_remote_root']}/{cell_id}",
        "_replay_target_args": ["--target", "vllm-0=http://192.0.2.11:8000/metrics"],
    }
    lock = f"{extravars['replay_remote_root']}/{cell_id}.lock"
    replay = _render(_block_task_argv("Replay the dataset"), variables)
    assert replay[:3] == ["flock", lock, "/srv/venv/bin/kvoffload-lab"]
    assert replay[3:] == extravars["replay_argv"][1:]
    start = "Start the metrics sampler in the background (transient unit, stopped with SIGTERM)"
    sampler = _render(_block_task_argv(start), variables)
    command = sampler[sampler.index("--") + 1 :]
    assert command[:3] == ["/srv/venv/bin/kvoffload-lab", "metrics", "sample"]
    assert command[command.index("--replay-lock") + 1] == lock
    # the lock is beside the cell folder, not in it: the folder is fetched to the controller whole
    assert not lock.startswith(variables["_replay_cell_dir"] + "/")
