"""The doctor's verdict on run-time kernel builds of a CUDA replica (check `flashinfer_jit`; issue 41).

vLLM 0.32's CUDA build warms FlashInfer's top-k/top-p sampler in start-up profiling when
`VLLM_USE_FLASHINFER_SAMPLER` is unset or 1 (vllm/envs.py: default True; its gate,
vllm/v1/sample/ops/topk_topp_sampler.py flashinfer_sampler_supported, checks the GPU, never whether the
kernel can be built), and FlashInfer then builds its sampling kernel with nvcc and ninja
(flashinfer/sampling.py get_sampling_module -> flashinfer/jit/core.py build_and_load). A replica unit
has no venv bin on its PATH, so no `ninja`, and a host with only the driver has no nvcc: the replica
dies before it serves (tests/fixtures/gpu/flashinfer-jit: the build failing on an H200 without them).

vLLM 0.32 also turns FlashInfer's standalone all-reduce on by default for tensor-parallel replicas
(`VLLM_ALLREDUCE_USE_FLASHINFER`, vllm/envs.py default 1; vllm/distributed/device_communicators/
cuda_communicator.py gates it only on FlashInfer importing). On one node it picks FlashInfer's mnnvl
backend, whose workspace is made without a build (cuMemset), and the first all-reduce that fits it
JIT-builds the mnnvl comm kernel (flashinfer/comm/trtllm_mnnvl_ar.py get_trtllm_mnnvl_comm_module),
outside vLLM's try/except: a TP >= 2 replica on an NVSwitch node dies at its first CUDA-graph capture
(issue 52). Without NVSwitch multicast vLLM falls back to the trtllm backend, whose workspace builds its
kernel while it is created, inside vLLM's try/except: the failure is logged and NCCL does the
all-reduce. So the check judges the switch on as a kernel build where the node has NVSwitches (or the
probe could not tell), and elsewhere as a build that fails quietly (a warning: two paths in one lab). The
prebuilt flashinfer-jit-cache does not save it on Hopper: its AOT list holds the mnnvl kernel only for
sm100/sm103 (flashinfer/aot.py gen_all_modules; tests/fixtures/flashinfer-0.7.0.post1-source).

The shipped nvidia engine profiles turn both off; this check says which way a node's replicas will go,
from the profiles' environment (the controller's), the replicas' tensor-parallel sizes, and what the
node's probe found (kvoffload/doctor/probe.py: the toolchain a unit sees, and FlashInfer's prebuilt
kernel packages in the engine venv), and fails a node where a kernel would be built and nothing can
build or provide it. Pure: JSON and mappings in, a check out. No IO, no printing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvoffload.doctor.verdict import Check, Status

NAME = "flashinfer_jit"
SAMPLER_ENV = "VLLM_USE_FLASHINFER_SAMPLER"
ALLREDUCE_ENV = "VLLM_ALLREDUCE_USE_FLASHINFER"
# FlashInfer's packages of prebuilt kernels (flashinfer/jit/env.py looks for their artifacts before a
# JIT build): with one of the installed flashinfer-python's version, the sampling kernel is not
# compiled at start (the all-reduce's mnnvl kernel still is on Hopper: see the module docstring).
PREBUILT_PACKAGES = ("flashinfer-jit-cache", "flashinfer-cubin")
UPSTREAM = "vllm-project/vllm#49497"
PROFILES = "kvoffload/profiles/engine/nvidia-<tier>.yaml"


def switch_on(value: str | None) -> bool:
    """Whether vLLM 0.32 turns a FlashInfer switch of vllm/envs.py on, given the variable's value in
    the unit's environment (None: unset). Both switches read `bool(int(value))`, default True."""
    if value is None:
        return True
    try:
        return bool(int(value))
    except ValueError:
        return True  # vLLM itself would fail on it at start; judge it as the worst case


# The sampler's switch is the one issue 41 named; the same reading serves both.
sampler_on = switch_on


def _prebuilt(versions: Mapping[str, Any]) -> list[str]:
    """The prebuilt kernel packages of the installed flashinfer-python's version."""
    flashinfer = versions.get("flashinfer-python")
    return [
        p for p in PREBUILT_PACKAGES if flashinfer and str(versions.get(p) or "").split("+")[0] == flashinfer
    ]


