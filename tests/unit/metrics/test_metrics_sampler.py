"""The scraper, the periodic sampler loop and the snapshot, over an in-process HTTP transport."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest

from kvoffload.errors import UserError
from kvoffload.metrics.gpu import GpuTool
from kvoffload.metrics.sampler import Scraper, run_sampler, take_snapshot
from kvoffload.metrics.targets import GpuTarget, HttpTarget, check_unique, parse_gpu_target, parse_http_target
from tests.unit.metrics.recorded import FIXTURES

VLLM_TEXT = (FIXTURES / "vllm-0.32-metrics-after.txt").read_text()
NVIDIA_TEXT = (FIXTURES / "nvidia-smi-documented.csv").read_text()


def _handler(request: httpx.Request) -> httpx.Response:
    if request.url.host == "up-host":
        return httpx.Response(200, text=VLLM_TEXT)
    if request.url.host == "http500":
        return httpx.Response(500, text="boom")
    raise httpx.ConnectError("connection refused", request=request)


def _gpu_runner(tool: GpuTool, timeout_s: float) -> str:
    assert tool == "nvidia-smi"
    return NVIDIA_TEXT


def _scraper(clock: list[float] | None = None) -> Scraper:
    ticks = iter(clock or [])
    return Scraper(
        [
            HttpTarget("vllm-0", "http://up-host:8000/metrics"),
            HttpTarget("dead", "http://down-host:9100/metrics"),
            HttpTarget("broken", "http://http500:9100/metrics"),
        ],
        [GpuTarget("gpu-h1", "nvidia-smi")],
        client=httpx.Client(transport=httpx.MockTransport(_handler)),
        gpu_runner=_gpu_runner,
        clock=(lambda: next(ticks)) if clock else lambda: 42.0,
    )


def _read(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_scrape_records_gaps_instead_of_raising() -> None:
    scraper = _scraper()
    try:
        result = scraper.scrape()
    finally:
        scraper.close()
    ups = {name: [s for s in samples if s.name == "up"] for name, samples in result.items()}
    assert [s.value for s in ups["vllm-0"]] == [1.0]
    assert [s.value for s in ups["dead"]] == [0.0]
    assert "ConnectError" in ups["dead"][0].labels["error"]
    assert "500" in ups["broken"][0].labels["error"]
    assert len(result["dead"]) == 1  # nothing but the gap marker
    assert len(result["gpu-h1"]) == 7 + 1  # 4 + 3 values (one [N/A]) + up
    hits = [s for s in result["vllm-0"] if s.name == "vllm:prefix_cache_hits_total"]
    assert hits[0].value == 2176.0 and hits[0].ts == 42.0


def test_sampler_appends_rounds_until_stopped(tmp_path: Path) -> None:
    stop = threading.Event()
    rounds_seen = []

    class StopAfter(Scraper):
        def scrape(self) -> dict[str, list]:  # type: ignore[type-arg]
            out = super().scrape()
            rounds_seen.append(1)
            if len(rounds_seen) == 3:
                stop.set()
            return out

    scraper = StopAfter(
        [HttpTarget("vllm-0", "http://up-host/metrics"), HttpTarget("dead", "http://down-host/metrics")],
        client=httpx.Client(transport=httpx.MockTransport(_handler)),
    )
    try:
        rounds = run_sampler(scraper, tmp_path / "metrics", interval_s=0.01, stop=stop)
    finally:
        scraper.close()
    assert rounds == 3
    dead = _read(tmp_path / "metrics" / "dead.jsonl")
    assert [r["value"] for r in dead] == [0.0, 0.0, 0.0]
    vllm = _read(tmp_path / "metrics" / "vllm-0.jsonl")
    assert sum(1 for r in vllm if r["name"] == "up") == 3
    assert {r["target"] for r in vllm} == {"vllm-0"}


def test_sampler_returns_at_once_when_already_stopped(tmp_path: Path) -> None:
    stop = threading.Event()
    stop.set()
    scraper = _scraper()
    try:
        assert run_sampler(scraper, tmp_path, interval_s=15.0, stop=stop) == 0
    finally:
        scraper.close()
    assert (tmp_path / "vllm-0.jsonl").read_text() == ""


def test_snapshot_writes_all_targets_into_one_file(tmp_path: Path) -> None:
    scraper = _scraper()
    out = tmp_path / "cell" / "metrics" / "snapshot-before.jsonl"
    try:
        n = take_snapshot(scraper, out)
    finally:
        scraper.close()
    rows = _read(out)
    assert len(rows) == n
    assert {r["target"] for r in rows} == {"vllm-0", "dead", "broken", "gpu-h1"}
    assert not list(out.parent.glob("*.tmp"))


def test_target_specs() -> None:
    assert parse_http_target("vllm-0=http://10.0.0.2:8000/metrics") == HttpTarget(
        "vllm-0", "http://10.0.0.2:8000/metrics"
    )
    assert parse_gpu_target("gpu@h1=amd-smi") == GpuTarget("gpu@h1", "amd-smi")
    for bad in ("vllm-0", "vllm-0=10.0.0.2:8000", "a/b=http://x", "snapshot-before=http://x"):
        with pytest.raises(UserError, match="--target"):
            parse_http_target(bad)
    with pytest.raises(UserError, match="given twice"):
        check_unique(["a", "b", "a"])


def test_a_snapshot_on_a_full_disk_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("kvoffload.atomic.os.fsync", full)
    out = tmp_path / "snapshot-after.jsonl"
    out.write_text("the previous version\n")
    scraper = _scraper()
    try:
        with pytest.raises(OSError, match="No space left on device"):
            take_snapshot(scraper, out)
    finally:
        scraper.close()
    assert out.read_text() == "the previous version\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot-after.jsonl"]  # no temporary file
