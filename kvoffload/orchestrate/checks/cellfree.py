"""Running the doctor's cell-free pair check on a lab: playbooks/doctor_pair.yml on the hosts asked,
the node script's answers back on the controller. The verdict is kvoffload/doctor/pair_cellfree.py's;
this module only collects, and prints nothing.

What each host is asked (`pair_args`): the engine venv, the bench's mode (`gpu` on a CUDA engine
build: KV on the GPU, moved by CUDA IPC; `cpu` on vLLM's CPU build, whose LMCache has no accelerator),
the chunk size of the campaign's offload profile, and, on a host with an nvme cell, the folder above its
L2 folder (the check makes its own L2 folder there, on the same mount). The unit keys are not asked
here: the play takes them from the roles (kvoffload_engine_sandbox, the lmcache_server role's resource
keys), where the units' templates take them from.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from kvoffload.orchestrate.playbooks_api import DOCTOR_PAIR, Runner, fetch_answers

PLAYBOOK = DOCTOR_PAIR
NODE_SCRIPT = Path(__file__).resolve().parents[2] / "doctor" / "pair_node.py"


def pair_args(venv: str, engine_build: str | None, chunk_size: int, l2_path: str | None) -> list[str]:
    """The node script's arguments on one host (`engine_build`: its vLLM build, cuda or cpu)."""
    args = [
        "--venv",
        venv,
        "--mode",
        "cpu" if engine_build == "cpu" else "gpu",
        "--chunk-size",
        str(chunk_size),
    ]
    if l2_path is not None:
        args += ["--l2-parent", str(PurePosixPath(l2_path).parent)]
    return args


class PairCellFree:
    """The check on the hosts asked: `__call__(host -> pair_args)` -> host -> the node's answer (a
    `stage`/`error` of its own where the playbook failed on that host before the answer came back).
    The answers land in `out/pair/<host>.json` (emptied first)."""

    def __init__(self, runner: Runner, out: Path) -> None:
        self.runner = runner
        self.out = out

    def __call__(self, asked: Mapping[str, Sequence[str]]) -> dict[str, dict[str, Any]]:
        if not asked:
            return {}
        folder = self.out / "pair"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        extravars = {
            "doctor_pair_script": str(NODE_SCRIPT),
            "doctor_pair_dest": str(folder.resolve()),
            "doctor_pair_args": {host: list(args) for host, args in asked.items()},
        }
        answers = fetch_answers(
            self.runner, PLAYBOOK, extravars, "doctor-pair", folder, asked, missing="no answer"
        )
        return {
            host: answer if isinstance(answer, dict) else {"stage": "playbook", "error": answer}
            for host, answer in answers.items()
        }
