#!/usr/bin/env python3
"""Prove, before an engine unit starts, that LMCache's compiled ops load under the engine venv's torch.

Installed by the kvoffload_python role as /usr/local/libexec/kvoffload/lmcache-ops-check and run with the
engine venv's python by `ExecStartPre=` of kvoffload-lmcache.service and of every replica that talks to
it (issue 52). LMCache 0.5.6 catches the ImportError of its compiled `lmcache.cuda_ops` (an undefined torch
symbol when LMCache was built against another torch) and falls back to torch ops for the L0 <-> L1
transfers (lmcache/v1/platform/devices/cuda/device_ops.py `ensure_native`): the cpu and nvme cells would
then measure a slower path without a word. Here the same import fails the unit's start instead, naming
the module, the symbol and the fix; systemd's journal keeps the line, and the deploy quotes it.

What it imports: `lmcache.lmcache_native` on every build (the CPU build uses only it); with a CUDA torch
also `lmcache.cuda_ops`. Standard library and the venv's own torch and lmcache only. Exit 0 with one line
on stdout when they load, 1 with one line on stderr when one does not.
"""

from __future__ import annotations

import importlib
import re
import sys

FIX = (
    "install the LMCache build for this torch, or the torch its compiled ops were built against (the "
    "engine set's requirements; README, Known-good engine sets)"
)
_SYMBOL = re.compile(r"undefined symbol: (\S+)")


def modules(torch_cuda: str | None) -> list[str]:
    """The compiled LMCache modules a server or replica of this torch loads."""
    return ["lmcache.lmcache_native", *(["lmcache.cuda_ops"] if torch_cuda else [])]


def verdict(torch_version: str, torch_cuda: str | None, errors: dict[str, str]) -> tuple[int, str]:
    """(exit status, the one line to print) from the import errors of `modules(torch_cuda)`."""
    build = f"torch {torch_version}" + (f" (CUDA {torch_cuda})" if torch_cuda else " (no CUDA)")
    if not errors:
        return 0, f"lmcache-ops-check: {', '.join(modules(torch_cuda))} loaded under {build}"
    name, error = next(iter(errors.items()))
    symbol = _SYMBOL.search(error)
    what = f"missing symbol {symbol.group(1)}" if symbol else error.strip().splitlines()[-1][:300]
    return 1, (
        f"lmcache-ops-check: LMCache's compiled {name} does not load under {build}: {what}. LMCache would "
        f"fall back to torch ops for its transfers and the cell would measure that path; {FIX}"
    )


def main() -> int:
    try:
        import torch
    except ImportError as exc:
        print(f"lmcache-ops-check: torch does not import in {sys.executable}: {exc}", file=sys.stderr)
        return 1
    cuda = torch.version.cuda
    errors: dict[str, str] = {}
    for name in modules(cuda):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            errors[name] = str(exc)
    status, line = verdict(torch.__version__, cuda, errors)
    print(line, file=sys.stderr if status else sys.stdout)
    return status


if __name__ == "__main__":
    sys.exit(main())
