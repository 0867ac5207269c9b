"""The AMD engine profiles carry nothing CUDA-only: no FlashInfer, CUDA or DeepGEMM switch in their
environment, no CUDA flag in their arguments (vLLM 0.32 never uses FlashInfer's sampler off CUDA,
vllm/v1/sample/ops/topk_topp_sampler.py). The same predicate flags the nvidia profiles' sampler switch,
so it is not vacuous. The review of the ROCm variables is the profiles' own comment."""

from __future__ import annotations

import re

import pytest

from kvoffload.profiles.resolve import engine_profile
from kvoffload.tiers import TIERS

CUDA_ONLY = re.compile(r"FLASHINFER|CUDA|DEEP_GEMM|TRTLLM|NVSHMEM|fuse_allreduce", re.IGNORECASE)


def cuda_only(vendor: str, tier: str) -> list[str]:
    profile = engine_profile(vendor, tier)  # type: ignore[arg-type]
    return [s for s in (*profile.env, *profile.env.values(), *profile.args) if CUDA_ONLY.search(str(s))]


@pytest.mark.parametrize("tier", TIERS)
def test_amd_profiles_set_nothing_cuda_only(tier: str) -> None:
    assert cuda_only("amd", tier) == []
    assert sorted(cuda_only("nvidia", tier)) == [
        "VLLM_ALLREDUCE_USE_FLASHINFER",
        "VLLM_USE_FLASHINFER_SAMPLER",
    ]
    # and the ROCm switches stay at vLLM 0.32's defaults (AITER off, the plain KV layout)
    assert not [k for k in engine_profile("amd", tier).env if k.startswith("VLLM_ROCM_")]  # type: ignore[arg-type]


def attention_backend(args: list[str]) -> str | None:
    return args[args.index("--attention-backend") + 1] if "--attention-backend" in args else None


def test_amd_tiers_run_one_attention_backend() -> None:
    """vLLM 0.32 on ROCm drops ROCM_ATTN only when a KV connector is set: left to choose, the gpu tier
    and the offload tiers would run different kernels. Every AMD tier pins the same one, and the
    simulator (which stands in for `vllm serve` with the same flags) takes it."""
    from kvoffload.sim.engine_args import parse_engine_args

    pinned = {tier: attention_backend(list(engine_profile("amd", tier).args)) for tier in TIERS}
    assert set(pinned.values()) == {"TRITON_ATTN"}, pinned
    for tier in TIERS:
        parse_engine_args(["m", *engine_profile("amd", tier).args])
