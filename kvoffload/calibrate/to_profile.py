"""Turn a raw calibration into a simulator cost profile (the format of `kvoffload/sim/profile.py`).

Pure conversion plus one YAML write; no measurement and no torch. The profile is validated with the
simulator's own model before it is written, so a profile this module writes is one the simulator loads.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from kvoffload.atomic import write_text_atomic
from kvoffload.calibrate.raw import RawCalibration
from kvoffload.calibrate.sanity import failures
from kvoffload.sim.profile import CostProfile, parse_profile

_SHAPE_NAMES = {"llama-8b": "llama-3.1-8b", "llama-70b": "llama-3.1-70b"}


def _vendor(device_name: str) -> str:
    lowered = device_name.lower()
    if "nvidia" in lowered or lowered.startswith(("h100", "h200", "a100", "l40")):
        return "nvidia"
    if "amd" in lowered or "instinct" in lowered or "mi300" in lowered:
        return "amd"
    return "none"


def _provenance(raw: RawCalibration, method: str, device: str | None = None) -> dict[str, Any]:
    env = raw.environment
    torch = f"torch {env.torch}" + (f", CUDA {env.cuda}" if env.cuda else "")
    out: dict[str, Any] = {
        "source": "measured",
        "method": method,
        "device": device or env.device_name,
        "torch": torch,
        "date": env.started_at,
    }
    if env.driver:
        out["driver"] = env.driver
    return out


def monotone_prefill(raw: RawCalibration) -> tuple[list[list[float]], int]:
    """[context, tokens_per_s] points with the total time made non-decreasing in context (timing noise
    can make a prompt look faster than a shorter one, which the simulator rightly rejects), and how many
    points were raised to their predecessor's time."""
    points: list[list[float]] = []
    raised = 0
    floor = 0.0  # the previous point's cumulative time, as the rounded figures give it
    for p in raw.prefill.points:
        tps = round(p.context_tokens / p.total_s, 1)
        if p.context_tokens / tps < floor:
            # Round down, so the rounded figure keeps the time at or above the previous one.
            tps = math.floor(p.context_tokens / floor * 10) / 10
            raised += 1
        floor = p.context_tokens / tps
        points.append([p.context_tokens, tps])
    return points, raised


def profile_document(raw: RawCalibration, name: str) -> dict[str, Any]:
    """The profile as plain data, in the key order the shipped profiles use."""
    env, shape = raw.environment, raw.shape
    fits = shape.weights_bytes < 0.9 * env.device_memory_bytes if env.device_memory_bytes else True
    scaling = (
        "per-layer timings scaled by num_layers"
        + (
            f" (full {shape.num_layers}-layer stack checked: "
            + ", ".join(
                f"{c.context_tokens} tokens ratio {c.ratio:.3f}" for c in raw.prefill.full_model_checks
            )
            + ")"
            if raw.prefill.full_model_checks
            else ""
        )
        + ("" if fits else f"; the {shape.weights_bytes / 2**30:.0f} GiB of weights do not fit this device")
    )
    sanity_failed = failures(raw.sanity)
    sanity = (
        "sanity vs datasheet: "
        + ("; ".join(sanity_failed) if sanity_failed else f"{len(raw.sanity)} checks within ceilings")
        if raw.sanity
        else "no datasheet known for this device: figures unchecked"
    )
    description = (
        f"{env.device_name}, {shape.name} shape ({shape.source}) in {shape.dtype}, measured by "
        f"`kvoffload-lab calibrate` on {env.started_at[:10]} with random weights of the shape"
        f"{' (--quick)' if raw.quick else ''}: {scaling}. Disk figures are of {raw.disk.path} "
        f"({raw.disk.filesystem})."
    )
    if not fits:
        description += (
            " The weights exceed one device's memory, so vLLM could not serve this model on one such GPU; "
            "times are those of a device with enough memory."
        )
    prefill_points, raised = monotone_prefill(raw)
    prefill_note = (
        f"; {raised} point(s) raised to the previous context's total time (noise made them faster)"
        if raised
        else ""
    )
    return {
        "name": name,
        "description": description,
        "hardware": {
            "gpu": env.device_name,
            "vendor": _vendor(env.device_name),
            "gpu_memory_gib": round(env.device_memory_bytes / 2**30, 2) if env.device_memory_bytes else 1.0,
        },
        "model": {
            "shape": _SHAPE_NAMES.get(shape.name, shape.name),
            "num_layers": shape.num_layers,
            "num_kv_heads": shape.num_kv_heads,
            "head_dim": shape.head_dim,
            "dtype": shape.dtype,
            "kv_bytes_per_token": shape.kv_bytes_per_token,
            "weights_gib": round(shape.weights_bytes / 2**30, 2),
        },
        "prefill": {"points": prefill_points},
        "decode": {
            "points": [[p.batch, p.context_tokens, float(f"{p.step_s:.6g}")] for p in raw.decode.points]
        },
        "transfer": {
            "host_to_device_gbps": round(raw.transfer.host_to_device_gbps, 2),
            "device_to_host_gbps": round(raw.transfer.device_to_host_gbps, 2),
            "per_chunk_overhead_s": float(f"{raw.transfer.per_chunk_overhead_s:.3g}"),
        },
        "disk": {
            "read_gbps": round(raw.disk.read_gbps, 3),
            "write_gbps": round(raw.disk.write_gbps, 3),
        },
        "provenance": {
            "hardware": _provenance(
                raw, "torch.cuda.get_device_properties and nvidia-smi on the measured host"
            ),
            "model": _provenance(
                raw, f"dimensions of {shape.source}; kv_bytes_per_token = 2*layers*kv_heads*head_dim*2"
            ),
            "prefill": _provenance(raw, f"{raw.prefill.method}; {scaling}{prefill_note}; {sanity}"),
            "decode": _provenance(raw, f"{raw.decode.method}; {scaling}; {sanity}"),
            "transfer": _provenance(raw, f"{raw.transfer.method}; {sanity}"),
            "disk": _provenance(
                raw,
                raw.disk.method + ("; " + "; ".join(raw.disk.notes) if raw.disk.notes else ""),
                device=f"{raw.disk.filesystem}, host {env.hostname}",
            ),
        },
    }


class _Dumper(yaml.SafeDumper):
    """Block style, except lists of scalars (points) in flow style, one per line."""


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = all(not isinstance(item, (list, dict)) for item in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def write_profile(raw: RawCalibration, path: Path, name: str | None = None) -> CostProfile:
    """Validate the profile built from `raw` with the simulator's model, then write it as YAML."""
    data = profile_document(raw, name or path.stem)
    profile = parse_profile(data, str(path))
    header = (
        f"# Measured by `kvoffload-lab calibrate --model-shape {raw.shape.name}` on "
        f"{raw.environment.device_name}\n"
        f"# ({raw.environment.started_at}). Raw timings: the calibrate raw JSON of the same run.\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=110, allow_unicode=True)
    write_text_atomic(path, header + body)
    return profile
