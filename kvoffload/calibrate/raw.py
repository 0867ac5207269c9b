"""The raw output of one calibration run: every timing with its context, as written to JSON.

Plain pydantic models, no measurement and no torch. `kvoffload/calibrate/gpu.py` and `disk.py` fill
them; `kvoffload/calibrate/profile.py` turns a loaded one into a simulator cost profile. The JSON is kept
next to the profile (and as test fixtures) so a profile can be rebuilt or audited without a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvoffload.atomic import write_text_atomic
from kvoffload.errors import UserError

RAW_FORMAT_VERSION = 1


class _Raw(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ShapeInfo(_Raw):
    """The model shape the run built random weights for."""

    name: str = Field(description="Shape name as given to --model-shape.")
    source: str = Field(description="Public config the dimensions come from.")
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    qk_norm: bool
    dtype: str = Field(description="Weight, activation and KV element type.")
    kv_bytes_per_token: int
    weights_bytes: int


class Environment(_Raw):
    """Where and when the run happened: the provenance of every figure."""

    device_type: str = Field(description="'cuda' or 'cpu'.")
    device_name: str
    device_memory_bytes: int = Field(description="Total device memory as the framework reports it.")
    multiprocessors: int | None = None
    driver: str | None = Field(default=None, description="GPU driver version (nvidia-smi).")
    cuda: str | None = Field(default=None, description="CUDA runtime torch was built with.")
    torch: str
    python: str
    hostname: str
    started_at: str = Field(description="ISO 8601 UTC time the run started.")
    finished_at: str = Field(default="", description="ISO 8601 UTC time the run finished.")
    argv: list[str] = Field(default_factory=list, description="Command line of the run.")


class Ceilings(_Raw):
    """Ceilings measured on the device itself (METHOD.md: measure the two ceilings once)."""

    matmul_tflops: float = Field(description="bf16 matrix product on random data, TFLOP/s.")
    copy_tbps: float = Field(description="Device-to-device copy, bytes read plus written, TB/s.")
    method: str


class PrefillPoint(_Raw):
    context_tokens: int
    layer_s: float = Field(description="Median time of one decoder layer over the whole prompt.")
    head_s: float = Field(description="Final norm and lm_head for the last token.")
    total_s: float = Field(description="num_layers * layer_s + head_s.")
    tokens_per_s: float
    layer_tflops: float = Field(description="Counted FLOPs of one layer over layer_s, TFLOP/s.")
    runs: int


class FullModelCheck(_Raw):
    """A whole stack of layers timed once, to check that per-layer scaling holds."""

    context_tokens: int
    full_s: float
    scaled_s: float
    ratio: float = Field(description="full_s / scaled_s.")


class PrefillResult(_Raw):
    method: str
    attention_backend: str
    points: list[PrefillPoint]
    skipped: list[str] = Field(default_factory=list)
    full_model_checks: list[FullModelCheck] = Field(default_factory=list)


class DecodePoint(_Raw):
    batch: int
    context_tokens: int = Field(description="Context per sequence.")
    layer_s: float
    head_s: float
    step_s: float = Field(description="num_layers * layer_s + head_s.")
    achieved_tbps: float = Field(description="Fewest bytes a step must read over step_s, TB/s.")
    attention_impl: str
    graphed: bool = Field(description="Timed as CUDA graph replays (as vLLM runs decode).")
    fits_one_device: bool = Field(description="Weights plus this batch's KV fit the device's memory.")


class DecodeResult(_Raw):
    method: str
    points: list[DecodePoint]
    skipped: list[str] = Field(default_factory=list)


class TransferPoint(_Raw):
    direction: str = Field(description="'h2d' or 'd2h'.")
    nbytes: int
    seconds: float
    gbps: float = Field(description="10^9 bytes per second.")


class TransferResult(_Raw):
    method: str
    chunk_tokens: int
    chunk_bytes: int
    points: list[TransferPoint]
    host_to_device_gbps: float
    device_to_host_gbps: float
    per_chunk_overhead_s: float


class DiskResult(_Raw):
    method: str
    path: str
    filesystem: str
    o_direct: bool
    block_bytes: int
    total_bytes: int
    write_runs_s: list[float]
    read_runs_s: list[float]
    write_gbps: float
    read_gbps: float
    notes: list[str] = Field(default_factory=list)


class SanityCheck(_Raw):
    name: str
    measured: float
    ceiling: float
    unit: str
    ratio: float
    ok: bool
    ceiling_source: str


class RawCalibration(_Raw):
    """Everything one `kvoffload-lab calibrate` run measured."""

    format_version: int = RAW_FORMAT_VERSION
    shape: ShapeInfo
    environment: Environment
    quick: bool
    ceilings: Ceilings | None = None
    prefill: PrefillResult
    decode: DecodeResult
    transfer: TransferResult
    disk: DiskResult
    sanity: list[SanityCheck] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def write_raw(raw: RawCalibration, path: Path) -> None:
    """Write `raw` as indented JSON (created or replaced)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(raw.model_dump(mode="json"), indent=2) + "\n")


def load_raw(path: Path) -> RawCalibration:
    """Load a raw calibration file; errors name the file and the offending key."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(
            f"--from-raw {path}: cannot read: {exc.strerror}; give a calibrate raw JSON file"
        ) from exc
    except UnicodeDecodeError as exc:
        raise UserError(
            f"--from-raw {path}: not UTF-8 text (byte {exc.start}); give a calibrate raw JSON file"
        ) from exc
    try:
        return RawCalibration.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<top>'}: {err['msg']}" for err in exc.errors()
        )
        raise UserError(
            f"{path}: not a calibrate raw file ({problems}); rerun `kvoffload-lab calibrate --raw-output`"
        ) from exc
