"""The report says, beside GPU memory used, that the offload tiers' figure includes lmcache-server's GPU
memory (its CUDA context and buffers), which the gpu tier does not run."""

from __future__ import annotations

import pandas as pd

from kvoffload.report.build import md_table
from kvoffload.report.views import DISK_COLUMNS, GPU_MEMORY_NOTE, gpu_memory_note, table


def _group(gpu_mem: list[float | None]) -> pd.DataFrame:
    return pd.DataFrame(
        {"tier": ["gpu", "cpu", "nvme"], "cell_id": ["a", "b", "c"], "gpu_mem_used_gib": gpu_mem}
    )


def test_the_hardware_table_notes_lmcache_servers_gpu_memory_where_offload_cells_measured_it() -> None:
    group = _group([120.5, 121.7, 121.6])
    assert gpu_memory_note(group) == GPU_MEMORY_NOTE
    assert "lmcache-server's CUDA context" in GPU_MEMORY_NOTE and "about 1 GiB each" in GPU_MEMORY_NOTE
    text = md_table(table("L2 disk and GPU", group, DISK_COLUMNS, note=gpu_memory_note(group), key_columns=3))
    title, note = text.splitlines()[0], text.splitlines()[2]
    assert title == "### L2 disk and GPU" and note == GPU_MEMORY_NOTE
    assert "| 121.70 |" in text.split(note)[1]  # the figure it explains, in the same table


def test_no_note_without_an_offload_cells_gpu_memory() -> None:
    assert gpu_memory_note(_group([120.5, None, None])) == ""  # the simulator's lab: no GPU telemetry
    assert gpu_memory_note(pd.DataFrame({"tier": ["gpu"], "gpu_mem_used_gib": [80.0]})) == ""
    assert gpu_memory_note(pd.DataFrame({"tier": ["cpu"]})) == ""
