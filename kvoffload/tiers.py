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

# The vllm role's vllm_health_timeout (a golden test pins the two): the longest a replica may take from
# start to /health, and so from registering its KV cache with lmcache-server to serving.
VLLM_HEALTH_TIMEOUT_S = 900
# lmcache-server reaps a worker that registered but never pinged after this many seconds. A worker
# pings from its first lookup on (LMCache 0.5.6's heartbeat starts with the first request, not at
# registration), so a shorter grace would reap a live replica still waiting for its first request and
# its stores would be lost without a word; a longer one keeps the KV pool of a replica that died
# before its first request mapped (its restart cannot get the GPU memory back) for that long. It
# covers two start waves (one replica, then the rest) plus 5 minutes for Caddy and the cell's first
# request; LMCache's default is 3600 s.
LMCACHE_REGISTRATION_GRACE_S = 2 * VLLM_HEALTH_TIMEOUT_S + 300
