"""`kvoffload-lab replay`: exit codes end to end, the --help epilog, and flags checked as the campaign is."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kvoffload.cli.main import build_parser, main
from kvoffload.config import Campaign
from kvoffload.config.errors import format_validation_error
from kvoffload.datasets import Call
from kvoffload.replay.command import ReplaySpec, replay_argv
from kvoffload.replay.outcome import MEANING, ExitCode
from kvoffload.replay.requests import RequestOptions, build_payload
from tests.unit.replay.loopback import HANG_S, generic_dataset, records, serving_in_thread, sessions, sse_app


def _argv(url: str, data: Path, out: Path, *extra: str) -> list[str]:
    return ["replay", "--base-url", url, "--model", "m", "--dataset-code", "generic",
            "--dataset", str(data), "--concurrency", "2", "--num-rounds", "5", "--output", str(out),
            "--warmup", "1", *extra]  # fmt: skip


@pytest.fixture
def replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    """Run the command against an app on loopback: (exit code, stderr lines, output folder)."""

    def run(app: Any, *extra: str) -> tuple[int, list[str], Path]:
        data = generic_dataset(tmp_path / "data.jsonl")
        out = tmp_path / "out"
        with serving_in_thread(lambda: app) as url:
            rc = main(_argv(url, data, out, *extra))
        return rc, capsys.readouterr().err.strip().splitlines(), out

    return run


def test_every_request_ok_exits_0(replay: Any) -> None:
    rc, err, out = replay(sse_app())
    assert rc == int(ExitCode.OK) == 0
    assert err[-2].startswith("replay: 3 sessions (3 complete")  # the counts, then the TTFT figures
    assert err[-1].startswith("replay: TTFT ms (ok requests) all 15: p50 ")
    assert sessions(out)["complete"] == 3


def test_some_failed_requests_exit_3_with_the_counts(replay: Any) -> None:
    rc, err, out = replay(sse_app(fail_user="s1:"))
    assert rc == int(ExitCode.SOME_FAILED) == 3
    assert err[-1] == (
        "kvoffload-lab: replay completed with failures: 1 of 11 requests failed, 1 error sessions; "
        "first: HTTP 500: injected failure (exit 3)"
    )
    counts = sessions(out)
    assert (counts["complete"], counts["error"], counts["failed_requests"]) == (2, 1, 1)


def test_every_request_failing_exits_4(replay: Any) -> None:
    rc, err, out = replay(sse_app(fail_user=":0"))  # every replayed user; warm-up ids have no ':'
    assert rc == int(ExitCode.ALL_FAILED) == 4
    assert err[-1].startswith("kvoffload-lab: replay failed: every request failed (3 of 3); first: HTTP 500")
    assert all(r["status"] == "error" for r in records(out))


def test_unreachable_server_exits_4_after_the_warmups_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = generic_dataset(tmp_path / "data.jsonl")
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        rc = main(_argv(url, data, tmp_path / "out"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == ExitCode.ALL_FAILED
    assert "all 1 warm-up requests failed (ConnectError" in err[-1] and err[-1].endswith("(exit 4)")
    assert sessions(tmp_path / "out")["stopped_by"] == "warmup"


def test_a_stalled_server_exits_5_and_the_reason_is_written(replay: Any) -> None:
    rc, err, out = replay(sse_app(ttft=HANG_S), "--warmup", "0", "--stall-timeout", "0.3")
    assert rc == int(ExitCode.STALLED) == 5
    assert err[-1].startswith("kvoffload-lab: replay stalled: no byte arrived on any of the 2 requests")
    counts = sessions(out)
    assert counts["stopped_by"] == "stall" and "0.3 s (--stall-timeout)" in str(counts["stop_reason"])
    assert {r["error"] for r in records(out)} == {counts["stop_reason"]}


def test_a_raising_session_is_logged_counted_and_the_run_goes_on(
    replay: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:

    def build(call: Call, opts: RequestOptions) -> dict[str, Any]:
        if call.session_id == "s0":
            raise RuntimeError("boom")
        return build_payload(call, opts)

    monkeypatch.setattr("kvoffload.replay.runner.build_payload", build)
    rc, err, out = replay(sse_app())
    assert rc == ExitCode.SOME_FAILED
    counts = sessions(out)
    assert (counts["complete"], counts["error"], counts["exceptions"], counts["requests"]) == (2, 1, 1, 10)
    assert any(r.exc_info is not None and "s0:0" in r.getMessage() for r in caplog.records)
    assert "first: RuntimeError: boom" in err[-1]


def test_help_lists_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["replay", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    epilog = text[text.index("exit status:") :]
    flat = " ".join(epilog.split())
    for code, meaning in MEANING.items():
        assert f" {int(code)} {' '.join(meaning.split())}" in flat, code


def _campaign_problem(key: str, value: object) -> str:
    """The campaign loader's message for `key: [value]` (or `key: value`), without file and key."""
    raw: dict[str, Any] = {
        "name": "c", "model": "m", "gpu_vendor": "nvidia", "engine": "vllm",
        "dataset": {"code": "generic", "path": "d"}, "tiers": ["gpu"],
        "concurrency": [1], "num_rounds": [5], "isl": [100],
    }  # fmt: skip
    raw[key] = value
    with pytest.raises(ValidationError) as info:
        Campaign.model_validate(raw)
    line = format_validation_error(info.value, "f.yml", "", Campaign).problems[0]
    return line.split(": ", 2)[2]


