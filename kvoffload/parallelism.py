"""vLLM's parallelism flags: which the lab derives itself, and the check that refuses them elsewhere.

A replica's tensor-parallel size is the number of GPUs it is given (`gpus` in `vllm_replicas`): the
vllm role writes `--tensor-parallel-size` into each replica's environment file
(roles/vllm/templates/etc/kvoffload/vllm/replica.env.j2). The same flag in a campaign's
`extra_engine_args` or in an engine profile would contradict it (vLLM keeps the last one), and a
pipeline- or data-parallel size above 1 would ask for more GPUs than the replica sees. Imported by the
campaign model (kvoffload/config) and the resolver (kvoffload/profiles); pure, no IO.
"""

from __future__ import annotations

from collections.abc import Sequence

# Derived from the replica's GPUs, never given.
_DERIVED = ("--tensor-parallel-size", "-tp")
# Allowed at 1 only (vLLM's default): above it vLLM wants tp x pp (x dp) GPUs, more than `gpus` has.
_ONE_ONLY = ("--pipeline-parallel-size", "-pp", "--data-parallel-size", "-dp")


def tensor_parallel_size(gpus: str) -> int:
    """The tensor-parallel size of a replica given `gpus` such as "0" or "0,1": one rank per GPU."""
    return len(gpus.split(","))


def _flag(arg: str) -> tuple[str, str | None]:
    """`--foo_bar=2` -> ("--foo-bar", "2"): vLLM's parser accepts underscores and `=` values alike."""
    name, sep, value = arg.partition("=")
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name, (value if sep else None)


def parallelism_problem(args: Sequence[str]) -> tuple[int, str] | None:
    """The first parallelism flag in `args` the lab refuses, as (its index, why and what to do)."""
    for i, arg in enumerate(args):
        name, value = _flag(arg)
        if name in _DERIVED:
            return i, (
                f"{arg!r}: the tensor-parallel size is derived from each replica's `gpus` in vllm_replicas "
                '(gpus "0,1" runs --tensor-parallel-size 2); remove the flag and give the replica the '
                "GPUs it should span"
            )
        if name in _ONE_ONLY:
            if value is None:
                value = args[i + 1] if i + 1 < len(args) else ""
            if value != "1":
                return i, (
                    f"{arg!r} {value!r}: a replica runs tensor-parallel over all of its `gpus` "
                    "(vllm_replicas), so a pipeline- or data-parallel size above 1 asks for GPUs it does "
                    "not see; remove the flag, and for more copies of the model add replicas instead"
                )
    return None
