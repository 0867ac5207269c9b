"""vLLM's parallelism flags: which the lab derives itself, and the check that refuses them elsewhere.

A replica's tensor-parallel size is the number of GPUs it is given (`gpus` in `vllm_replicas`): the
vllm role writes `--tensor-parallel-size` into each replica's environment file
(roles/vllm/templates/etc/kvoffload/vllm/replica.env.j2). The same flag in a campaign's
`extra_engine_args` or in an engine profile would contradict it (vLLM keeps the last one), and a
pipeline- or data-parallel size above 1 would ask for more GPUs than the replica sees. Imported by the
campaign model (kvoffload/config) and the resolver (kvoffload/profiles); pure, no IO.

It also owns the compilation config a replica runs (issue 52): `compilation_args` merges the campaign's
`--compilation-config` with the one the lab adds to tensor-parallel CUDA replicas (vLLM would drop a
whole JSON config next to a dotted key), for the vllm role's template (through the collection's filter,
plugins/filter/kvoffload_engine.py) and for cell.json (`compilation_config`, what vLLM parses).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

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


# ---------------------------------------------------------------------------------------------------
# The compilation config a replica runs (issue 52)

# What a tensor-parallel (TP >= 2) CUDA replica's compilation config gets from the lab: vLLM 0.32's
# all-reduce + RMSNorm fusion, on by default there on Hopper and Blackwell, builds a FlashInfer comm
# kernel at start with nvcc and ninja, which a replica unit has neither of (issue 41). The vllm role
# (roles/vllm/vars/main.yml `_vllm_tp_cuda_compilation`, held equal by tests/unit/roles) passes it to
# `compilation_args` through the collection's filter (plugins/filter/kvoffload_engine.py).
TP_CUDA_COMPILATION: dict[str, Any] = {"pass_config": {"fuse_allreduce_rms": False}}
_WHOLE = ("--compilation-config", "-cc")


class CompilationError(ValueError):
    """A compilation config the lab cannot merge with its own: `index` is the argument to blame."""

    def __init__(self, index: int, message: str) -> None:
        self.index = index
        super().__init__(message)


def _compilation_flag(arg: str) -> tuple[str, list[str], str | None] | None:
    """(`--compilation-config` or `-cc`, the dotted keys, the `=` value) of a compilation-config flag,
    spelled as vLLM's FlexibleArgumentParser accepts it (underscores before the first dot are dashes);
    None for any other argument."""
    name, sep, value = arg.partition("=")
    head, *keys = name.split(".")
    if head.startswith("--"):
        head = "--" + head[2:].replace("_", "-")
    if head not in _WHOLE:
        return None
    return head, keys, (value if sep else None)


def _dotted_value(text: str) -> Any:
    """A dotted flag's value as vLLM reads it: JSON where it parses, else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _compilation_flags(args: Sequence[str]) -> tuple[list[tuple[int, str]], list[tuple[int, list[str], Any]]]:
    """The compilation flags of `args`: (index, JSON text) of each whole config, (index, keys, value) of
    each dotted one, a value given as the next argument taken with its flag."""
    whole: list[tuple[int, str]] = []
    dotted: list[tuple[int, list[str], Any]] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        flag = _compilation_flag(arg)
        if flag is None:
            continue
        _, keys, value = flag
        if value is None:
            value = args[i + 1] if i + 1 < len(args) else ""
            skip = True
        if keys:
            dotted.append((i, keys, _dotted_value(value)))
        else:
            whole.append((i, value))
    return whole, dotted


def _nested(keys: Sequence[str], value: Any) -> dict[str, Any]:
    """(["a", "b"], 1) -> {"a": {"b": 1}}."""
    nested: Any = value
    for key in reversed(keys):
        nested = {key: nested}
    return dict(nested)


def _merge(into: dict[str, Any], update: Mapping[str, Any], path: str, clash: list[str]) -> None:
    """Merge `update` into `into` (nested dicts merged), naming in `clash` every key set to two values."""
    for key, value in update.items():
        where = f"{path}.{key}" if path else key
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value, where, clash)
        elif key in into and into[key] != value:
            clash.append(f"{where} ({into[key]!r} and {value!r})")
        else:
            into[key] = json.loads(json.dumps(value)) if isinstance(value, Mapping) else value


