"""The measurement on a real CUDA device, quick grids at the toy shape (skipped without one)."""

from __future__ import annotations

import pytest

from kvoffload.calibrate.gpu import measure_gpu
from kvoffload.calibrate.sanity import check_figures, failures
from kvoffload.calibrate.shapes import get_shape

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'kvoffload-lab[calibrate]')")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_quick_measurement_is_complete_and_sane() -> None:
    res = measure_gpu(get_shape("llama-8b"), "cuda", True, "2026-01-01T00:00:00+00:00", ["test"])
    assert res.environment.device_type == "cuda"
    assert [p.context_tokens for p in res.prefill.points] == [1024, 4096, 16384, 65536]
    assert all(p.tokens_per_s > 0 for p in res.prefill.points)
    assert res.decode.points and all(p.graphed for p in res.decode.points)
    assert res.transfer.host_to_device_gbps > 1.0
    checks = check_figures(res.environment.device_name, res.ceilings, res.prefill, res.decode, res.transfer)
    assert failures(checks) == []
