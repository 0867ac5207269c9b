"""kvoffload/parallelism.py's compilation config (issue 52): the campaign's and the lab's merged into the one
vLLM keeps, and what vLLM 0.32 parses from a replica's arguments, with hand-worked cases."""

from __future__ import annotations

import json

import pytest

from kvoffload.parallelism import TP_CUDA_COMPILATION, CompilationError, compilation_args, compilation_config

OURS = TP_CUDA_COMPILATION
FUSION_OFF = "--compilation-config.pass_config.fuse_allreduce_rms=false"


def test_without_a_whole_config_ours_is_a_dotted_flag_that_vllm_merges_itself() -> None:
    args = ["--max-model-len", "8192", "--compilation-config.cudagraph_mode=PIECEWISE"]
    assert compilation_args(args, OURS) == [*args, FUSION_OFF]
    assert compilation_config(compilation_args(args, OURS)) == {
        "cudagraph_mode": "PIECEWISE",
        "pass_config": {"fuse_allreduce_rms": False},
    }
    assert compilation_args(args, {}) == args


def test_vllm_drops_a_whole_config_next_to_a_dotted_key_and_the_merge_keeps_both() -> None:
    """The defect: the JSON and our dotted flag side by side, vLLM keeps only the folded dotted one."""
    side_by_side = ["-cc", '{"cudagraph_mode":"NONE"}', FUSION_OFF]
    assert compilation_config(side_by_side) == {"pass_config": {"fuse_allreduce_rms": False}}
    merged = compilation_args(["--enforce-eager", "-cc", '{"cudagraph_mode":"NONE"}', "--x"], OURS)
    assert merged == [
        "--enforce-eager",
        "--compilation-config",
        '{"cudagraph_mode":"NONE","pass_config":{"fuse_allreduce_rms":false}}',
        "--x",
    ]


def test_the_users_own_json_and_dotted_keys_become_one_config_too() -> None:
    args = ["--compilation_config.mode", "3", '--compilation-config={"pass_config":{"fuse_norm_quant":true}}']
    merged = compilation_args(args, OURS)
    assert merged[0] == "--compilation-config" and len(merged) == 2
    assert json.loads(merged[1]) == {
        "mode": 3,
        "pass_config": {"fuse_norm_quant": True, "fuse_allreduce_rms": False},
    }
    assert " " not in merged[1]  # one word in a systemd unit


def test_the_same_value_twice_is_no_conflict() -> None:
    args = ['--compilation-config={"pass_config":{"fuse_allreduce_rms":false}}']
    assert json.loads(compilation_args(args, OURS)[1]) == OURS


@pytest.mark.parametrize(
    ("args", "index", "words"),
    [
        (["-cc", "{}", "-cc={}"], 2, "a second whole compilation config"),
        (["--compilation-config", "[1]"], 0, "must be a JSON object"),
        (["--compilation-config", "not json"], 0, "must be a JSON object"),
        (["--max-model-len", "9", FUSION_OFF.replace("false", "true")], 2, "cannot compile"),
        (["--compilation-config.mode=3", "--compilation-config.mode=2"], 0, "set twice"),
    ],
)
def test_what_cannot_be_merged_is_refused_naming_the_argument(
    args: list[str], index: int, words: str
) -> None:
    with pytest.raises(CompilationError) as caught:
        compilation_args(args, OURS)
    assert caught.value.index == index and words in str(caught.value)


def test_what_vllm_parses_keeps_the_last_whole_config_and_folds_dotted_keys_over_it() -> None:
    assert compilation_config([]) == {}
    assert compilation_config(["-cc", '{"a":1}', "--compilation-config", '{"b":2}']) == {"b": 2}
    assert compilation_config(["--compilation-config.a.b", "x", "--compilation-config.a.c=1"]) == {
        "a": {"b": "x", "c": 1}
    }
