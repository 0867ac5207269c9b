"""Campaign validation: every bad key is reported with the file and its key path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvoffload.config import ConfigError, load_lab

Writer = Callable[[str, Any], Path]


def _errors(write_yaml: Writer, inventory: dict[str, Any], campaign: dict[str, Any]) -> list[str]:
    inv = write_yaml("hosts.yml", inventory)
    camp = write_yaml("campaign.yml", campaign)
    with pytest.raises(ConfigError) as info:
        load_lab(inv, camp)
    return info.value.problems


def test_valid_campaign_normalises_scalars_to_lists(
    write_yaml: Writer, inventory: Any, campaign: Any, tmp_path: Path
) -> None:
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    assert lab.campaign.isl == [16384]
    assert lab.campaign.osl == [32]
    assert lab.campaign.max_sessions is None
    assert lab.campaign.repeats == 1
    # Relative dataset paths are relative to the file that declares them.
    assert lab.dataset_path == tmp_path / "data" / "tau2"


def test_positive_integer_error_names_file_and_index(
    write_yaml: Writer, inventory: Any, campaign: Any
) -> None:
    campaign["concurrency"] = [2, 0]
    problems = _errors(write_yaml, inventory, campaign)
    assert len(problems) == 1
    assert problems[0].endswith("campaign.yml: concurrency[1]: must be a positive integer, got 0")


def test_error_inside_inventory_names_the_all_vars_key(
    write_yaml: Writer, inventory: Any, campaign: Any
) -> None:
    campaign["concurrency"] = [2, 0]
    inventory["all"]["vars"]["kvoffload_campaign"] = campaign
    path = write_yaml("hosts.yml", inventory)
    with pytest.raises(ConfigError) as info:
        load_lab(path)
    assert str(info.value) == (
        f"{path}: all.vars.kvoffload_campaign.concurrency[1]: must be a positive integer, got 0"
    )


def test_unknown_key_lists_the_allowed_keys(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    campaign["concurrencies"] = [4]
    campaign["dataset"]["format"] = "x"
    problems = _errors(write_yaml, inventory, campaign)
    by_key = {p.split(": ")[1]: p.split(": ", 2)[2] for p in problems}
    assert sorted(by_key) == ["concurrencies", "dataset.format"]
    assert by_key["concurrencies"].startswith(
        "unknown key; did you mean 'concurrency'? (allowed: cold_start, concurrency, dataset, "
    )
    assert by_key["dataset.format"] == "unknown key (allowed: code, path)"  # nothing close: no guess


def test_float_fields_ask_for_a_number_not_an_integer(
    write_yaml: Writer, inventory: Any, campaign: Any
) -> None:
    campaign["knee_search"] = {"slo_p95_ttft_s": 0, "factor": 1, "min_later_hit_rate": "high"}
    campaign["repeats"] = 0
    problems = _errors(write_yaml, inventory, campaign)
    by_key = {p.split(": ")[1]: p.split(": ", 2)[2] for p in problems}
    assert by_key["knee_search.slo_p95_ttft_s"] == "must be a positive number, got 0"
    assert by_key["knee_search.factor"] == "must be a number greater than 1, got 1"
    assert by_key["knee_search.min_later_hit_rate"] == "must be a finite number, got 'high'"
    assert by_key["repeats"] == "must be a positive integer, got 0"  # an int field keeps its wording


def test_strings_are_not_numbers(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    campaign["num_rounds"] = ["5"]
    problems = _errors(write_yaml, inventory, campaign)
    assert problems == [f"{problems[0].split(': ')[0]}: num_rounds[0]: must be an integer, got '5'"]


def test_num_rounds_below_the_loader_floor(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    campaign["num_rounds"] = [5, 3]
    problems = _errors(write_yaml, inventory, campaign)
    assert len(problems) == 1
    assert "num_rounds[1]: 3 is below the minimum chunk length 5 of dataset.code tau2-bench-v1" in problems[0]


def test_sammshen_has_no_floor(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    campaign["num_rounds"] = [2]
    campaign["dataset"]["code"] = "sammshen"
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    assert lab.campaign.num_rounds == [2]


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        ({"sim_profile": None}, "sim_profile", "engine: sim needs sim_profile"),
        ({"engine": "vllm"}, "sim_profile", "only for engine: sim, but engine is vllm"),
        (
            {"kv_cache_memory_bytes": 1 << 27, "num_gpu_blocks_override": 100},
            "num_gpu_blocks_override",
            "set kv_cache_memory_bytes or num_gpu_blocks_override, not both",
        ),
        (
            {"osl": ["recorded", "recoded"]},
            "osl[1]",
            "must be 'recorded' or a positive integer, got 'recoded'",
        ),
        ({"tiers": ["gpu", "cpu", "gpu"]}, "tiers[2]", "'gpu' is listed twice"),
        ({"concurrency": []}, "concurrency", "at least 1 item"),
        ({"gpu_vendor": "intel"}, "gpu_vendor", "'nvidia' or 'amd'"),
        ({"dataset": {"code": "sharegpt", "path": "x"}}, "dataset.code", "unknown dataset code 'sharegpt'"),
        ({"name": "my campaign"}, "name", "should match pattern"),
    ],
)
def test_rules_name_the_key(
    write_yaml: Writer, inventory: Any, campaign: Any, change: dict[str, Any], key: str, words: str
) -> None:
    campaign.update(change)
    problems = _errors(write_yaml, inventory, campaign)
    assert len(problems) == 1, problems
    assert f"campaign.yml: {key}: " in problems[0]
    assert words in problems[0]


def test_campaign_file_may_wrap_the_mapping(write_yaml: Writer, inventory: Any, campaign: Any) -> None:
    campaign["isl"] = -1
    problems = _errors(write_yaml, inventory, {"kvoffload_campaign": campaign})
    assert problems[0].endswith("campaign.yml: kvoffload_campaign.isl[0]: must be a positive integer, got -1")


@pytest.mark.parametrize(
    ("args", "key", "words"),
    [
        (["--max-model-len", "16384", "--tensor-parallel-size", "2"], "extra_engine_args[2]", "derived"),
        (["-tp", "2"], "extra_engine_args[0]", "derived from each replica's `gpus`"),
        (["--tensor_parallel_size=4"], "extra_engine_args[0]", "remove the flag"),
        (["--pipeline-parallel-size", "2"], "extra_engine_args[0]", "add replicas instead"),
        (["-pp=2"], "extra_engine_args[0]", "pipeline- or data-parallel size above 1"),
        (["--data-parallel-size", "2"], "extra_engine_args[0]", "add replicas instead"),
    ],
)
def test_extra_engine_args_refuse_parallelism_the_replicas_gpus_decide(
    write_yaml: Writer, inventory: Any, campaign: Any, args: list[str], key: str, words: str
) -> None:
    campaign["extra_engine_args"] = args
    problems = _errors(write_yaml, inventory, campaign)
    assert len(problems) == 1, problems
    assert f"campaign.yml: {key}: " in problems[0]
    assert words in problems[0]


def test_extra_engine_args_allow_a_pipeline_size_of_one(
    write_yaml: Writer, inventory: Any, campaign: Any
) -> None:
    campaign["extra_engine_args"] = ["--pipeline-parallel-size", "1", "--max-model-len", "16384"]
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    assert lab.campaign.extra_engine_args == ["--pipeline-parallel-size", "1", "--max-model-len", "16384"]


@pytest.mark.parametrize(
    ("args", "key", "words"),
    [
        (["-cc", '{"a":1}', "--compilation-config", '{"b":2}'], "[2]", "a second whole compilation config"),
        (["--max-model-len", "99", "--compilation-config", "3"], "[2]", "must be a JSON object"),
        (
            ["--compilation-config.pass_config.fuse_allreduce_rms=true"],
            "[0]",
            "fuse_allreduce_rms (True and False)",
        ),
        (['--compilation-config={"pass_config":{"fuse_allreduce_rms":true}}'], "[0]", "cannot compile"),
    ],
)
def test_extra_engine_args_refuse_a_compilation_config_the_lab_cannot_merge(
    write_yaml: Writer, inventory: Any, campaign: Any, args: list[str], key: str, words: str
) -> None:
    """Issue 52: refused when the campaign is read, naming the key, never when a unit is rendered."""
    campaign["extra_engine_args"] = args
    problems = _errors(write_yaml, inventory, campaign)
    assert len(problems) == 1, problems
    assert f"campaign.yml: extra_engine_args{key}: " in problems[0] and words in problems[0]


def test_extra_engine_args_keep_a_json_compilation_config_the_lab_can_merge(
    write_yaml: Writer, inventory: Any, campaign: Any
) -> None:
    campaign["extra_engine_args"] = ["-cc", '{"cudagraph_mode":"PIECEWISE"}', "--compilation-config.mode=3"]
    lab = load_lab(write_yaml("hosts.yml", inventory), write_yaml("campaign.yml", campaign))
    assert lab.campaign.extra_engine_args[1] == '{"cudagraph_mode":"PIECEWISE"}'
