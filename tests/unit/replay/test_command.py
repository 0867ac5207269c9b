"""The resolved replay command: fixed flags, and the gpt-oss row only for gpt-oss models."""

from __future__ import annotations

from dataclasses import replace

from kvoffload.replay.command import GPT_OSS_FLAGS, ReplaySpec, replay_argv

SPEC = ReplaySpec(
    base_url="http://lb:8100",
    model="Qwen/Qwen3-8B",
    dataset_code="tau2-bench-v1",
    dataset="/data/tau2",
    concurrency=8,
    num_rounds=10,
    output="/results/c1",
    isl=32768,
)


def test_fixed_flags_are_present() -> None:
    argv = replay_argv(SPEC)
    joined = " ".join(argv)
    for flag in ("--agentic-traces", "--warmup 4", "--request-timeout 64800", "--tokenizer Qwen/Qwen3-8B",
                 "--min-chunk-rounds 5", "--isl 32768", "--osl recorded"):  # fmt: skip
        assert flag in joined
    assert not set(GPT_OSS_FLAGS) & set(argv)


def test_gpt_oss_row_only_for_gpt_oss() -> None:
    oss = replay_argv(replace(SPEC, model="openai/gpt-oss-120b"))
    row = slice(-len(GPT_OSS_FLAGS) - 2, -2)  # the row, then --output
    assert oss[row] == list(GPT_OSS_FLAGS)
    base = oss[: row.start] + oss[row.stop :]
    # everything but the row (and the model-dependent values) is identical
    assert [a for a in base if "gpt-oss" not in a] == [a for a in replay_argv(SPEC) if "Qwen" not in a]
    other = replay_argv(replace(SPEC, model="meta-llama/Llama-3.1-8B"))
    assert (
        " ".join(other).encode()
        == " ".join(replay_argv(SPEC)).replace("Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B").encode()
    )


def test_sammshen_has_no_chunk_floor_flag() -> None:
    assert "--min-chunk-rounds" not in replay_argv(replace(SPEC, dataset_code="sammshen"))


def test_workers_flag_only_when_set() -> None:
    assert "--workers" not in replay_argv(SPEC)  # the replay picks its default on the client host
    argv = replay_argv(replace(SPEC, workers=4))
    assert argv[argv.index("--workers") + 1] == "4"


def test_campaigns_ask_for_attribution_and_a_spec_can_leave_it_out() -> None:
    assert "--attribution" in replay_argv(SPEC)
    assert "--attribution" not in replay_argv(replace(SPEC, attribution=False))


def test_the_cell_parameters_come_first_and_the_output_last() -> None:
    argv = replay_argv(replace(SPEC, max_sessions=3, honor_gaps=True), executable="/venv/bin/kvoffload-lab")
    assert argv[:2] == ["/venv/bin/kvoffload-lab", "replay"]
    assert argv[2:20:2] == ["--base-url", "--model", "--dataset-code", "--dataset", "--concurrency",
                            "--num-rounds", "--isl", "--osl", "--max-sessions"]  # fmt: skip
    assert argv[-3:] == ["--honor-gaps", "--output", "/results/c1"]
    assert "--honor-gaps" not in replay_argv(SPEC)
