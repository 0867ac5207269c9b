"""kvoffload.metrics runs on lab hosts: it must import without the controller extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"pandas", "pyarrow", "matplotlib", "duckdb", "jinja2", "numpy"}:
            raise ImportError(f"controller-only module {name} imported on a lab host")
        return None
sys.meta_path.insert(0, Block())
import kvoffload.metrics.sampler, kvoffload.metrics.gpu, kvoffload.metrics.targets, kvoffload.metrics.textfile
import kvoffload.cli.metrics
import argparse
parser = argparse.ArgumentParser()
kvoffload.cli.metrics.register(parser.add_subparsers())
args = parser.parse_args(["metrics", "snapshot", "--target", "a=http://127.0.0.1:1/metrics", "--output", "x"])
print("ok", args.target)
"""


def test_metrics_imports_without_controller_packages() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKER], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert "ok ['a=http://127.0.0.1:1/metrics']" in proc.stdout
