"""kvoffload-lab: measure whether offloading vLLM's KV cache to CPU RAM or NVMe helps real conversations.

The package is layered (see docs/architecture.md section 2): cli -> orchestrate -> {playbook, replay, metrics,
ingest} -> config; analysis depends on pandas and config only; report on analysis; sim stands alone.
"""

__version__ = "0.1.0"
