"""Checks of measured figures against the device's datasheet ceilings (a timing bug shows as a figure
above what the hardware can do).

Pure functions over a `RawCalibration`; no torch, no IO. Datasheet figures are leads (METHOD.md), so
the checks are one-sided: above the ceiling is an error, far below it is only reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.calibrate.raw import Ceilings, DecodeResult, PrefillResult, SanityCheck, TransferResult

TOLERANCE = 1.02  # FLOP and byte counts are approximate (norms, rotary, softmax are not counted)


@dataclass(frozen=True)
class Datasheet:
    """Peak figures of one accelerator from its vendor's datasheet."""

    match: str
    bf16_dense_tflops: float
    hbm_tbps: float
    host_link_gbps: float
    source: str


DATASHEETS = (
    Datasheet(
        "H200",
        989.0,
        4.8,
        64.0,
        "NVIDIA H200 datasheet: 989 TFLOPS dense BF16, HBM3e 4.8 TB/s; PCIe Gen5 x16 64 GB/s per direction",
    ),
    Datasheet(
        "H100 PCIe",
        756.0,
        2.0,
        64.0,
        "NVIDIA H100 datasheet (PCIe): 756 TFLOPS dense BF16, 2.0 TB/s; PCIe Gen5 x16 64 GB/s per direction",
    ),
    Datasheet(
        "H100",
        989.0,
        3.35,
        64.0,
        "NVIDIA H100 datasheet (SXM): 989 TFLOPS dense BF16, 3.35 TB/s; PCIe Gen5 x16 64 GB/s per direction",
    ),
    Datasheet(
        "A100",
        312.0,
        2.039,
        32.0,
        "NVIDIA A100 datasheet: 312 TFLOPS dense BF16, up to 2.039 TB/s; PCIe Gen4 x16 32 GB/s per direction",
    ),
)


def datasheet_for(device_name: str) -> Datasheet | None:
    """The first datasheet whose match string occurs in the device name, if any."""
    for sheet in DATASHEETS:
        if sheet.match.lower() in device_name.lower():
            return sheet
    return None


def _check(name: str, measured: float, ceiling: float, unit: str, source: str) -> SanityCheck:
    ratio = measured / ceiling
    return SanityCheck(
        name=name,
        measured=measured,
        ceiling=ceiling,
        unit=unit,
        ratio=ratio,
        ok=ratio <= TOLERANCE,
        ceiling_source=source,
    )


def check_figures(
    device_name: str,
    ceilings: Ceilings | None,
    prefill: PrefillResult,
    decode: DecodeResult,
    transfer: TransferResult,
) -> list[SanityCheck]:
    """One check per figure family; empty when no datasheet is known for the device."""
    sheet = datasheet_for(device_name)
    if sheet is None:
        return []
    checks: list[SanityCheck] = []
    if ceilings is not None:
        checks.append(
            _check("ceiling.matmul", ceilings.matmul_tflops, sheet.bf16_dense_tflops, "TFLOP/s", sheet.source)
        )
        checks.append(_check("ceiling.copy", ceilings.copy_tbps, sheet.hbm_tbps, "TB/s", sheet.source))
    if prefill.points:
        best = max(p.layer_tflops for p in prefill.points)
        checks.append(_check("prefill.layer_tflops", best, sheet.bf16_dense_tflops, "TFLOP/s", sheet.source))
    if decode.points:
        best = max(p.achieved_tbps for p in decode.points)
        checks.append(_check("decode.achieved_tbps", best, sheet.hbm_tbps, "TB/s", sheet.source))
    checks.append(
        _check(
            "transfer.host_to_device",
            transfer.host_to_device_gbps,
            sheet.host_link_gbps,
            "GB/s",
            sheet.source,
        )
    )
    checks.append(
        _check(
            "transfer.device_to_host",
            transfer.device_to_host_gbps,
            sheet.host_link_gbps,
            "GB/s",
            sheet.source,
        )
    )
    return checks


def failures(checks: list[SanityCheck]) -> list[str]:
    """One line per failed check, naming the figure, the value and the ceiling."""
    return [
        f"{c.name} = {c.measured:.3g} {c.unit} exceeds the datasheet ceiling {c.ceiling:.3g} {c.unit}"
        for c in checks
        if not c.ok
    ]
