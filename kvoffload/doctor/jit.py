"""The doctor's verdict on run-time kernel builds of a CUDA replica (check `flashinfer_jit`; issue 41).

vLLM 0.32's CUDA build warms FlashInfer's top-k/top-p sampler in start-up profiling when
`VLLM_USE_FLASHINFER_SAMPLER` is unset or 1 (vllm/envs.py: default True; its gate,
vllm/v1/sample/ops/topk_topp_sampler.py flashinfer_sampler_supported, checks the GPU, never whether the
kernel can be built), and FlashInfer then builds its sampling kernel with nvcc and ninja
(flashinfer/sampling.py get_sampling_module -> flashinfer/jit/core.py build_and_load). A replica unit
has no venv bin on its PATH, so no `ninja`, and a host with only the driver has no nvcc: the replica
dies before it serves (tests/fixtures/gpu/flashinfer-jit: the build failing on an H200 without them).

The shipped nvidia engine profiles turn the sampler off; this check says which way a node's replicas
will go, from the profiles' environment (the controller's) and what the node's probe found
(kvoffload/doctor/probe.py: the toolchain a unit sees, and FlashInfer's prebuilt kernel packages in the
engine venv), and fails a node where the sampler is on and nothing can provide the kernel. Pure: JSON
and mappings in, a check out. No IO, no printing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvoffload.doctor.verdict import Check, Status

NAME = "flashinfer_jit"
SAMPLER_ENV = "VLLM_USE_FLASHINFER_SAMPLER"
# FlashInfer's packages of prebuilt kernels (flashinfer/jit/env.py looks for their artifacts before a
# JIT build): with one of the installed flashinfer-python's version, no kernel is compiled at start.
PREBUILT_PACKAGES = ("flashinfer-jit-cache", "flashinfer-cubin")
UPSTREAM = "vllm-project/vllm#49497"


def sampler_on(value: str | None) -> bool:
    """Whether vLLM 0.32 turns the FlashInfer sampler on, given the variable's value in the unit's
    environment (None: unset). vllm/envs.py reads it as `bool(int(value))`, default True."""
    if value is None:
        return True
    try:
        return bool(int(value))
    except ValueError:
        return True  # vLLM itself would fail on it at start; judge it as the worst case


def flashinfer_jit(
    build: str | None,
    sampler_values: Mapping[str, str | None],
    toolchain: Mapping[str, Any] | None,
    versions: Mapping[str, Any] | None,
) -> Check:
    """The check of one node.

    `build`: the engine build its venv holds (cuda, cpu; None: no vLLM on the node);
    `sampler_values`: tier -> VLLM_USE_FLASHINFER_SAMPLER in that tier's engine profile (None: unset),
    for the tiers its replicas run; `toolchain`: the probe's `unit_toolchain` record (nvcc and ninja as
    a replica unit finds them); `versions`: the probe's engine venv package versions (None: no venv yet).
    """
    if build != "cuda":
        return Check(NAME, Status.SKIP, f"no CUDA build of vLLM on this host ({build or 'no vLLM'})")
    on = sorted(tier for tier, value in sampler_values.items() if sampler_on(value))
    tc = dict(toolchain or {})
    facts: dict[str, Any] = {"sampler": {t: sampler_values[t] for t in sorted(sampler_values)}, **tc}
    if not on:
        return Check(
            NAME,
            Status.OK,
            f"no FlashInfer kernel is built at start: {SAMPLER_ENV}=0 in the nvidia engine profiles "
            "(every tier samples with PyTorch/Triton), and TP > 1 CUDA replicas run without the fused "
            "all-reduce",
            facts=facts,
        )
    have = dict(versions or {})
    flashinfer = have.get("flashinfer-python")
    prebuilt = [
        p for p in PREBUILT_PACKAGES if flashinfer and str(have.get(p) or "").split("+")[0] == flashinfer
    ]
    if prebuilt:
        return Check(
            NAME,
            Status.OK,
            f"FlashInfer sampler on ({', '.join(on)}): its kernel comes prebuilt from {prebuilt[0]} "
            f"{flashinfer}",
            facts=facts,
        )
    nvcc, ninja = tc.get("nvcc"), tc.get("ninja")
    if nvcc and ninja:
        return Check(
            NAME,
            Status.WARN,
            f"FlashInfer sampler on ({', '.join(on)}): each replica builds its kernel at first start with "
            f"{nvcc} and {ninja} (minutes, and a tier that starts first pays it)",
            f'set {SAMPLER_ENV}: "0" in the nvidia engine profiles\' env (the shipped default)',
            facts=facts,
        )
    missing = " and ".join(n for n, v in (("nvcc", nvcc), ("ninja", ninja)) if not v)
    venv = "" if versions is not None else "; the engine venv is not installed yet, so no prebuilt kernel"
    return Check(
        NAME,
        Status.FAIL,
        f"FlashInfer sampler on ({', '.join(on)}: {SAMPLER_ENV} unset or 1) and a replica unit finds no "
        f"{missing} (PATH {tc.get('path', '?')}){venv}: the replica dies in start-up profiling "
        f"building FlashInfer's sampling kernel ({UPSTREAM})",
        f'set {SAMPLER_ENV}: "0" in kvoffload/profiles/engine/nvidia-<tier>.yaml env (the shipped '
        "default), or add flashinfer-jit-cache of the engine set's flashinfer-python version to the "
        "engine set",
        facts=facts,
    )
