"""Sampler targets from the command line: `NAME=URL` (Prometheus) and `NAME=TOOL` (GPU tool).

The name becomes the file name `metrics/<NAME>.jsonl` and the `target` field of every sample, and is
how the controller matches samples to the `targets` map of cell.json. Lab-host side, base deps only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvoffload.errors import UserError
from kvoffload.metrics.gpu import GpuTool, parse_gpu_spec

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,99}$")


@dataclass(frozen=True)
class HttpTarget:
    """A Prometheus text endpoint (vLLM, lmcache-server, node-exporter, Caddy, DCGM exporter)."""

    name: str
    url: str


@dataclass(frozen=True)
class GpuTarget:
    """A GPU tool polled on this host."""

    name: str
    tool: GpuTool


def _check_name(name: str, flag: str, spec: str) -> None:
    if not _NAME.match(name) or name.startswith("snapshot-"):
        raise UserError(
            f"{flag} {spec!r}: target name {name!r} must be 1-100 of [A-Za-z0-9._@-], start with a letter "
            "or digit, and not start with 'snapshot-' (it names the file metrics/<NAME>.jsonl)"
        )


def parse_http_target(spec: str) -> HttpTarget:
    """Parse `--target NAME=URL`."""
    name, sep, url = spec.partition("=")
    if not sep or not url.startswith(("http://", "https://")):
        raise UserError(f"--target {spec!r}: expected NAME=URL with an http:// or https:// URL")
    _check_name(name, "--target", spec)
    return HttpTarget(name=name, url=url)


def parse_gpu_target(spec: str) -> GpuTarget:
    """Parse `--gpu NAME=nvidia-smi|amd-smi`."""
    name, tool = parse_gpu_spec(spec)
    _check_name(name, "--gpu", spec)
    return GpuTarget(name=name, tool=tool)


def check_unique(names: list[str]) -> None:
    """Two targets with one name would write into one file."""
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise UserError(f"target name {n!r} is given twice (--target/--gpu): names must be unique")
        seen.add(n)
