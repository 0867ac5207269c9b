"""Ansible filter: a vLLM replica's arguments with one compilation config (issue 52).

Of the kvoffload.lab collection, used by the vllm role's replica environment file
(roles/vllm/templates/etc/kvoffload/vllm/replica.env.j2) on the controller: `vllm_engine_args |
kvoffload.lab.compilation_args(ours)` merges the campaign's `--compilation-config` with `ours`, the keys
the lab adds to a tensor-parallel CUDA replica, because vLLM 0.32 drops a whole JSON config that sits
next to any dotted `--compilation-config.<key>` flag. The logic lives in kvoffload/parallelism.py
(`compilation_args`), which cell.json's record and the campaign's own check use too; this file only
turns its ValueError into the filter error Ansible reports with the task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

try:
    from kvoffload.parallelism import compilation_args as _compilation_args
except ImportError as exc:  # the controller runs Ansible from kvoffload-lab's own venv
    _IMPORT_ERROR: ImportError | None = exc
else:
    _IMPORT_ERROR = None


def compilation_args(args: Sequence[str], ours: Mapping[str, Any] | None = None) -> list[str]:
    """`args` with `ours` merged into their compilation config (kvoffload/parallelism.py)."""
    if _IMPORT_ERROR is not None:
        raise AnsibleFilterError(
            f"kvoffload.lab.compilation_args needs the kvoffload package on the controller: {_IMPORT_ERROR}"
        )
    try:
        return _compilation_args(list(args), dict(ours or {}))
    except ValueError as exc:
        raise AnsibleFilterError(f"vllm_engine_args: {exc}") from exc


class FilterModule:
    """The collection's filters."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"compilation_args": compilation_args}