def flashinfer_jit(
    build: str | None,
    sampler_values: Mapping[str, str | None],
    toolchain: Mapping[str, Any] | None,
    versions: Mapping[str, Any] | None,
    allreduce_values: Mapping[str, str | None] | None = None,
    nvswitch: bool | None = None,
) -> Check:
    """The check of one node.

    `build`: the engine build its venv holds (cuda, cpu; None: no vLLM on the node);
    `sampler_values`: tier -> VLLM_USE_FLASHINFER_SAMPLER in that tier's engine profile (None: unset),
    for the tiers its replicas run; `allreduce_values`: tier -> VLLM_ALLREDUCE_USE_FLASHINFER the same
    way, for the tiers in which the node runs a replica of tensor-parallel size >= 2 (empty: none does);
    `toolchain`: the probe's `unit_toolchain` record (nvcc and ninja as a replica unit finds them);
    `versions`: the probe's engine venv package versions (None: no venv yet); `nvswitch`: whether the
    probe found NVSwitches (its fabric check; None: it could not tell).
    """
    if build != "cuda":
        return Check(NAME, Status.SKIP, f"no CUDA build of vLLM on this host ({build or 'no vLLM'})")
    ar_values = dict(allreduce_values or {})
    sampler = sorted(tier for tier, value in sampler_values.items() if switch_on(value))
    allreduce = sorted(tier for tier, value in ar_values.items() if switch_on(value))
    tc = dict(toolchain or {})
    facts: dict[str, Any] = {
        "sampler": {t: sampler_values[t] for t in sorted(sampler_values)},
        "allreduce_tp2": {t: ar_values[t] for t in sorted(ar_values)},
        **tc,
    }
    tp_text = (
        f"TP >= 2 replicas ({', '.join(sorted(ar_values))}) run with {ALLREDUCE_ENV}=0 and without the fused "
        "all-reduce"
        if ar_values
        else "no replica here has TP >= 2 (no FlashInfer all-reduce)"
    )
    if not sampler and not allreduce:
        return Check(
            NAME,
            Status.OK,
            f"no FlashInfer kernel is built at start: {SAMPLER_ENV}=0 in the nvidia engine profiles "
            f"(every tier samples with PyTorch/Triton); {tp_text}",
            facts=facts,
        )
    have = dict(versions or {})
    prebuilt = _prebuilt(have)
    # what a replica would JIT-build at start, with the tiers that would: the sampling kernel unless a
    # prebuilt package of the same FlashInfer has it, the all-reduce's comm kernel always on Hopper
    kernels: list[str] = []
    if sampler and not prebuilt:
        kernels.append(f"FlashInfer's sampling kernel ({', '.join(sampler)}: {SAMPLER_ENV} unset or 1)")
    quiet = bool(allreduce) and nvswitch is False
    if quiet:  # no multicast: vLLM falls back to trtllm, whose build fails inside its try/except
        tp_text = (
            f"TP >= 2 replicas ({', '.join(allreduce)}) with {ALLREDUCE_ENV} on: no NVSwitch here, so vLLM "
            "falls back to FlashInfer's trtllm all-reduce, whose kernel build fails inside its try/except "
            "(logged; NCCL all-reduces)"
        )
    if allreduce and not quiet:
        kernels.append(
            "FlashInfer's all-reduce comm kernel at a TP >= 2 replica's first all-reduce "
            f"({', '.join(allreduce)}: "
            f"{ALLREDUCE_ENV} unset or 1; flashinfer-jit-cache holds it only for Blackwell)"
        )
    fixes = []
    if sampler:
        fixes.append(f'{SAMPLER_ENV}: "0"')
    if allreduce:
        fixes.append(f'{ALLREDUCE_ENV}: "0"')
    fix_env = f"set {' and '.join(fixes)} in {PROFILES} env (the shipped default)"
    if not kernels and quiet:
        return Check(NAME, Status.WARN, tp_text, fix_env, facts=facts)
    if not kernels:
        return Check(
            NAME,
            Status.OK,
            f"FlashInfer sampler on ({', '.join(sampler)}): its kernel comes prebuilt from {prebuilt[0]} "
            f"{have.get('flashinfer-python')}; {tp_text}",
            facts=facts,
        )
    nvcc, ninja = tc.get("nvcc"), tc.get("ninja")
    if nvcc and ninja:
        return Check(
            NAME,
            Status.WARN,
            f"each replica builds {' and '.join(kernels)} at first start with {nvcc} and {ninja} (minutes, "
            "and a tier that starts first pays it)",
            fix_env,
            facts=facts,
        )
    missing = " and ".join(n for n, v in (("nvcc", nvcc), ("ninja", ninja)) if not v)
    venv = "" if versions is not None else "; the engine venv is not installed yet, so no prebuilt kernel"
    fix = fix_env
    if sampler and not allreduce:
        fix += ", or add flashinfer-jit-cache of the engine set's flashinfer-python version to the engine set"
    return Check(
        NAME,
        Status.FAIL,
        f"a replica would build {' and '.join(kernels)}, and a replica unit finds no {missing} "
        f"(PATH {tc.get('path', '?')}){venv}: the replica dies before it serves ({UPSTREAM}; issue 52)",
        fix,
        facts=facts,
    )
