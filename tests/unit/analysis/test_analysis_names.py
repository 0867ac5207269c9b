"""Every `lmcache_mp_` name the analysis reads exists in real LMCache 0.5.6 (the CPU-mode capture), or is
one of the few the capture cannot show, listed with where the 0.5.6 wheel defines it; the names the
analysis knows are exactly the families the 0.5.6 wheel defines (tests/support/lmcache_names.py)."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.analysis import names as N
from kvoffload.cli.args import DEFAULT_WHEEL_CACHE
from tests.support.lmcache_names import (
    ExtractError,
    exported_name,
    families_in_source,
    fixture_for,
    prometheus_unit,
    read_fixture,
    render,
    wheel_families,
    wheelhouse_lmcache_wheels,
)

LMCACHE = Path(__file__).resolve().parents[2] / "fixtures" / "lmcache-0.5.6-cpu"


def _captured() -> dict[str, str]:
    """Sample base names of the capture (counters with `_total`, histograms without suffix) -> type."""
    out: dict[str, str] = {}
    for path in LMCACHE.glob("metrics-*.txt"):
        for f in text_string_to_metric_families(path.read_text()):
            if f.name.startswith("lmcache_mp_"):
                out[f"{f.name}_total" if f.type == "counter" else f.name] = f.type
    return out


def _lmcache_candidates() -> list[tuple[str, str]]:
    """(constant, candidate) for every lmcache_mp_ candidate name or pattern in names.py."""
    out = []
    for attr, value in vars(N).items():
        if attr.isupper() and isinstance(value, tuple):
            out += [(attr, c) for c in value if isinstance(c, str) and c.startswith("lmcache_mp_")]
    return out


def test_the_capture_is_the_one_in_the_fixture_list() -> None:
    listed = dict(line.split() for line in (LMCACHE / "metric-names-types.txt").read_text().splitlines())
    assert _captured() == listed


def test_every_lmcache_name_read_is_in_the_real_capture_or_explained() -> None:
    captured = _captured()
    candidates = _lmcache_candidates()
    assert len(candidates) >= 20  # the walk over names.py found the LMCache constants
    for attr, name in candidates:
        if name in N.LMC_NOT_IN_CPU_CAPTURE:
            continue
        if re.escape(name) == name:
            assert name in captured, f"{attr}: {name} is not a family of LMCache 0.5.6"
        else:  # a histogram base pattern: it must match a real histogram
            hits = [n for n, t in captured.items() if t == "histogram" and re.fullmatch(name, n)]
            assert hits, f"{attr}: {name} matches no histogram of LMCache 0.5.6"


def test_the_names_the_capture_cannot_show_are_really_absent_from_it() -> None:
    captured = _captured()
    read = {name for _attr, name in _lmcache_candidates()}
    assert set(N.LMC_NOT_IN_CPU_CAPTURE) <= read  # no stale entries
    for name, why in N.LMC_NOT_IN_CPU_CAPTURE.items():
        assert not any(re.fullmatch(name, n) for n in captured), f"{name} is captured: drop it from the list"
        assert re.match(r"^\w+\.py: ", why), why  # says which 0.5.6 source file defines it


def test_per_tier_hits_and_the_l2_eviction_counter_use_the_0_5_6_spelling() -> None:
    assert N.LMC_LOOKUP_HIT_L1 == ("lmcache_mp_lookup_hit_l1_tokens_total",)
    assert N.LMC_LOOKUP_HIT_L2 == ("lmcache_mp_lookup_hit_l2_tokens_total",)
    assert N.LMC_L2_EVICTED == ("lmcache_mp_l2_evicted_objects_chunks_total",)


# Every family LMCache 0.5.6's MP server can export, derived from its wheel (tests/support/lmcache_names.py;
# tests/fixtures/lmcache-0.5.6-wheel/README.md says how to regenerate it).
WHEEL_FAMILIES = LMCACHE.parent / "lmcache-0.5.6-wheel" / "metric-families.txt"
LANE = "the real-engine lane (tests/lab/test_lab_real_engine.py, `python -m tests.support.lanes real-engine`)"


def test_the_known_names_are_exactly_the_families_the_0_5_6_wheel_defines() -> None:
    wheel = read_fixture(WHEEL_FAMILIES)
    assert set(N.LMC_KNOWN_NAMES) == set(wheel)
    # the CUDA transfer path's families, which no CPU-mode capture shows (issue 41)
    assert {
        "lmcache_mp_num_submitted_stores_total",
        "lmcache_mp_num_finished_retrieves_total",
        "lmcache_mp_transfer_phase_bytes_total",
        "lmcache_mp_transfer_phase_elapsed_seconds_total",
        "lmcache_mp_transfer_staging_throughput_GB_per_second",
    } <= N.LMC_KNOWN_NAMES
    # the real capture's families, with the type the wheel gives them
    captured = _captured()
    assert {name: wheel[name] for name in captured} == captured


def test_the_names_not_seen_on_cpu_are_the_wheel_families_no_real_run_showed() -> None:
    families = {line.split()[0]: line.split()[2] for line in WHEEL_FAMILIES.read_text().splitlines()}
    seen = set(_captured()) | set((LMCACHE / "metric-names-real-engine-lane.txt").read_text().split())
    assert set(N.LMC_NOT_SEEN_ON_CPU) == set(families) - seen
    for name, module in N.LMC_NOT_SEEN_ON_CPU.items():
        assert families[name] == f"lmcache/v1/{module}", name  # cited where the wheel defines it
    # the names the analysis reads but the capture cannot show are among them
    exact = {
        name
        for pattern in N.LMC_NOT_IN_CPU_CAPTURE
        for name in N.LMC_NOT_SEEN_ON_CPU
        if re.fullmatch(pattern, name)
    }
    assert len(exact) == len(N.LMC_NOT_IN_CPU_CAPTURE)


_SOURCE = """
from functools import partial
from opentelemetry import metrics
from lmcache.v1.mp_observability.otel_init import register_gauge

