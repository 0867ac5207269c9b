"""Where the metrics tests' recorded inputs lie: the documented formats beside these tests, the real
H200 capture with the other hardware captures (tests/fixtures/gpu)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
H200_CAPTURE = Path(__file__).parents[2] / "fixtures" / "gpu" / "nvidia-smi-h200.csv"
