"""One calibration run: the GPU measurements, the disk measurement and the sanity checks, assembled
into a `RawCalibration`.

Called by `kvoffload/cli/calibrate.py`; writes nothing itself (the CLI writes the raw JSON and the
profile). torch is imported by `kvoffload.calibrate.gpu` inside its functions only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from kvoffload.calibrate.disk import measure_disk
from kvoffload.calibrate.gpu import CHUNK_TOKENS, measure_gpu
from kvoffload.calibrate.raw import RawCalibration, ShapeInfo
from kvoffload.calibrate.sanity import check_figures, failures
from kvoffload.calibrate.shapes import ModelSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CalibrationOptions:
    """What the command line asked for."""

    device: str
    quick: bool
    disk_dir: Path
    disk_bytes: int
    disk_repeats: int


def shape_info(spec: ModelSpec, dtype: str = "bf16") -> ShapeInfo:
    """The raw file's record of `spec`: its dimensions as they are, with the sizes at `dtype`."""
    return ShapeInfo(
        **asdict(spec),
        dtype=dtype,
        kv_bytes_per_token=spec.kv_bytes_per_token(dtype),
        weights_bytes=spec.weights_bytes(dtype),
    )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def run_calibration(spec: ModelSpec, options: CalibrationOptions, argv: Sequence[str]) -> RawCalibration:
    """Measure everything for `spec` and return the raw result (sanity failures are recorded, not raised)."""
    started = _now()
    gpu = measure_gpu(spec, options.device, options.quick, started, argv)
    disk = measure_disk(
        options.disk_dir,
        total_bytes=options.disk_bytes,
        block_bytes=CHUNK_TOKENS * spec.kv_bytes_per_token(),
        repeats=options.disk_repeats,
    )
    checks = check_figures(gpu.environment.device_name, gpu.ceilings, gpu.prefill, gpu.decode, gpu.transfer)
    for line in failures(checks):
        log.error("sanity: %s", line)
    notes: list[str] = []
    if not checks:
        notes.append(f"no datasheet known for {gpu.environment.device_name}: figures were not sanity-checked")
    if (
        spec.weights_bytes() > 0.9 * gpu.environment.device_memory_bytes
        and gpu.environment.device_memory_bytes
    ):
        notes.append(
            f"{spec.name} weights ({spec.weights_bytes() / 2**30:.0f} GiB) do not fit this device: every "
            "figure is one layer's time scaled by num_layers, on a device with enough memory"
        )
    return RawCalibration(
        shape=shape_info(spec),
        environment=gpu.environment.model_copy(update={"finished_at": _now()}),
        quick=options.quick,
        ceilings=gpu.ceilings,
        prefill=gpu.prefill,
        decode=gpu.decode,
        transfer=gpu.transfer,
        disk=disk,
        sanity=checks,
        notes=notes,
    )
