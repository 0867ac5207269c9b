"""Shared paths for the calibrate tests: the raw H200 runs kept as fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "calibrate"


@pytest.fixture
def raw_llama8b_path() -> Path:
    return FIXTURES / "h200-llama-8b.json"