def compilation_args(args: Sequence[str], ours: Mapping[str, Any]) -> list[str]:
    """`args` with the compilation config a replica should run: the user's and `ours` in one.

    vLLM 0.32 folds every dotted `--compilation-config.<key>=<value>` into one `--compilation-config
    <json>` that it appends last, and argparse keeps the last of them, so a whole JSON
    `--compilation-config` / `-cc` next to any dotted key (ours included) is dropped without a word.
    Where `args` hold no whole JSON, `ours` is appended as dotted flags and vLLM merges them; where
    they do, every compilation flag becomes one `--compilation-config <json>` (compact: a unit's
    argument holds no whitespace) at the place of the first. Raises `CompilationError` (a ValueError
    with the index of the argument to blame), naming the argument and the fix, for two whole configs,
    one that is not a JSON object, a key the user sets twice, or one the user sets to another value
    than `ours`.
    """
    whole, dotted = _compilation_flags(args)
    if len(whole) > 1:
        raise CompilationError(
            whole[1][0],
            f"{args[whole[1][0]]!r}: a second whole compilation config (vLLM keeps only the last); give "
            "one --compilation-config JSON object, or dotted --compilation-config.<key>=<value> flags",
        )
    merged: dict[str, Any] = {}
    clash: list[str] = []
    if whole:
        try:
            parsed = json.loads(whole[0][1])
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise CompilationError(
                whole[0][0],
                f"{args[whole[0][0]]!r} {whole[0][1]!r}: the compilation config must be a JSON object "
                '(e.g. {"cudagraph_mode":"PIECEWISE"}), so that the lab can add its own keys to it',
            )
        merged = parsed
    for _, keys, value in dotted:
        _merge(merged, _nested(keys, value), "", clash)
    user_clash = list(clash)
    _merge(merged, ours, "", clash)
    ours_clash = clash[len(user_clash) :]
    if user_clash or ours_clash:
        what = "; ".join(user_clash or ours_clash)
        why = (
            "set twice in the compilation flags"
            if user_clash
            else "set by the campaign to what a tensor-parallel CUDA replica cannot run: the lab turns the "
            "all-reduce fusion off there, since it builds a FlashInfer kernel at start that a replica unit "
            "cannot compile (issue 41; README, What is not exercised here)"
        )
        first = min([i for i, _ in whole] + [i for i, _, _ in dotted])
        raise CompilationError(
            first, f"compilation config key {what}: {why}; remove it from extra_engine_args"
        )
    if not whole:
        return [*args, *(f"--compilation-config.{k}={json.dumps(v)}" for k, v in _dotted(ours))]
    first = min([whole[0][0], *(i for i, _, _ in dotted)])
    drop = {whole[0][0], *(i for i, _, _ in dotted)}
    out: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if i in drop:
            skip = "=" not in arg  # its value is the next argument
            if i == first:
                out += ["--compilation-config", json.dumps(merged, separators=(",", ":"))]
            continue
        out.append(arg)
    return out


def _dotted(config: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """`{"a": {"b": False}}` -> [("a.b", False)]: a nested config as vLLM's dotted flag keys."""
    out: list[tuple[str, Any]] = []
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out += _dotted(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def compilation_config(args: Sequence[str]) -> dict[str, Any]:
    """The compilation config vLLM 0.32 parses from `args`: every dotted flag folded into one JSON
    appended last, and argparse keeping the last whole config (vllm/utils/argparse_utils.py
    FlexibleArgumentParser.parse_args). What a replica ran with, recorded in cell.json."""
    whole, dotted = _compilation_flags(args)
    folded: dict[str, Any] = {}
    for _, keys, value in dotted:
        _merge(folded, _nested(keys, value), "", [])
    if folded or not whole:
        return folded
    parsed = _dotted_value(whole[-1][1])
    return parsed if isinstance(parsed, dict) else {"level": parsed}


def replica_args(shared: Sequence[str], gpus: str, *, cuda: bool) -> list[str]:
    """The arguments one replica runs after `--model --host --port`, as the vllm role renders them
    (roles/vllm/templates/etc/kvoffload/vllm/replica.env.j2; tests/unit/roles hold the two equal): the
    host's `vllm_engine_args`, the replica's `--tensor-parallel-size` where it spans several GPUs, and
    on a CUDA build at TP > 1 the lab's compilation switch merged in."""
    tp = tensor_parallel_size(gpus)
    args = [*shared, *(["--tensor-parallel-size", str(tp)] if tp > 1 else [])]
    return compilation_args(args, TP_CUDA_COMPILATION if cuda and tp > 1 else {})
