"""Loaders on the shipped real data and on small hand-made files, including every kind of bad input."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvoffload.cli.main import main
from kvoffload.datasets import load_dataset
from kvoffload.datasets.split import extends
from kvoffload.errors import UserError

DATA = Path(__file__).resolve().parents[3] / "data"
TAU2 = DATA / "tau2-bench"
SAMMSHEN = DATA / "sammshen-sample"


def test_tau2_matches_the_documented_shape() -> None:
    sessions = load_dataset("tau2-bench-v1", TAU2)
    lengths = [len(s.calls) for s in sessions]
    # data/README.md: 100 simulations, agent calls per session min 5, median 13, max 23
    assert len(sessions) == 100
    assert (min(lengths), statistics.median(lengths), max(lengths)) == (5, 13, 23)
    for s in sessions:
        for prev, cur in zip(s.calls, s.calls[1:], strict=False):
            assert extends(prev, cur)


def test_tau2_agent_view_drops_user_tool_calls_and_converts_tool_calls() -> None:
    telecom = load_dataset("tau2-bench-v1", TAU2 / "gpt-4.1_telecom_default_gpt-4.1_1trials.json")
    raw = json.loads((TAU2 / "gpt-4.1_telecom_default_gpt-4.1_1trials.json").read_text())
    user_call_ids = {
        tc["id"]
        for sim in raw["simulations"]
        for m in sim["messages"]
        if m["role"] == "user"
        for tc in (m.get("tool_calls") or [])
    }
    assert user_call_ids, "the telecom file is expected to hold user-simulator tool calls"
    policy = raw["info"]["environment_info"]["policy"]
    seen_tool_call = False
    for session in telecom:
        last = session.calls[-1].messages
        assert last[0]["role"] == "system" and policy in last[0]["content"]
        for m in last:
            assert not (m["role"] == "user" and m.get("tool_calls"))
            if m["role"] == "tool":
                assert m["tool_call_id"] not in user_call_ids
            for tc in m.get("tool_calls") or []:
                seen_tool_call = True
                assert tc["type"] == "function"
                assert isinstance(json.loads(tc["function"]["arguments"]), dict)
    assert seen_tool_call


def test_tau2_output_length_and_gaps_come_from_the_record() -> None:
    raw = json.loads((TAU2 / "gpt-4.1_airline_default_gpt-4.1_1trials.json").read_text())
    sim = raw["simulations"][0]
    recorded = [m["usage"]["completion_tokens"] for m in sim["messages"][1:] if m["role"] == "assistant"]
    session = load_dataset("tau2-bench-v1", TAU2 / "gpt-4.1_airline_default_gpt-4.1_1trials.json")[0]
    assert [c.output_length for c in session.calls] == recorded
    assert session.calls[0].pre_gap == 0.0
    assert all(c.pre_gap >= 0 for c in session.calls)
    assert any(c.pre_gap > 0 for c in session.calls[1:])


def test_sammshen_reshaped_sample() -> None:
    sessions = load_dataset("sammshen", SAMMSHEN)
    assert len(sessions) == 1
    calls = sessions[0].calls
    assert len(calls) == 35
    assert (len(calls[0].messages), len(calls[-1].messages)) == (3, 68)
    assert calls[0].output_length is not None


def _hf_rows() -> list[dict[str, object]]:
    sys_msg = {"role": "system", "content": "be terse"}
    u1 = {"role": "user", "content": "first task"}
    a1 = {"role": "assistant", "content": "done"}
    u2 = {"role": "user", "content": "second"}
    rewritten = {"role": "user", "content": "a rewritten history"}
    return [
        {"session_id": "s1", "model": "m", "input": [sys_msg, u1], "pre_gap": 0.0, "output_length": 5},
        {
            "session_id": "s1",
            "model": "m",
            "input": [sys_msg, u1, a1, u2],
            "pre_gap": 1.5,
            "output_length": 6,
        },
        {
            "session_id": "s1",
            "model": "m",
            "input": [sys_msg, rewritten],
            "pre_gap": 0.25,
            "output_length": 7,
        },
        {"session_id": "s2", "model": "m", "input": [u2], "pre_gap": 0.0, "output_length": 8},
    ]


def _check_hf(sessions: list) -> None:  # type: ignore[type-arg]
    assert [s.session_id for s in sessions] == ["s1", "s1/1", "s2"]
    assert [len(s.calls) for s in sessions] == [2, 1, 1]
    assert sessions[0].calls[1].pre_gap == 1.5
    assert sessions[1].calls[0].output_length == 7


def test_sammshen_hf_schema_jsonl_splits_rewritten_histories(tmp_path: Path) -> None:
    path = tmp_path / "shard-0.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _hf_rows()))
    (tmp_path / "README.md").write_text("not data")
    _check_hf(load_dataset("sammshen", tmp_path))


def test_sammshen_hf_schema_parquet(tmp_path: Path) -> None:
    rows = _hf_rows()
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "train-00000.parquet")
    _check_hf(load_dataset("sammshen", tmp_path / "train-00000.parquet"))


def test_generic_jsonl(tmp_path: Path) -> None:
    lines = [
        {
            "session_id": "a",
            "messages": [{"role": "user", "content": "x"}],
            "output_length": 3,
            "pre_gap": 0.5,
        },
        {
            "session_id": "a",
            "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
        },
    ]
    path = tmp_path / "g.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (s,) = load_dataset("generic", path)
    assert [c.output_length for c in s.calls] == [3, None]
    assert s.calls[0].pre_gap == 0.5


@pytest.mark.parametrize(
    ("content", "where", "problem"),
    [
        (
            '{"session_id": "a", "messages": [{"role": "user", "content": "x"}]}\n{"session_id": "a", "mess',
            "line 2",
            "invalid JSON",
        ),
        ('{"session_id": "a", "messages": "hello"}\n', "line 1", "'messages' must be a non-empty list"),
        ('{"session_id": 7, "messages": [{"role": "user"}]}\n', "line 1", "'session_id'"),
        ('{"messages": [{"role": "user"}]}\n', "line 1", "missing or non-string 'session_id'"),
        (
            '{"session_id": "a", "messages": [{"role": "user", "content": "x"}], "output_length": "many"}\n',
            "line 1",
            "'output_length'",
        ),
        ("\n\n", "file", "is empty"),
    ],
)
def test_bad_generic_data_names_file_and_line(tmp_path: Path, content: str, where: str, problem: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(UserError) as err:
        load_dataset("generic", path)
    assert str(path) in str(err.value)
    assert where in str(err.value)
    assert problem in str(err.value)


def test_bad_tau2_file(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text('{"info": {"environment_info": {}}, "simulations": []}')
    with pytest.raises(UserError, match=r"r.json: info.environment_info.policy: missing"):
        load_dataset("tau2-bench-v1", path)
    path.write_text('{"info": ')
    with pytest.raises(UserError, match=r"r.json: line 1: invalid JSON"):
        load_dataset("tau2-bench-v1", path)


def test_cli_exits_2_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"session_id": "a", "messages": [}\n')
    assert main(["datasets", "inspect", "--dataset-code", "generic", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: line 1: invalid JSON" in err
    assert "Traceback" not in err
    assert main(["datasets", "inspect", "--dataset-code", "generic", str(tmp_path / "missing.jsonl")]) == 2
