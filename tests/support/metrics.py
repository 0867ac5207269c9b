"""Reading a Prometheus exposition: the way the simulator-fidelity tests compare it with real captures,
and the sample values the simulator tests assert on."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families


def families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """Family name -> (type, label names), as prometheus-client's parser reads an exposition."""
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for f in text_string_to_metric_families(text):
        labels = frozenset(k for s in f.samples for k in s.labels if k != "le")
        kind, known = out.get(f.name, (f.type, frozenset()))
        out[f.name] = (kind, known | labels)
    return out


def sample_values(registry: CollectorRegistry) -> dict[str, float]:
    """Sample name -> value summed over label sets, of what `registry` exposes (histogram buckets
    left out)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if "le" not in s.labels:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out
