"""The `flashinfer_jit` check and the engine profiles' FlashInfer choices, held to vLLM 0.32's own source
(tests/fixtures/vllm-0.32-cuda-source), FlashInfer 0.7.0.post1's
(tests/fixtures/flashinfer-0.7.0.post1-source) and to what the probe finds on a node (issues 41 and 52)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvoffload.doctor import probe
from kvoffload.doctor.checks import Status
from kvoffload.doctor.jit import ALLREDUCE_ENV, SAMPLER_ENV, flashinfer_jit, sampler_on, switch_on
from kvoffload.profiles.resolve import engine_profile

SOURCE = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cuda-source"
FI_SOURCE = Path(__file__).resolve().parents[2] / "fixtures" / "flashinfer-0.7.0.post1-source"
TIERS = ("gpu", "cpu", "nvme")


def vllm_reads(env: dict[str, str], variable: str = SAMPLER_ENV) -> bool:
    """vLLM 0.32's own reading of `variable` (its envs.py lambda, tests/fixtures/vllm-0.32-cuda-source)
    under `env`, evaluated with a stand-in for os.environ and os.getenv."""
    entry = (SOURCE / f"envs-{variable}.py.txt").read_text()
    fake_os: Any = type("os", (), {"environ": env, "getenv": staticmethod(lambda k, d=None: env.get(k, d))})
    value: bool = eval(entry, {"os": fake_os, "bool": bool, "int": int})()
    return value


@pytest.mark.parametrize(("env", "on"), [({}, True), ({SAMPLER_ENV: "0"}, False), ({SAMPLER_ENV: "1"}, True)])
def test_vllm_samples_with_flashinfer_unless_told_0_and_the_check_reads_it_alike(
    env: dict[str, str], on: bool
) -> None:
    assert vllm_reads(env) is on
    assert sampler_on(env.get(SAMPLER_ENV)) is on


@pytest.mark.parametrize("tier", TIERS)
def test_every_nvidia_tier_turns_the_flashinfer_sampler_off_the_same_way(tier: str) -> None:
    env = engine_profile("nvidia", tier).env  # type: ignore[arg-type]
    assert vllm_reads(dict(env)) is False, env
    assert env[SAMPLER_ENV] == "0"


def test_the_gate_judges_the_gpu_never_the_toolchain() -> None:
    """Why vLLM's own fallback does not save a driver-only host: its gate asks FlashInfer for the GPU's
    architectures, and nothing in it looks for nvcc or ninja."""
    gate = (SOURCE / "topk_topp_sampler-flashinfer_sampler_supported.py.txt").read_text()
    assert "_flashinfer_jit_unsupported_reason(capability)" in gate
    assert "nvcc" not in gate and "ninja" not in gate and "which" not in gate


def test_the_tp_fusion_the_vllm_role_turns_off_is_vllms_default_on_hopper() -> None:
    fusion = (SOURCE / "config-vllm-enable_allreduce_rms_fusion.py.txt").read_text()
    assert "cfg.parallel_config.tensor_parallel_size > 1" in fusion
    assert "current_platform.is_device_capability(90)" in fusion and "has_flashinfer()" in fusion


NO_TOOLS: dict[str, Any] = {"path": probe.UNIT_PATH, "nvcc": None, "ninja": None}
VERSIONS = {"vllm": "0.32.0", "flashinfer-python": "0.7.0.post1", "flashinfer-jit-cache": None}


def test_off_in_every_tier_is_ok_whatever_the_host_has() -> None:
    got = flashinfer_jit("cuda", {"gpu": "0", "cpu": "0"}, NO_TOOLS, VERSIONS)
    assert got.status == Status.OK and "VLLM_USE_FLASHINFER_SAMPLER=0" in got.detail
    assert got.facts["sampler"] == {"cpu": "0", "gpu": "0"} and got.facts["ninja"] is None


def test_on_without_a_toolchain_or_prebuilt_kernel_fails_naming_the_tiers_and_the_fix() -> None:
    got = flashinfer_jit("cuda", {"gpu": None, "cpu": "0", "nvme": "1"}, NO_TOOLS, VERSIONS)
    assert got.status == Status.FAIL
    assert "(gpu, nvme:" in got.detail and "no nvcc and ninja" in got.detail and "#49497" in got.detail
    assert 'VLLM_USE_FLASHINFER_SAMPLER: "0"' in got.fix
    # a toolkit in /usr/local/cuda is not enough: the unit's PATH has no ninja
    half = {**NO_TOOLS, "nvcc": "/usr/local/cuda/bin/nvcc"}
    got = flashinfer_jit("cuda", {"gpu": None}, half, VERSIONS)
    assert got.status == Status.FAIL and "no ninja" in got.detail
    # no venv yet: no prebuilt kernel can be there either
    got = flashinfer_jit("cuda", {"gpu": None}, NO_TOOLS, None)
    assert got.status == Status.FAIL and "engine venv is not installed yet" in got.detail


def test_on_with_a_prebuilt_kernel_of_the_same_flashinfer_is_ok_and_with_a_toolchain_warns() -> None:
    cached = {**VERSIONS, "flashinfer-jit-cache": "0.7.0.post1+cu129"}
    assert flashinfer_jit("cuda", {"gpu": None}, NO_TOOLS, cached).status == Status.OK
    stale = {**VERSIONS, "flashinfer-jit-cache": "0.6.9"}
    assert flashinfer_jit("cuda", {"gpu": None}, NO_TOOLS, stale).status == Status.FAIL
    tools = {**NO_TOOLS, "nvcc": "/usr/local/cuda/bin/nvcc", "ninja": "/usr/bin/ninja"}
    got = flashinfer_jit("cuda", {"gpu": "1"}, tools, VERSIONS)
    assert got.status == Status.WARN and "/usr/bin/ninja" in got.detail


@pytest.mark.parametrize("build", ["cpu", None])
def test_no_cuda_build_skips(build: str | None) -> None:
    assert flashinfer_jit(build, {"gpu": None}, NO_TOOLS, VERSIONS).status == Status.SKIP


def _tool(root: Path, where: str) -> None:
    path = root / where.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


def test_the_probe_finds_the_tools_as_a_replica_unit_would(tmp_path: Path) -> None:
    # A pip-installed ninja in the engine venv and a CUDA toolkit in its default folder
    _tool(tmp_path, "/opt/kvoffload/venv/bin/ninja")
    _tool(tmp_path, "/usr/local/cuda/bin/nvcc")
    got = probe.unit_toolchain(tmp_path)
    assert got == {"path": probe.UNIT_PATH, "nvcc": "/usr/local/cuda/bin/nvcc", "ninja": None}
    _tool(tmp_path, "/usr/bin/ninja")
    _tool(tmp_path, "/usr/local/bin/nvcc")
    (tmp_path / "usr/local/bin/nvcc").chmod(0o644)  # not executable: not found, as `which` says
    assert probe.unit_toolchain(tmp_path)["ninja"] == "/usr/bin/ninja"
    assert probe.unit_toolchain(tmp_path)["nvcc"] == "/usr/local/cuda/bin/nvcc"


PREMISES = Path(__file__).resolve().parents[2] / "fixtures" / "gpu" / "flashinfer-jit"


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_the_verdict_matches_what_the_build_did_on_a_gpu_host(gpu: str) -> None:
    """On a lent H200 and H100 (tests/fixtures/gpu/flashinfer-jit): vLLM's gate turned the sampler on in every
    case; the kernel built only where nvcc and ninja were both reachable. The check, given what a unit
    finds in each case and the sampler on, fails exactly where the build failed."""
    record = json.loads((PREMISES / f"premise-{gpu}.json").read_text())
    toolkit = "/usr/local/cuda/bin/nvcc" if record["usr_local_cuda"] else None
    seen = {}
    for name, case in record["cases"].items():
        assert case["vllm_gate"].startswith("FlashInfer sampler on"), case
        # what get_cuda_path would take: CUDA_HOME, else nvcc on PATH, else the default toolkit folder
        nvcc = None if case["cuda_home"] else (case["which_nvcc"] or toolkit)
        tools = {"path": "?", "nvcc": nvcc, "ninja": case["which_ninja"]}
        verdict = flashinfer_jit("cuda", {"gpu": None}, tools, VERSIONS)
        seen[name] = (case["build"], verdict.status)
    assert seen == {
        "unit_no_toolkit": ("failed", Status.FAIL),
        "unit_with_toolkit": ("failed", Status.FAIL),
        "toolchain_visible": ("ok", Status.WARN),
    }
    assert "ninja" in record["cases"]["unit_with_toolkit"]["error"][0]
    assert record["cases"]["unit_no_toolkit"]["comm_build"].startswith("failed")


# ---------------------------------------------------------------------------------------------------
# Issue 52: FlashInfer's standalone all-reduce of TP >= 2 replicas


@pytest.mark.parametrize(
    ("env", "on"), [({}, True), ({ALLREDUCE_ENV: "0"}, False), ({ALLREDUCE_ENV: "1"}, True)]
)
def test_vllm_all_reduces_with_flashinfer_unless_told_0_and_the_check_reads_it_alike(
    env: dict[str, str], on: bool
) -> None:
    assert vllm_reads(env, ALLREDUCE_ENV) is on
    assert switch_on(env.get(ALLREDUCE_ENV)) is on


@pytest.mark.parametrize("tier", TIERS)
def test_every_nvidia_tier_turns_the_flashinfer_all_reduce_off(tier: str) -> None:
    env = engine_profile("nvidia", tier).env  # type: ignore[arg-type]
    assert vllm_reads(dict(env), ALLREDUCE_ENV) is False, env


def test_the_all_reduce_is_gated_on_the_switch_alone_and_reaches_a_jit_build_outside_any_try() -> None:
    """The premise of issue 52, read in the wheels: the tp group's communicator turns the FlashInfer
    all-reduce on from the switch (and batch invariance) only; on one node it picks mnnvl; its
    all_reduce calls FlashInfer's allreduce_fusion with no try/except; FlashInfer's mnnvl all-reduce
    loads its comm module with a JIT build."""
    init = (SOURCE / "cuda_communicator-CudaCommunicator.__init__.py.txt").read_text()
    assert "envs.VLLM_ALLREDUCE_USE_FLASHINFER and not envs.VLLM_BATCH_INVARIANT" in init
    assert "if self.use_flashinfer_allreduce and self.world_size > 1:" in init
    backend = (SOURCE / "flashinfer_all_reduce-_resolve_fi_ar_backend.py.txt").read_text()
    assert "if node_count == 1:\n        # MNNVL" in backend and 'backend = "mnnvl"' in backend
    call = (SOURCE / "flashinfer_all_reduce-FlashInferAllReduce.all_reduce.py.txt").read_text()
    assert "flashinfer_comm.allreduce_fusion(" in call and "try:" not in call
    mnnvl = (FI_SOURCE / "comm-trtllm_mnnvl_ar-trtllm_mnnvl_allreduce.py.txt").read_text()
    assert "module = get_trtllm_mnnvl_comm_module()" in mnnvl
    build = (FI_SOURCE / "comm-trtllm_mnnvl_ar-get_trtllm_mnnvl_comm_module.py.txt").read_text()
    assert "gen_trtllm_mnnvl_comm_module().build_and_load()" in build
    trtllm = (FI_SOURCE / "comm-trtllm_ar-get_trtllm_comm_module.py.txt").read_text()
    assert "build_and_load()" in trtllm


def test_flashinfers_prebuilt_kernels_hold_the_mnnvl_all_reduce_only_for_blackwell() -> None:
    """Why a flashinfer-jit-cache does not make the all-reduce safe on Hopper (the check says so)."""
    lines = (FI_SOURCE / "aot-gen_all_modules.py.txt").read_text().splitlines()
    added = [i for i, line in enumerate(lines) if "jit_specs.append(gen_trtllm_mnnvl_comm_module())" in line]
    assert len(added) == 1 and lines[added[0] - 1].strip() == "if has_sm100 or has_sm103:"


def test_tp2_with_the_all_reduce_on_fails_without_a_toolchain_even_with_prebuilt_kernels() -> None:
    cached = {**VERSIONS, "flashinfer-jit-cache": "0.7.0.post1+cu129"}
    got = flashinfer_jit("cuda", {"gpu": "0", "cpu": "0"}, NO_TOOLS, cached, {"cpu": None})
    assert got.status == Status.FAIL
    assert (
        "all-reduce comm kernel" in got.detail
        and "(cpu: VLLM_ALLREDUCE_USE_FLASHINFER unset or 1" in got.detail
    )
    assert 'VLLM_ALLREDUCE_USE_FLASHINFER: "0"' in got.fix and SAMPLER_ENV not in got.fix
    assert got.facts["allreduce_tp2"] == {"cpu": None}
    tools = {**NO_TOOLS, "nvcc": "/usr/local/cuda/bin/nvcc", "ninja": "/usr/bin/ninja"}
    assert flashinfer_jit("cuda", {"gpu": "0"}, tools, VERSIONS, {"gpu": "1"}).status == Status.WARN


def test_tp2_with_the_all_reduce_off_is_ok_and_says_so() -> None:
    got = flashinfer_jit("cuda", {"gpu": "0", "cpu": "0"}, NO_TOOLS, VERSIONS, {"gpu": "0", "cpu": "0"})
    assert got.status == Status.OK and f"{ALLREDUCE_ENV}=0" in got.detail and "(cpu, gpu)" in got.detail
    # no TP >= 2 replica on the node: the switch does not matter there, and the detail says why
    got = flashinfer_jit("cuda", {"gpu": "0"}, NO_TOOLS, VERSIONS, {})
    assert got.status == Status.OK and "no replica here has TP >= 2" in got.detail


def test_only_the_mnnvl_path_builds_outside_vllms_try_so_nvswitch_nodes_die_and_others_fall_back() -> None:
    """Where the comm kernel is built decides whether a replica dies: the mnnvl workspace (one NVSwitch
    node) is made with cuMemset and no build, so the build comes at the first all-reduce, outside any try;
    the trtllm workspace (no multicast: PCIe or NVLink-bridge nodes) builds while it is created, inside
    vLLM's try/except, which logs the failure and runs without FlashInfer's all-reduce."""
    mnnvl = (FI_SOURCE / "comm-trtllm_mnnvl_ar-MNNVLAllReduceFusionWorkspace.__init__.py.txt").read_text()
    assert "build" not in mnnvl and "_module(" not in mnnvl and "lamport_initialize(self.rank" in mnnvl
    lamport = (FI_SOURCE / "comm-trtllm_ar-trtllm_lamport_initialize.py.txt").read_text()
    assert "get_trtllm_comm_module().trtllm_lamport_initialize(" in lamport
    create = (SOURCE / "flashinfer_all_reduce-_create_workspace.py.txt").read_text()
    body = create[create.index("try:") : create.index("except Exception as e:")]
    assert "flashinfer_comm.create_allreduce_fusion_workspace(" in body
    assert "return None" in create[create.index("except Exception as e:") :]


def test_without_nvswitches_the_all_reduce_build_fails_quietly_and_the_check_warns() -> None:
    """No multicast: vLLM falls back to trtllm, whose build fails inside its try/except (the test above),
    so the replica runs on NCCL: a warning (another path than the lab's other nodes), not a failure. With
    NVSwitches, or where the probe could not tell, the build kills the replica."""
    quiet = flashinfer_jit("cuda", {"gpu": "0"}, NO_TOOLS, VERSIONS, {"gpu": None}, nvswitch=False)
    assert quiet.status == Status.WARN and "no NVSwitch here" in quiet.detail and ALLREDUCE_ENV in quiet.fix
    for nvswitch in (True, None):
        got = flashinfer_jit("cuda", {"gpu": "0"}, NO_TOOLS, VERSIONS, {"gpu": None}, nvswitch=nvswitch)
        assert got.status == Status.FAIL, nvswitch
