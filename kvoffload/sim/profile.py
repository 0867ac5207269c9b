"""Cost profiles of the simulator: the hardware x model figures that turn work into wall-clock time.

A profile is a YAML file. Shipped ones live in `kvoffload/profiles/sim/<name>.yaml`; `kvoffload-lab
calibrate` writes measured ones in the same format. Every figure group carries its provenance (a cited
public figure, a derivation from one, or a measurement), so a report can say where a number came from.

How the engine uses the figures (docs/simulator.md has the worked formulas):
- prefill: `points` are `[context_tokens, tokens_per_s]`: the throughput of prefilling a whole prompt of
  `context_tokens` from scratch. Between points the throughput is interpolated piecewise-linearly (held
  flat beyond the ends). Cumulative prefill time is `T(x) = x / tokens_per_s(x)`; computing positions
  `s..e` of a prompt (the part after a prefix-cache hit) costs `T(e) - T(s)`, so attention's growth
  with context is charged even when the cached prefix is skipped.
- decode: one engine step that produces one token for each of `batch` sequences whose contexts sum to
  `K` tokens costs `base_s + per_seq_s * batch + per_context_token_s * K` (weights read once per step,
  KV read per context token). Give either that `linear` form or measured `points`
  `[batch, context_tokens, step_s]` (context per sequence); points are fitted to the linear form by
  least squares when loaded.
- transfer (cpu tier): moving one KV chunk of `n` bytes costs `per_chunk_overhead_s + n / bandwidth`.
- disk (nvme tier): the same with the drive's read/write bandwidth.
- startup (optional): what a (re)start of `vllm serve` costs before it listens, in two parts as vLLM
  logs them: loading the weights, then compiling and capturing CUDA graphs (skipped under
  `--enforce-eager`). A profile without the group starts at once; one with a non-zero figure must say
  where it comes from in `provenance.startup`.
Bandwidths are in gigabytes (10^9 bytes) per second, whatever the `gbps` suffix suggests elsewhere.

This module only validates and loads; it does no timing and knows nothing about HTTP.
"""

from __future__ import annotations

import bisect
import itertools
import json
from pathlib import Path
from typing import Annotated, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvoffload.errors import UserError

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles" / "sim"
DEFAULT_PROFILE = "tiny"

_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}

Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Hardware(_Strict):
    """The accelerator one engine replica runs on (one GPU; tensor parallelism is not modelled)."""

    gpu: str = Field(description="Marketing name of the accelerator, e.g. 'NVIDIA H100 SXM5 80GB'.")
    vendor: Literal["nvidia", "amd", "none"] = Field(description="GPU vendor; 'none' for synthetic.")
    gpu_memory_gib: Positive = Field(description="Device memory in GiB (2^30 bytes) that vLLM sees.")


class ModelShape(_Strict):
    """The served model's shape: what sets KV bytes per token and the memory left for the KV cache."""

    shape: str = Field(description="Model family/name the figures are for, e.g. 'llama-3.1-8b'.")
    num_layers: int = Field(gt=0, description="Transformer layers holding a KV cache.")
    num_kv_heads: int = Field(gt=0, description="KV heads per layer (GQA groups).")
    head_dim: int = Field(gt=0, description="Dimension of one attention head.")
    dtype: Literal["bf16", "fp16", "fp8", "fp32"] = Field(description="KV cache element type.")
    kv_bytes_per_token: int = Field(
        gt=0, description="Bytes of K+V per token over all layers: 2 * layers * kv_heads * head_dim * dtype."
    )
    weights_gib: NonNegative = Field(description="Weights resident on the device, GiB.")
    max_model_len: int = Field(
        default=131072, gt=0, description="Longest context the model supports (max_position_embeddings)."
    )
    runtime_overhead_gib: NonNegative = Field(
        default=0.0,
        description="Other device memory vLLM keeps out of the KV cache (activations, graphs), GiB.",
    )

    @model_validator(mode="after")
    def _kv_bytes_consistent(self) -> Self:
        expected = 2 * self.num_layers * self.num_kv_heads * self.head_dim * _DTYPE_BYTES[self.dtype]
        if self.kv_bytes_per_token != expected:
            raise ValueError(
                f"model.kv_bytes_per_token is {self.kv_bytes_per_token} but model.num_layers, "
                f"num_kv_heads, head_dim and dtype give 2*{self.num_layers}*{self.num_kv_heads}*"
                f"{self.head_dim}*{_DTYPE_BYTES[self.dtype]} = {expected}; make them agree"
            )
        return self


