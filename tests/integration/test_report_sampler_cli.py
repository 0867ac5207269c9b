"""`kvoffload-lab metrics sample|snapshot` as real processes against a loopback /metrics server.

The server replays a real vLLM 0.32 exposition; a second target points at a closed port. The sampler
must record the dead target as gaps and exit 0 on SIGTERM with its files closed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.loopback import free_port, serve_pages

pytestmark = pytest.mark.integration

EXPOSITION = (
    Path(__file__).parents[1] / "unit" / "metrics" / "fixtures" / "vllm-0.32-metrics-after.txt"
).read_bytes()


@pytest.fixture
def server() -> Iterator[str]:
    with serve_pages({"/metrics": EXPOSITION}) as base:
        yield f"{base}/metrics"


def _lines(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvoffload.cli.main", *args]


def test_sampler_records_gaps_and_stops_on_sigterm(server: str, tmp_path: Path) -> None:
    out = tmp_path / "metrics"
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    proc = subprocess.Popen(
        _cli(
            *("metrics", "sample", "--target", f"vllm-0={server}", "--target", f"dead={dead}"),
            *("--interval", "0.3", "--timeout", "2", "--output", str(out)),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if sum(1 for r in _lines(out / "vllm-0.jsonl") if r["name"] == "up") >= 3:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, stderr
    assert "rounds written" in stdout
    vllm = _lines(out / "vllm-0.jsonl")
    ups = [r["value"] for r in vllm if r["name"] == "up"]
    assert len(ups) >= 3 and set(ups) == {1.0}
    assert any(r["name"] == "vllm:prefix_cache_hits_total" and r["value"] == 2176.0 for r in vllm)
    gaps = _lines(out / "dead.jsonl")
    assert len(gaps) == len(ups) and {r["value"] for r in gaps} == {0.0}  # one gap per round, no crash
    assert all("ConnectError" in str(r["labels"]) for r in gaps)


def test_snapshot_then_exit(server: str, tmp_path: Path) -> None:
    out = tmp_path / "cell" / "metrics" / "snapshot-after.jsonl"
    proc = subprocess.run(
        _cli("metrics", "snapshot", "--target", f"vllm-0={server}", "--output", str(out)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = _lines(out)
    assert {r["target"] for r in rows} == {"vllm-0"}
    assert [r["value"] for r in rows if r["name"] == "up"] == [1.0]


def test_bad_target_is_a_user_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        _cli("metrics", "sample", "--target", "vllm-0", "--output", str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and "--target 'vllm-0'" in proc.stderr
