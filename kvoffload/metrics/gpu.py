"""GPU telemetry from vendor tools: run `nvidia-smi` / `amd-smi` and turn their output into samples.

Lab-host side (base deps only). Each GPU gives up to four samples per poll, all labelled `gpu` (index)
and `vendor`, plus `uuid` and `model` where the tool prints them:
`gpu_power_watts`, `gpu_utilization_percent`, `gpu_memory_used_bytes`, `gpu_memory_total_bytes`.
A value the tool reports as unavailable (`[N/A]`, `N/A`, `[Not Supported]`) is left out, never
invented. A DCGM exporter is not handled here: it is an ordinary Prometheus target for the sampler.

This module must not write files or decide the sampling schedule.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
from typing import Final, Literal

from kvoffload.errors import UserError
from kvoffload.metrics.samples import Sample

GpuTool = Literal["nvidia-smi", "amd-smi"]
GPU_TOOLS: Final = ("nvidia-smi", "amd-smi")

NVIDIA_QUERY: Final = "index,uuid,name,power.draw,utilization.gpu,memory.used,memory.total"
NVIDIA_COMMAND: Final = (
    "nvidia-smi",
    f"--query-gpu={NVIDIA_QUERY}",
    "--format=csv,noheader,nounits",
)
# power (-p), graphics utilization (-u), VRAM usage (-v): one table row per GPU.
AMD_COMMAND: Final = ("amd-smi", "monitor", "-p", "-u", "-v")

MIB: Final = 1024 * 1024
_UNAVAILABLE = re.compile(r"^\[?(n/?a|not supported|unknown error|gpu is lost)\]?$", re.IGNORECASE)
_AMD_VRAM_COLUMNS: Final = (("VRAM_USED", "gpu_memory_used_bytes"), ("VRAM_TOTAL", "gpu_memory_total_bytes"))
_AMD_UNITS: Final = frozenset({"W", "mW", "%", "°C", "MHz", "MB", "GB", "Mb/s", "B"})


def _number(text: str) -> float | None:
    text = text.strip()
    if not text or _UNAVAILABLE.match(text):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_nvidia_smi_csv(text: str, target: str, ts: float) -> list[Sample]:
    """Parse `nvidia-smi --query-gpu=<NVIDIA_QUERY> --format=csv,noheader,nounits` output."""
    out: list[Sample] = []
    try:
        rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    except csv.Error as exc:  # the callers (sampler, textfile) expect ValueError for bad output
        raise ValueError(f"nvidia-smi output is not CSV: {exc}") from exc
    for row in rows:
        if not row or not "".join(row).strip():
            continue
        if len(row) != 7:
            raise ValueError(f"nvidia-smi row has {len(row)} fields, expected 7 ({NVIDIA_QUERY}): {row!r}")
        index, uuid, model, power, util, mem_used, mem_total = (c.strip() for c in row)
        labels = {"gpu": index, "uuid": uuid, "model": model, "vendor": "nvidia"}
        values = {
            "gpu_power_watts": _number(power),
            "gpu_utilization_percent": _number(util),
            "gpu_memory_used_bytes": _scaled(_number(mem_used), MIB),
            "gpu_memory_total_bytes": _scaled(_number(mem_total), MIB),
        }
        out.extend(
            Sample(ts=ts, target=target, name=n, labels=dict(labels), value=v)
            for n, v in values.items()
            if v is not None
        )
    return out


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _amd_cells(line: str) -> list[str]:
    """Split an `amd-smi monitor` row into cells: a number and the unit after it form one cell."""
    cells: list[str] = []
    for token in line.split():
        if token in _AMD_UNITS and cells:
            cells[-1] = f"{cells[-1]} {token}"
        else:
            cells.append(token)
    return cells


def _amd_value(cell: str) -> tuple[float | None, str]:
    number, _, unit = cell.partition(" ")
    return _number(number), unit


def parse_amd_smi_monitor(text: str, target: str, ts: float) -> list[Sample]:
    """Parse the table `amd-smi monitor` prints (columns GPU, POWER, GFX_UTIL, VRAM_USED, VRAM_TOTAL...).

    Columns that are absent (an older amd-smi, or other flags) give no sample. VRAM in `MB` is taken as
    MiB, which is what amd-smi computes (bytes // 2**20).
    """
    out: list[Sample] = []
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.strip().endswith(":"):  # "PROCESS INFO:": the process table of `monitor -q` follows
            break
        if line.lstrip().startswith("GPU ") or line.strip() == "GPU":
            header = line.split()
            continue
        if header is None:
            continue
        cells = _amd_cells(line)
        if len(cells) != len(header):
            raise ValueError(
                f"amd-smi monitor row has {len(cells)} cells for {len(header)} columns: {line!r}"
            )
        row = dict(zip(header, cells, strict=True))
        labels = {"gpu": row["GPU"], "vendor": "amd"}
        values: dict[str, float | None] = {}
        if "POWER" in row:
            power, unit = _amd_value(row["POWER"])
            values["gpu_power_watts"] = power / 1000 if power is not None and unit == "mW" else power
        if "GFX_UTIL" in row:
            values["gpu_utilization_percent"] = _amd_value(row["GFX_UTIL"])[0]
        for column, name in _AMD_VRAM_COLUMNS:
            if column in row:
                amount, unit = _amd_value(row[column])
                values[name] = _scaled(amount, 1024 * MIB if unit == "GB" else MIB)
        out.extend(
            Sample(ts=ts, target=target, name=n, labels=dict(labels), value=v)
            for n, v in values.items()
            if v is not None
        )
    return out


def gpu_command(tool: GpuTool) -> tuple[str, ...]:
    """The exact command line polled for a tool."""
    return NVIDIA_COMMAND if tool == "nvidia-smi" else AMD_COMMAND


def parse_gpu_output(tool: GpuTool, text: str, target: str, ts: float) -> list[Sample]:
    """Dispatch to the parser of `tool`."""
    if tool == "nvidia-smi":
        return parse_nvidia_smi_csv(text, target, ts)
    return parse_amd_smi_monitor(text, target, ts)


def run_gpu_tool(tool: GpuTool, timeout_s: float) -> str:
    """Run the tool once and return its stdout; raise RuntimeError with its stderr when it fails."""
    try:
        proc = subprocess.run(
            gpu_command(tool), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError as exc:
        raise RuntimeError(f"{tool} is not installed on this host") from exc
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{tool} did not answer within {timeout_s:g} s") from exc
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} exited {proc.returncode}: {proc.stderr.strip()[:300]}")
    return proc.stdout


def parse_gpu_spec(spec: str) -> tuple[str, GpuTool]:
    """`NAME=nvidia-smi|amd-smi` from `--gpu`; UserError naming the flag otherwise."""
    name, sep, tool = spec.partition("=")
    if not sep or not name or tool not in GPU_TOOLS:
        raise UserError(f"--gpu {spec!r}: expected NAME=TOOL with TOOL one of {', '.join(GPU_TOOLS)}")
    return name, tool  # type: ignore[return-value]
