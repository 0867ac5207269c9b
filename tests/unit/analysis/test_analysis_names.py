"""Every `lmcache_mp_` name the analysis reads exists in real LMCache 0.5.6 (the CPU-mode capture), or is
one of the few the capture cannot show, listed with where the 0.5.6 wheel defines it."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from kvoffload.analysis import names as N

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
