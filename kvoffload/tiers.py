"""The KV tiers: the one definition every layer (config, profiles, results contracts) imports.

A leaf module: no imports from the package, no IO.
"""

from __future__ import annotations

from typing import Literal

Tier = Literal["gpu", "cpu", "nvme"]
TIERS: tuple[Tier, ...] = ("gpu", "cpu", "nvme")  # the order tiers are run and reported in

# GPU memory lmcache-server holds on every GPU of its node on the offload tiers (cpu, nvme), outside
# each replica's --gpu-memory-utilization budget (vLLM budgets its own process only), so an offload
# cell shows more GPU memory used than a gpu-tier cell. The server's torch opens a CUDA context on each
# GPU whose KV it maps (CUDA IPC) and copies from. Measured on one H200 (torch 2.11 + CUDA 13, driver
# 580.159, 2026-12-04, nvidia-smi memory.used of one process): 529 MiB for the context and a 1 MiB
# tensor, 649 MiB once cuBLAS ran, +256 MiB for a 256 MiB copy buffer (with CUDA_MODULE_LOADING=EAGER:
# 1261 and 1807 MiB). LMCache adds its per-GPU transfer buffers and cupy's stream and memory pool, not
# measured (no LMCache there): 1 GiB per GPU is the context measured plus an estimate of those; the
# first real lab's readings should replace it. The report says so beside GPU memory used
# (kvoffload/report), and `plan` warns when the utilization leaves less (kvoffload/profiles).
LMCACHE_SERVER_GPU_OVERHEAD_GIB = 1.0
