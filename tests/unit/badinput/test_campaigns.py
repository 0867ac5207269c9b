"""Malformed campaigns: `plan` and `run` exit 2 naming the file and the key (or the line), with no
traceback, nothing written under --results and no host touched. Each case breaks one thing of the
valid campaign of `labs.py`, written inline (all.vars.kvoffload_campaign) and as a --campaign file.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.datasets import generic_lines
from tests.unit.badinput.labs import Case, Lab, assert_plan_and_run_refuse, modes


def _set(**values: Any) -> Any:
    def breaks(lab: Lab) -> None:
        lab.campaign.update(values)

    return breaks


def _drop(key: str) -> Any:
    def breaks(lab: Lab) -> None:
        del lab.campaign[key]

    return breaks


def _text(text: str) -> Any:
    def breaks(lab: Lab) -> None:
        lab.campaign_bytes = text.encode()

    return breaks


def _dataset_lines(lines: list[str]) -> Any:
    def breaks(lab: Lab) -> None:
        lab.dataset_lines = lines

    return breaks


def _truncated_line_3(lab: Lab) -> None:
    lines = generic_lines()
    lines[2] = lines[2][: len(lines[2]) // 2]
    lab.dataset_lines = lines


def _not_utf8_line_4(lab: Lab) -> None:
    lines = [line.encode() for line in generic_lines()]
    lines[3] = lines[3].replace(b"question", b"qu\xe9stion")
    lab.dataset_bytes = b"\n".join(lines) + b"\n"


def _nested(lab: Lab) -> None:
    """A campaign file that holds the campaign under kvoffload_campaign, one key broken."""
    lab.campaign_bytes = json.dumps({"kvoffload_campaign": {**lab.campaign, "concurrency": [0]}}).encode()


CAMPAIGN = "{c}"  # the campaign's key prefix in the file that holds it (see labs.py)

CASES = [
    # The campaign file itself (a campaign inline is part of the inventory's YAML: see test_inventories).
    Case(
        "yaml-syntax-error", _text("name: x\ntiers: [gpu, cpu\n"), ("{camp}:3:1: invalid YAML",), inline=False
    ),
    Case("empty-file", _text(""), ("{camp}: (top level): a campaign must be a mapping",), inline=False),
    Case(
        "binary-garbage",
        lambda lab: setattr(lab, "campaign_bytes", b"\x89PNG\r\n\x1a\n\x00"),
        ("{camp}:1: not UTF-8 text (byte 0x89)",),
        inline=False,
    ),
    Case(
        "duplicated-key",
        _text("name: a\ntiers: [gpu]\ntiers: [cpu]\n"),
        ("{camp}:3:1: invalid YAML: duplicate key 'tiers' (first written on line 2)",),
        inline=False,
    ),
    Case(
        "nested-under-kvoffload-campaign",
        _nested,
        ("{camp}: kvoffload_campaign.concurrency[0]: must be a positive integer, got 0",),
        inline=False,
    ),
    Case(
        "campaign-file-missing",
        lambda lab: setattr(lab, "argv", ["{inv}", "--campaign", "{camp}.missing"]),
        ("{camp}.missing: cannot read: No such file or directory",),
        inline=False,
    ),
    Case(
        "campaign-is-a-list",
        _text("- name: x\n"),
        ("{camp}: (top level): a campaign must be a mapping",),
        inline=False,
    ),
    Case(
        "no-campaign-in-the-inventory",
        lambda lab: setattr(lab, "argv", ["{inv}"]),
        ("{inv}: all.vars.kvoffload_campaign: no campaign here: add one, or pass --campaign FILE",),
        inline=False,
    ),
    # Keys and types.
    Case(
        "unknown-key",
        _set(concurrencies=[2]),
        (CAMPAIGN + "concurrencies: unknown key; did you mean 'concurrency'? (allowed: cold_start,",),
    ),
    Case(
        "unknown-cold-start-method",
        _set(cold_start="skip"),
        (CAMPAIGN + "cold_start: Input should be 'reset' or 'restart', got 'skip'",),
    ),
    Case(
        "knee-search-without-a-limit",
        _set(knee_search={"max_concurrency": 64}),
        (
            CAMPAIGN + "knee_search.slo_p95_ttft_s: the knee search needs a limit: set slo (slo.ttft_p95_s, "
            "the campaign's latency target), or slo_p95_ttft_s / min_later_hit_rate here",
        ),
    ),
    Case(
        "knee-search-hit-rate-as-percent",
        _set(knee_search={"min_later_hit_rate": 50}),
        (CAMPAIGN + "knee_search.min_later_hit_rate: Input should be less than or equal to 1",),
    ),
    Case("missing-model", _drop("model"), (CAMPAIGN + "model: required key is missing",)),
    Case("missing-dataset", _drop("dataset"), (CAMPAIGN + "dataset: required key is missing",)),
    Case("name-with-space", _set(name="my campaign"), (CAMPAIGN + "name: String should match pattern",)),
    Case(
        "name-escapes-results", _set(name="../elsewhere"), (CAMPAIGN + "name: String should match pattern",)
    ),
    Case("name-too-long", _set(name="c" * 70), (CAMPAIGN + "name: String should match pattern",)),
    Case(
        "name-not-a-string", _set(name=2026), (CAMPAIGN + "name: Input should be a valid string, got 2026",)
    ),
    Case("model-empty", _set(model=""), (CAMPAIGN + "model: String should have at least 1 character",)),
    Case(
        "model-hub-id-with-space",
        _set(model="Qwen/Qwen3 8B"),
        (CAMPAIGN + "model: 'Qwen/Qwen3 8B' holds whitespace or a single quote",),
    ),
    Case(
        "model-folder-missing",
        _set(model="./models/none"),
        (CAMPAIGN + "model: './models/none' is a path but", "is not a model folder (no config.json)"),
    ),
    # Enums.
    Case(
        "gpu-vendor-unknown",
        _set(gpu_vendor="intel"),
        (CAMPAIGN + "gpu_vendor: Input should be 'nvidia' or 'amd', got 'intel'",),
    ),
    Case(
        "engine-unknown",
        _set(engine="tgi"),
        (CAMPAIGN + "engine: Input should be 'vllm' or 'sim', got 'tgi'",),
    ),
    Case(
        "sim-without-profile",
        _drop("sim_profile"),
        (CAMPAIGN + "sim_profile: engine: sim needs sim_profile",),
    ),
    Case(
        "profile-with-vllm",
        _set(engine="vllm"),
        (CAMPAIGN + "sim_profile: is only for engine: sim, but engine is vllm",),
    ),
    Case(
        "sim-profile-unknown",
        _set(sim_profile="h300-llama-8b"),
        (CAMPAIGN + "sim_profile: unknown simulator profile 'h300-llama-8b'; shipped profiles are",),
    ),
    Case(
        "sim-profile-not-a-string",
        _set(sim_profile=8),
        (CAMPAIGN + "sim_profile: Input should be a valid string, got 8",),
    ),
    Case(
        "amd-rocm-set-without-source",
        _set(gpu_vendor="amd", engine="vllm", sim_profile=None),
        (
            "engine set rocm-vllm0.32 (build rocm) comes from no public index: set engine_source.wheels_dir",
            "engine_source, or kvoffload_engine_source in the inventory",
        ),
    ),
    Case(
        "tier-unknown",
        _set(tiers=["gpu", "tpu"]),
        (CAMPAIGN + "tiers[1]: Input should be 'gpu', 'cpu' or 'nvme', got 'tpu'",),
    ),
    Case("tiers-empty", _set(tiers=[]), (CAMPAIGN + "tiers: List should have at least 1 item",)),
    Case("tier-twice", _set(tiers=["gpu", "cpu", "gpu"]), (CAMPAIGN + "tiers[2]: 'gpu' is listed twice",)),
    Case(
        "tiers-a-mapping",
        _set(tiers={"gpu": True}),
        (CAMPAIGN + "tiers[0]: Input should be 'gpu', 'cpu' or 'nvme'",),
    ),
    # The dataset key.
    Case(
        "dataset-a-string",
        _set(dataset="data"),
        (CAMPAIGN + "dataset: must be a mapping with keys code, path, got 'data'",),
    ),
    Case(
        "dataset-code-unknown",
        _set(dataset={"code": "sharegpt", "path": "data"}),
        (
            CAMPAIGN
            + "dataset.code: unknown dataset code 'sharegpt': choose one of sammshen, tau2-bench-v1, generic",
        ),
    ),
    Case(
        "dataset-path-missing",
        _set(dataset={"code": "generic"}),
        (CAMPAIGN + "dataset.path: required key is missing",),
    ),
    Case(
        "dataset-path-empty",
        _set(dataset={"code": "generic", "path": ""}),
        (CAMPAIGN + "dataset.path: String should have at least 1 character",),
    ),
    Case(
        "dataset-unknown-key",
        _set(dataset={"code": "generic", "path": "data", "format": "jsonl"}),
        (CAMPAIGN + "dataset.format: unknown key (allowed: code, path)",),
    ),
    # The dataset on disk does not fit the campaign.
    Case(
        "dataset-wrong-code-tau2",
        _set(dataset={"code": "tau2-bench-v1", "path": "data"}),
        (CAMPAIGN + "dataset (code tau2-bench-v1): {data}: folder: holds no data files (.json)",),
    ),
    Case(
        "dataset-wrong-code-sammshen",
        _set(dataset={"code": "sammshen", "path": "data"}),
        (CAMPAIGN + "dataset (code sammshen): {data}/calls.jsonl: line 1: missing 'input'",),
    ),
    Case(
        "dataset-truncated-line",
        _truncated_line_3,
        (CAMPAIGN + "dataset (code generic): {data}/calls.jsonl: line 3: invalid JSON",),
    ),
    Case(
        "dataset-not-utf8",
        _not_utf8_line_4,
        (CAMPAIGN + "dataset (code generic): {data}/calls.jsonl: line 4: not UTF-8 text (byte 0xe9",),
    ),
    Case(
        "dataset-empty",
        _dataset_lines([]),
        (CAMPAIGN + "dataset (code generic): {data}/calls.jsonl: file: is empty",),
    ),
    Case(
        "dataset-line-not-an-object",
        _dataset_lines(['["s0", []]']),
        (CAMPAIGN + "dataset (code generic): {data}/calls.jsonl: line 1: must be a JSON object",),
    ),
    Case(
        "num-rounds-beyond-every-session",
        _set(num_rounds=[5, 11]),
        (
            CAMPAIGN + "num_rounds[1]: 11 yields no virtual users from dataset {data} "
            "(its longest session has 10 calls)",
        ),
    ),
    # Matrix lists.
    Case(
        "concurrency-zero",
        _set(concurrency=[2, 0]),
        (CAMPAIGN + "concurrency[1]: must be a positive integer, got 0",),
    ),
    Case(
        "concurrency-negative",
        _set(concurrency=-4),
        (CAMPAIGN + "concurrency[0]: must be a positive integer, got -4",),
    ),
    Case(
        "concurrency-as-string",
        _set(concurrency=["8"]),
        (CAMPAIGN + "concurrency[0]: must be an integer, got '8'",),
    ),
    Case(
        "concurrency-float",
        _set(concurrency=[8.5]),
        (CAMPAIGN + "concurrency[0]: must be an integer, got 8.5",),
    ),
    Case(
        "concurrency-bool",
        _set(concurrency=[True]),
        (CAMPAIGN + "concurrency[0]: must be an integer, got True",),
    ),
    Case(
        "concurrency-empty",
        _set(concurrency=[]),
        (CAMPAIGN + "concurrency: List should have at least 1 item",),
    ),
    Case("concurrency-twice", _set(concurrency=[2, 2]), (CAMPAIGN + "concurrency[1]: 2 is listed twice",)),
    Case(
        "num-rounds-below-floor",
        _set(num_rounds=[3]),
        (CAMPAIGN + "num_rounds[0]: 3 is below the minimum chunk length 5 of dataset.code generic",),
    ),
    Case(
        "num-rounds-zero",
        _set(num_rounds=0),
        (CAMPAIGN + "num_rounds[0]: must be a positive integer, got 0",),
    ),
    Case("isl-zero", _set(isl=0), (CAMPAIGN + "isl[0]: must be a positive integer, got 0",)),
    Case("isl-with-unit", _set(isl="32k"), (CAMPAIGN + "isl[0]: must be an integer, got '32k'",)),
    Case("isl-twice", _set(isl=[4096, 4096]), (CAMPAIGN + "isl[1]: 4096 is listed twice",)),
    Case("osl-zero", _set(osl=0), (CAMPAIGN + "osl[0]: must be 'recorded' or a positive integer, got 0",)),
    Case(
        "osl-negative",
        _set(osl=[32, -5]),
        (CAMPAIGN + "osl[1]: must be 'recorded' or a positive integer, got -5",),
    ),
    Case(
        "osl-unknown-word",
        _set(osl="max"),
        (CAMPAIGN + "osl[0]: must be 'recorded' or a positive integer, got 'max'",),
    ),
    Case(
        "osl-float", _set(osl=1.5), (CAMPAIGN + "osl[0]: must be 'recorded' or a positive integer, got 1.5",)
    ),
    Case(
        "osl-bool", _set(osl=True), (CAMPAIGN + "osl[0]: must be 'recorded' or a positive integer, got True",)
    ),
    # Scalars.
    Case(
        "max-sessions-zero",
        _set(max_sessions=0),
        (CAMPAIGN + "max_sessions: must be a positive integer, got 0",),
    ),
    Case("repeats-zero", _set(repeats=0), (CAMPAIGN + "repeats: must be a positive integer, got 0",)),
    Case("repeats-as-string", _set(repeats="1"), (CAMPAIGN + "repeats: must be an integer, got '1'",)),
    Case(
        "duration-negative",
        _set(duration_s=-10),
        (CAMPAIGN + "duration_s: must be a positive integer, got -10",),
    ),
    Case(
        "honor-gaps-as-string",
        _set(honor_gaps="yes"),
        (CAMPAIGN + "honor_gaps: Input should be a valid boolean, got 'yes'",),
    ),
    Case(
        "sample-interval-zero",
        _set(sample_interval_s=0),
        (CAMPAIGN + "sample_interval_s: must be a positive integer, got 0",),
    ),
    # KV sizes.
    Case(
        "kv-bytes-negative",
        _set(kv_cache_memory_bytes=-1),
        (CAMPAIGN + "kv_cache_memory_bytes: must be a positive integer, got -1",),
    ),
    Case(
        "kv-bytes-with-unit",
        _set(kv_cache_memory_bytes="64MiB"),
        (CAMPAIGN + "kv_cache_memory_bytes: must be an integer, got '64MiB'",),
    ),
    Case(
        "kv-bytes-and-blocks",
        _set(kv_cache_memory_bytes=1 << 26, num_gpu_blocks_override=100),
        (
            CAMPAIGN
            + "num_gpu_blocks_override: set kv_cache_memory_bytes or num_gpu_blocks_override, not both",
        ),
    ),
    Case(
        "gpu-blocks-zero",
        _set(num_gpu_blocks_override=0),
        (CAMPAIGN + "num_gpu_blocks_override: must be a positive integer, got 0",),
    ),
    Case(
        "l1-size-scalar",
        _set(lmcache_l1_size_gb=200),
        (CAMPAIGN + "lmcache_l1_size_gb: must be a mapping with keys cpu, nvme, got 200",),
    ),
    Case(
        "l1-size-zero",
        _set(lmcache_l1_size_gb={"cpu": 0}),
        (CAMPAIGN + "lmcache_l1_size_gb.cpu: must be a positive number of GB, got 0",),
    ),
    Case(
        "l1-size-negative",
        _set(lmcache_l1_size_gb={"nvme": -0.5}),
        (CAMPAIGN + "lmcache_l1_size_gb.nvme: must be a positive number of GB, got -0.5",),
    ),
    Case(
        "l1-size-gpu-tier",
        _set(lmcache_l1_size_gb={"gpu": 1}),
        (CAMPAIGN + "lmcache_l1_size_gb.gpu: unknown key (allowed: cpu, nvme)",),
    ),
    Case(
        "l1-size-with-unit",
        _set(lmcache_l1_size_gb={"cpu": "200G"}),
        (CAMPAIGN + "lmcache_l1_size_gb.cpu: must be a finite number, got '200G'",),
    ),
    # Engine flags.
    Case(
        "extra-args-a-string",
        _set(extra_engine_args="--max-model-len 16384"),
        (CAMPAIGN + "extra_engine_args: Input should be a valid list",),
    ),
    Case(
        "extra-args-with-space",
        _set(extra_engine_args=["--max-model-len 16384"]),
        (CAMPAIGN + "extra_engine_args[0]: '--max-model-len 16384' is empty or holds whitespace",),
    ),
    Case(
        "extra-args-with-quote",
        _set(extra_engine_args=["--chat-template", "it's"]),
        (CAMPAIGN + "extra_engine_args[1]:",),
    ),
    Case(
        "extra-args-an-int",
        _set(extra_engine_args=["--max-model-len", 16384]),
        (CAMPAIGN + "extra_engine_args[1]: Input should be a valid string, got 16384",),
    ),
]


@pytest.mark.parametrize(("case", "inline"), modes(CASES))
def test_malformed_campaign_is_refused(
    case: Case,
    inline: bool,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lab = Lab(tmp_path, inline=inline)
    case.breaks(lab)
    assert_plan_and_run_refuse(lab, case.needles, capsys, monkeypatch)


def test_a_campaign_in_group_vars_is_blamed_there(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lab = Lab(tmp_path, inline=False)
    lab.argv = ["{inv}"]
    lab.extra["group_vars/all.yml"] = json.dumps(
        {"kvoffload_campaign": {**lab.campaign, "repeats": 0}}
    ).encode()
    needle = "{root}/group_vars/all.yml: kvoffload_campaign.repeats: must be a positive integer, got 0"
    assert_plan_and_run_refuse(lab, (needle,), capsys, monkeypatch)


def test_a_dataset_away_from_this_machine_is_refused_by_plan_and_run(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run` ships the dataset from this machine, so `plan` refuses a path that is not here as `run` does
    (it used to plan it, estimating "replays 0.0 min"), naming the key and the path it read (issue 43,
    defect 12); `run` creates nothing and touches no host."""
    lab = Lab(tmp_path, inline=False)
    lab.campaign["dataset"] = {"code": "generic", "path": "elsewhere"}
    needle = (
        f"{lab.camp}: dataset.path: {tmp_path}/elsewhere ('elsewhere', from the folder of the file that sets "
        "it) does not exist on this machine: `run` ships the dataset from here to the client hosts; put the "
        "dataset file or folder there, or give its path"
    )
    assert_plan_and_run_refuse(lab, (needle,), capsys, monkeypatch)


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 50
    assert len({c.id for c in CASES}) == len(CASES)
