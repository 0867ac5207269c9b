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
# GPU whose KV it maps (CUDA IPC) and copies from: on Hopper a bare torch context with its kernels
# loaded shows about 0.5 GiB in nvidia-smi, and LMCache adds its per-GPU transfer buffers and cupy's
# stream and memory pool. 1 GiB per GPU is an estimate from that, not a measurement (this was written
# without a GPU): the first real lab's readings should replace it. The report says so beside GPU memory
# used (kvoffload/report), and `plan` warns when the utilization leaves less (kvoffload/profiles).
LMCACHE_SERVER_GPU_OVERHEAD_GIB = 1.0