def register_gauge_like(meter, gauge_name):
    meter.create_observable_gauge(gauge_name, callbacks=[])  # a wrapper: its caller names the metric

class Sub:
    def __init__(self, phases):
        meter = metrics.get_meter("lmcache_mp.perf")
        self.a = meter.create_counter("lmcache_mp.l2_store_completed_objects", unit="chunks")
        self.b = meter.create_counter("lmcache_mp.transfer_phase_elapsed", "s")
        self.c = meter.create_histogram("lmcache_mp.l2_load_throughput", unit="GB/s")
        self.d = meter.create_histogram("lmcache_mp.real_reuse_gap_objects", unit="{chunks}")
        self.e = meter.create_counter("lmcache_mp.transfer_phase_bytes", unit="By")
        self.f = meter.create_counter("lmcache_mp.num_chunks_loaded")
        meter.create_observable_counter("lmcache_mp.event_bus.dropped_events_total", callbacks=[])
        meter.create_up_down_counter("lmcache_mp.l1_staging", unit="By")
        meter.create_observable_gauge("lmcache_mp.drain_lag", [], "s")
        meter.create_counter("vllm.other", unit="tokens")
        self.h = {p: meter.create_histogram(f"lmcache_blend.{p}_duration", unit="ms") for p in phases}
        register_gauge("lmcache.l1", "lmcache_mp.l1_memory_usage_bytes", "d", lambda: 0)
        _gauge = partial(register_gauge, "lmcache.mp_server")
        _gauge("lmcache_mp.active_prefetch_jobs", "d", lambda: 0)
"""


def test_the_extractor_names_instruments_as_the_prometheus_exporter_does() -> None:
    got = {(f.name, f.type) for f in families_in_source(_SOURCE, "m.py")}
    assert got == {
        ("lmcache_mp_l2_store_completed_objects_chunks_total", "counter"),
        ("lmcache_mp_transfer_phase_elapsed_seconds_total", "counter"),  # unit as the 2nd positional
        ("lmcache_mp_l2_load_throughput_GB_per_second", "histogram"),
        ("lmcache_mp_real_reuse_gap_objects", "histogram"),  # an annotation adds no suffix
        ("lmcache_mp_transfer_phase_bytes_total", "counter"),  # "By" is bytes, already the suffix
        ("lmcache_mp_num_chunks_loaded_total", "counter"),
        ("lmcache_mp_event_bus_dropped_events_total", "counter"),  # no `_total_total`
        ("lmcache_mp_l1_staging_bytes", "gauge"),  # an up-down counter is exported as a gauge
        ("lmcache_mp_drain_lag_seconds", "gauge"),  # unit as the 3rd positional of observables
        ("lmcache_mp_l1_memory_usage_bytes", "gauge"),
        ("lmcache_mp_active_prefetch_jobs", "gauge"),  # through partial(register_gauge, ...)
    }
    assert prometheus_unit("m/s") == "meters_per_second" and prometheus_unit("1") == ""
    assert exported_name("lmcache_mp.x", "requests", "counter") == "lmcache_mp_x_requests_total"


@pytest.mark.parametrize(
    "call",
    [
        'meter.create_counter(NAME, unit="chunks")',
        'meter.create_counter(f"lmcache_mp.{kind}_loaded")',
        'meter.create_histogram("lmcache_mp.x", unit=UNIT)',
    ],
)
def test_the_extractor_refuses_an_lmcache_name_it_cannot_read(call: str) -> None:
    # A dynamic name or unit could be any family: listing the others only would hide it.
    with pytest.raises(ExtractError, match=r"m\.py:2: "):
        families_in_source(f"def f(meter):\n    {call}\n", "m.py")


def test_the_extractor_reads_only_the_mp_server_packages_of_a_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "lmcache-9.9.9-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(
            "lmcache/v1/distributed/a.py", 'register_gauge("m", "lmcache_mp.l2_usage_bytes", "", f)\n'
        )
        zf.writestr("lmcache/v1/mp_observability/b.py", 'meter.create_counter("lmcache_mp.timeouts")\n')
        # the coordinator is another process, with its own /metrics
        zf.writestr("lmcache/v1/mp_coordinator/c.py", 'meter.create_observable_gauge("lmcache_mp.key_x")\n')
    assert render(wheel_families(wheel)) == (
        "lmcache_mp_l2_usage_bytes gauge lmcache/v1/distributed/a.py\n"
        "lmcache_mp_timeouts_total counter lmcache/v1/mp_observability/b.py\n"
    )
    assert fixture_for(wheel) == LMCACHE.parent / "lmcache-9.9.9-wheel" / "metric-families.txt"


def test_an_lmcache_wheel_in_the_engine_wheelhouse_defines_the_committed_families() -> None:
    # The real-engine lane builds the wheelhouse and runs this same check without skipping
    # (test_lab_real_engine.py); here it runs wherever a wheelhouse already exists.
    wheels = wheelhouse_lmcache_wheels(DEFAULT_WHEEL_CACHE)
    if not wheels:
        pytest.skip(f"no lmcache wheel in {DEFAULT_WHEEL_CACHE}/engine-*/ yet: {LANE} downloads one")
    for wheel in wheels:
        assert fixture_for(wheel).is_file(), f"{wheel.name}: python -m tests.support.lmcache_names {wheel}"
        assert render(wheel_families(wheel)) == fixture_for(wheel).read_text(), wheel.name