class Prefill(_Strict):
    """Prefill throughput as a function of prompt length (see module docstring)."""

    points: list[tuple[int, float]] = Field(
        min_length=1,
        description="[context_tokens, tokens_per_s] pairs, context strictly increasing, throughput > 0.",
    )

    @model_validator(mode="after")
    def _points_valid(self) -> Self:
        ctx = [c for c, _ in self.points]
        if any(c <= 0 for c in ctx) or any(b <= a for a, b in itertools.pairwise(ctx)):
            raise ValueError("prefill.points: context_tokens must be > 0 and strictly increasing")
        if any(tps <= 0 for _, tps in self.points):
            raise ValueError("prefill.points: tokens_per_s must be > 0")
        times = [c / tps for c, tps in self.points]
        if any(b < a for a, b in itertools.pairwise(times)):
            raise ValueError(
                "prefill.points: cumulative time context/tokens_per_s must not fall as context grows "
                "(a longer prompt cannot prefill faster than a shorter one)"
            )
        return self

    def tokens_per_s(self, context: float) -> float:
        """Throughput at `context`, piecewise-linear between points, flat beyond the ends."""
        ctx = [c for c, _ in self.points]
        if context <= ctx[0]:
            return self.points[0][1]
        if context >= ctx[-1]:
            return self.points[-1][1]
        i = bisect.bisect_right(ctx, context)
        (c0, t0), (c1, t1) = self.points[i - 1], self.points[i]
        return t0 + (t1 - t0) * (context - c0) / (c1 - c0)

    def cumulative_s(self, context: float) -> float:
        """T(x): seconds to prefill the first `context` tokens of a prompt from scratch."""
        if context <= 0:
            return 0.0
        return context / self.tokens_per_s(context)

    def seconds(self, start: float, end: float) -> float:
        """Seconds to compute prompt positions start..end when positions before start are cached."""
        return max(0.0, self.cumulative_s(end) - self.cumulative_s(start))


class DecodeLinear(_Strict):
    """step_s = base_s + per_seq_s * batch + per_context_token_s * sum of contexts in the batch."""

    base_s: NonNegative = Field(description="Fixed cost of one step (weights read, launch), seconds.")
    per_seq_s: NonNegative = Field(description="Extra cost per sequence in the batch, seconds.")
    per_context_token_s: NonNegative = Field(description="Extra cost per context token read, seconds.")


class Decode(_Strict):
    """Decode step time: a linear form, or measured points fitted to it (exactly one of the two)."""

    linear: DecodeLinear | None = Field(default=None, description="The parametric form, given directly.")
    points: list[tuple[int, int, float]] | None = Field(
        default=None,
        description="Measured [batch, context_tokens_per_sequence, step_s] triples (at least 3).",
    )

    @model_validator(mode="after")
    def _one_form(self) -> Self:
        if (self.linear is None) == (self.points is None):
            raise ValueError("decode: give exactly one of decode.linear or decode.points")
        if self.points is not None:
            if len(self.points) < 3:
                raise ValueError("decode.points: need at least 3 [batch, context_tokens, step_s] triples")
            if any(b <= 0 or c < 0 or s <= 0 for b, c, s in self.points):
                raise ValueError("decode.points: batch > 0, context_tokens >= 0, step_s > 0")
            _fit_linear(self.points)  # raises when the points cannot determine the form
        return self

    def form(self) -> DecodeLinear:
        """The linear form, fitted from points when those were given."""
        if self.linear is not None:
            return self.linear
        assert self.points is not None
        return _fit_linear(self.points)


def _fit_linear(points: list[tuple[int, int, float]]) -> DecodeLinear:
    """Least squares of step_s on [1, batch, batch*context]; negative coefficients clipped to 0."""
    rows = [(1.0, float(b), float(b) * float(c)) for b, c, _ in points]
    ys = [s for _, _, s in points]
    # Normal equations A^T A x = A^T y, 3x3, solved by Gaussian elimination (no numpy on lab hosts).
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    aty = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(3)]
    m = [[*ata[i], aty[i]] for i in range(3)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-18 * max(1.0, max(abs(v) for v in m[pivot])):
            raise ValueError(
                "decode.points: the triples do not vary both batch and context enough to fit "
                "base_s, per_seq_s and per_context_token_s; measure more batch sizes and contexts"
            )
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(3):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[col], strict=True)]
    base, per_seq, per_tok = (max(0.0, m[i][3] / m[i][i]) for i in range(3))
    return DecodeLinear(base_s=base, per_seq_s=per_seq, per_context_token_s=per_tok)


class Transfer(_Strict):
    """Host RAM <-> device copies of KV chunks (cpu tier, and the staging step of the nvme tier)."""

    host_to_device_gbps: Positive = Field(description="Load bandwidth, GB/s (10^9 bytes/s).")
    device_to_host_gbps: Positive = Field(description="Store bandwidth, GB/s (10^9 bytes/s).")
    per_chunk_overhead_s: NonNegative = Field(
        default=0.0, description="Fixed cost per 256-token chunk moved (RPC, launch), seconds."
    )

    def load_s(self, nbytes: float) -> float:
        return self.per_chunk_overhead_s + nbytes / (self.host_to_device_gbps * 1e9)

    def store_s(self, nbytes: float) -> float:
        return self.per_chunk_overhead_s + nbytes / (self.device_to_host_gbps * 1e9)