@pytest.mark.parametrize(
    ("flag", "text", "key", "value"),
    [
        ("--concurrency", "0", "concurrency", [0]),
        ("--concurrency", "2.5", "concurrency", [2.5]),
        ("--num-rounds", "-1", "num_rounds", [-1]),
        ("--isl", "x", "isl", ["x"]),
        ("--max-sessions", "0", "max_sessions", 0),
        ("--duration", "-5", "duration_s", -5),
        ("--osl", "recoded", "osl", ["recoded"]),
        ("--osl", "0", "osl", [0]),
        ("--model", "", "model", ""),
        ("--dataset-code", "nope", "dataset", {"code": "nope", "path": "d"}),
    ],
)
def test_campaign_keys_and_their_flags_share_one_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, text: str, key: str, value: object
) -> None:
    data = generic_dataset(tmp_path / "data.jsonl")
    with pytest.raises(SystemExit) as exit_info:
        main([*_argv("http://127.0.0.1:9", data, tmp_path / "out"), flag, text])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"kvoffload-lab replay: error: argument {flag}: {_campaign_problem(key, value)}"


def test_num_rounds_below_the_chunk_floor_says_what_the_campaign_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = generic_dataset(tmp_path / "data.jsonl")
    assert main([*_argv("http://127.0.0.1:9", data, tmp_path / "out"), "--num-rounds", "3"]) == 2
    err = capsys.readouterr().err
    assert "argument --num-rounds: 3 is below the minimum chunk length 5 of --dataset-code generic" in err
    assert _campaign_problem("num_rounds", [3]) == (
        "3 is below the minimum chunk length 5 of dataset.code generic: it would yield zero virtual users"
    )


def test_good_values_parse_to_what_the_runner_needs(tmp_path: Path) -> None:
    data = generic_dataset(tmp_path / "data.jsonl")
    args = build_parser().parse_args(
        [*_argv("https://lb.example:8443/v1", data, tmp_path / "out"), "--osl", "64", "--warmup", "0",
         "--stall-timeout", "0", "--duration", "600", "--request-timeout", "0.5", "--max-sessions", "3"]
    )  # fmt: skip
    assert (args.osl, args.warmup, args.stall_timeout, args.duration) == (64, 0, 0.0, 600)
    assert (args.request_timeout, args.max_sessions, args.concurrency) == (0.5, 3, 2)
    defaults = build_parser().parse_args(_argv("http://127.0.0.1:8000", data, tmp_path / "o"))
    assert (defaults.osl, defaults.stall_timeout, defaults.request_timeout) == ("recorded", 300.0, 64800.0)


def test_the_orchestrators_command_line_parses(tmp_path: Path) -> None:
    """What replay_argv builds for a cell (a long --duration included) is accepted by the command."""
    data = generic_dataset(tmp_path / "data.jsonl")
    spec = ReplaySpec(
        base_url="http://10.0.0.5:8100", model="openai/gpt-oss-20b", dataset_code="generic",
        dataset=str(data), concurrency=8, num_rounds=10, output=str(tmp_path / "out"), isl=32768,
        osl="128", max_sessions=50, duration_s=1_000_000,
    )  # fmt: skip
    for each in (spec, replace(spec, osl="recorded", duration_s=None, isl=None, model="Qwen/Qwen3-8B")):
        args = build_parser().parse_args(replay_argv(each)[1:])
        assert args.duration == each.duration_s and args.concurrency == 8
        assert args.warmup == 4 and args.request_timeout == 64800