class Disk(_Strict):
    """The NVMe drive behind the L2 `fs` adapter (nvme tier)."""

    read_gbps: Positive = Field(description="Sequential read bandwidth, GB/s (10^9 bytes/s).")
    write_gbps: Positive = Field(description="Sequential write bandwidth, GB/s (10^9 bytes/s).")

    def read_s(self, nbytes: float) -> float:
        return nbytes / (self.read_gbps * 1e9)

    def write_s(self, nbytes: float) -> float:
        return nbytes / (self.write_gbps * 1e9)


class Startup(_Strict):
    """Engine start-up before the API server listens (vLLM's weight load, then compile + graph capture)."""

    model_load_s: NonNegative = Field(
        default=0.0, description="Seconds to load the weights onto the device (vLLM: 'Loading weights took')."
    )
    graph_capture_s: NonNegative = Field(
        default=0.0,
        description="Seconds of torch.compile, warm-up and CUDA graph capture after the load (vLLM: "
        "'Graph capturing finished in'); skipped with --enforce-eager.",
    )

    @property
    def total_s(self) -> float:
        return self.model_load_s + self.graph_capture_s


class Provenance(_Strict):
    """Where one figure group comes from."""

    source: str = Field(
        min_length=1,
        description="'measured', 'synthetic', or a citation: URL or paper of the public figure used.",
    )
    method: str = Field(min_length=1, description="How the numbers were obtained or derived.")
    device: str | None = Field(default=None, description="Device measured on (required when measured).")
    driver: str | None = Field(default=None, description="Driver version (measured profiles).")
    torch: str | None = Field(default=None, description="torch / vLLM versions (measured profiles).")
    date: str | None = Field(default=None, description="ISO date of the measurement or citation.")

    @model_validator(mode="after")
    def _measured_has_context(self) -> Self:
        if self.source == "measured" and (not self.device or not self.date):
            raise ValueError("provenance: source 'measured' needs device and date")
        return self


class ProvenanceMap(_Strict):
    """One provenance entry per figure group."""

    hardware: Provenance
    model: Provenance
    prefill: Provenance
    decode: Provenance
    transfer: Provenance
    disk: Provenance
    startup: Provenance | None = Field(default=None, description="Required when startup is not zero.")


class CostProfile(_Strict):
    """A whole cost profile (see module docstring for the meaning of each group)."""

    name: str = Field(min_length=1, description="Profile name; equals the file stem for shipped ones.")
    description: str = Field(min_length=1, description="One paragraph: what this profile stands for.")
    hardware: Hardware
    model: ModelShape
    prefill: Prefill
    decode: Decode
    transfer: Transfer
    disk: Disk
    startup: Startup = Field(default=Startup(), description="Engine start-up; none when left out.")
    provenance: ProvenanceMap

    @model_validator(mode="after")
    def _startup_sourced(self) -> Self:
        if self.startup.total_s > 0 and self.provenance.startup is None:
            raise ValueError(
                "startup gives a start-up time but provenance.startup is missing: say where "
                "startup.model_load_s and startup.graph_capture_s come from"
            )
        return self

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """One decode step for `batch` sequences whose contexts sum to `context_tokens`."""
        if batch <= 0:
            return 0.0
        f = self.decode.form()
        return f.base_s + f.per_seq_s * batch + f.per_context_token_s * context_tokens


def shipped_profiles() -> list[str]:
    """Names of the profiles shipped with the package."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def _resolve(name_or_path: str) -> Path:
    as_path = Path(name_or_path)
    if as_path.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if not as_path.is_file():
            raise UserError(f"--sim-profile {name_or_path}: no such file; give a profile YAML path or name")
        return as_path
    candidate = PROFILE_DIR / f"{name_or_path}.yaml"
    if not candidate.is_file():
        raise UserError(
            f"--sim-profile {name_or_path}: unknown profile; shipped profiles are "
            f"{', '.join(shipped_profiles())} (or give a path to a YAML file)"
        )
    return candidate


def parse_profile(data: object, origin: str) -> CostProfile:
    """Validate already-loaded YAML data; `origin` names the file in error messages."""
    try:
        # Validated in JSON mode: strict types, but YAML lists may fill tuples and ints may fill floats.
        return CostProfile.model_validate_json(json.dumps(data, default=str))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<top>'}: {err['msg']}" for err in exc.errors()
        )
        raise UserError(f"{origin}: invalid cost profile: {problems}") from exc


def load_profile(name_or_path: str = DEFAULT_PROFILE) -> CostProfile:
    """Load a profile by shipped name (file stem in kvoffload/profiles/sim/) or by path to a YAML file."""
    path = _resolve(name_or_path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {exc}") from exc
    return parse_profile(data, str(path))
