"""Malformed datasets: `datasets inspect` exits 2 naming the file and the line (JSONL) or the record
(a JSON document), with no traceback. Each case breaks one thing of a valid generic JSONL file, a
sammshen file or a tau2-bench results file (the same loaders `plan`, `run` and the replay use).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvoffload.datasets import load_dataset
from tests.support.datasets import generic_lines
from tests.unit.badinput.harness import assert_refused, cli, install_traps


def sammshen_rows(calls: int = 6) -> list[dict[str, Any]]:
    """Hugging Face schema: one row per call, cumulative `input`."""
    rows = []
    history: list[dict[str, Any]] = [{"role": "system", "content": "agent"}]
    for c in range(calls):
        history = [*history, {"role": "user", "content": f"step {c}"}]
        rows.append({"session_id": "a", "model": "m", "input": history, "pre_gap": 0.5, "output_length": 9})
        history = [*history, {"role": "assistant", "content": f"done {c}"}]
    return rows


def tau2_doc(calls: int = 6) -> dict[str, Any]:
    """A tau2-bench results file with one simulation of `calls` agent calls after the greeting."""
    messages: list[dict[str, Any]] = [{"role": "assistant", "content": "Hi! How can I help?"}]
    for c in range(calls):
        messages += [
            {"role": "user", "content": f"request {c}"},
            {"role": "assistant", "content": f"answer {c}", "usage": {"completion_tokens": 7}},
        ]
    return {
        "info": {"environment_info": {"domain_name": "airline", "policy": "Be helpful."}},
        "simulations": [{"id": "sim-1", "messages": messages}],
    }


def _jsonl(rows: list[Any]) -> bytes:
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


def _generic(change: Callable[[list[dict[str, Any]]], Any] | None = None) -> bytes:
    rows = [json.loads(line) for line in generic_lines()]
    if change is not None:
        change(rows)
    return _jsonl(rows)


def _sammshen(change: Callable[[list[dict[str, Any]]], Any]) -> bytes:
    rows = sammshen_rows()
    change(rows)
    return _jsonl(rows)


def _tau2(change: Callable[[dict[str, Any]], Any]) -> bytes:
    doc = tau2_doc()
    change(doc)
    return json.dumps(doc, indent=1).encode()


def _first_sim(change: Callable[[dict[str, Any]], Any]) -> bytes:
    return _tau2(lambda doc: change(doc["simulations"][0]))


def _set0(key: str, value: Any) -> Callable[[list[dict[str, Any]]], None]:
    def change(rows: list[dict[str, Any]]) -> None:
        rows[0][key] = value

    return change


def _pop0(key: str) -> Callable[[list[dict[str, Any]]], None]:
    return lambda rows: rows[0].pop(key)


def _line(n: int, text: str) -> bytes:
    """The valid generic file with line `n` replaced by `text`."""
    lines = generic_lines()
    lines[n - 1] = text
    return ("\n".join(lines) + "\n").encode()


@dataclass(frozen=True)
class DataCase:
    id: str
    code: str
    # file name -> bytes, under the case's folder; `path` is what is given (a file, or "" for the folder)
    files: dict[str, bytes]
    path: str
    needles: tuple[str, ...]


G, S, T = "generic", "sammshen", "tau2-bench-v1"
TAU = "results.json"
TRUNCATED = json.dumps(tau2_doc(), indent=1)[:150].encode()
DEEP = "[" * 100_000 + "]" * 100_000

CASES = [
    # generic JSONL, one call per line.
    DataCase("generic-missing-path", G, {}, "nothing.jsonl", ("{d}/nothing.jsonl: path: does not exist",)),
    DataCase("generic-empty-file", G, {"c.jsonl": b""}, "c.jsonl", ("{d}/c.jsonl: file: is empty",)),
    DataCase(
        "generic-blank-lines-only", G, {"c.jsonl": b"\n  \n\t\n"}, "c.jsonl", ("{d}/c.jsonl: file: is empty",)
    ),
    DataCase(
        "generic-truncated-line",
        G,
        {"c.jsonl": _line(2, '{"session_id": "s0", "messa')},
        "c.jsonl",
        ("{d}/c.jsonl: line 2: invalid JSON (Unterminated string starting at column 22)",),
    ),
    DataCase(
        "generic-cut-off-last-line",
        G,
        {"c.jsonl": _generic() + b'{"session_id": "s1", "mes'},
        "c.jsonl",
        ("{d}/c.jsonl: line 21: invalid JSON",),
    ),
    DataCase(
        "generic-line-is-a-list",
        G,
        {"c.jsonl": _line(5, '["s0", []]')},
        "c.jsonl",
        ("{d}/c.jsonl: line 5: must be a JSON object with session_id and messages",),
    ),
    DataCase(
        "generic-line-is-a-number",
        G,
        {"c.jsonl": _line(1, "42")},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: must be a JSON object",),
    ),
    DataCase(
        "generic-no-session-id",
        G,
        {"c.jsonl": _generic(_pop0("session_id"))},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: missing or non-string 'session_id'",),
    ),
    DataCase(
        "generic-session-id-int",
        G,
        {"c.jsonl": _generic(_set0("session_id", 7))},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: missing or non-string 'session_id'",),
    ),
    DataCase(
        "generic-no-messages",
        G,
        {"c.jsonl": _generic(_pop0("messages"))},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: 'messages' must be a non-empty list of messages",),
    ),
    DataCase(
        "generic-messages-empty",
        G,
        {"c.jsonl": _generic(_set0("messages", []))},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: 'messages' must be a non-empty list",),
    ),
    DataCase(
        "generic-messages-a-string",
        G,
        {"c.jsonl": _generic(_set0("messages", "hello"))},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: 'messages' must be a non-empty list",),
    ),
    DataCase(
        "generic-message-not-object",
        G,
        {"c.jsonl": _generic(_set0("messages", [{"role": "user"}, "hi"]))},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: 'messages[1]' must be an object with a string 'role'",),
    ),
    DataCase(
        "generic-message-without-role",
        G,
        {"c.jsonl": _generic(_set0("messages", [{"content": "hi"}]))},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: 'messages[0]' must be an object with a string 'role'",),
    ),
    # messages a chat server refuses (kvoffload/datasets/chat.py): HTTP 400 mid-campaign otherwise
    DataCase(
        "generic-message-role-bot",
        G,
        {
            "c.jsonl": _line(
                3, json.dumps({"session_id": "s0", "messages": [{"role": "bot", "content": "hi"}]})
            )
        },
        "c.jsonl",
        (
            "{d}/c.jsonl: line 3: 'messages[0]': role 'bot' is not one a chat server accepts "
            "(roles allowed: system, developer, user, assistant, tool)",
        ),
    ),
    DataCase(
        "generic-message-content-a-number",
        G,
        {"c.jsonl": _generic(_set0("messages", [{"role": "user", "content": 42}]))},
        "c.jsonl",
        (
            "{d}/c.jsonl: line 1: 'messages[0]': 'content' must be a string or a list of content parts, "
            "got int",
        ),
    ),
    DataCase(
        "generic-message-content-part-without-type",
        G,
        {"c.jsonl": _generic(_set0("messages", [{"role": "user", "content": [{"text": "hi"}]}]))},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: 'messages[0]': 'content[0]' must be an object with a string 'type'",),
    ),
    DataCase(
        "generic-user-message-without-content",
        G,
        {"c.jsonl": _generic(_set0("messages", [{"role": "system", "content": "s"}, {"role": "user"}]))},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: 'messages[1]': a user message needs 'content'",),
    ),
    DataCase(
        "generic-tool-message-without-tool-call-id",
        G,
        {"c.jsonl": _generic(_set0("messages", [{"role": "tool", "content": "42"}]))},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: 'messages[0]': a tool message needs a string 'tool_call_id'",),
    ),
    DataCase(
        "generic-tool-call-arguments-not-json",
        G,
        {
            "c.jsonl": _generic(
                _set0(
                    "messages",
                    [
                        {"role": "user", "content": "u"},
                        {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{oops"}}],
                        },
                    ],
                )
            )
        },
        "c.jsonl",
        ("{d}/c.jsonl: line 1: 'messages[1]': 'tool_calls[0].function.arguments' is not valid JSON",),
    ),
    DataCase(
        "sammshen-message-role-bot",
        S,
        {"s.jsonl": _sammshen(lambda rows: rows[1]["input"].append({"role": "bot", "content": "x"}))},
        "s.jsonl",
        ("{d}/s.jsonl: line 2: 'input[4]': role 'bot' is not one a chat server accepts",),
    ),
    DataCase(
        "generic-output-length-negative",
        G,
        {"c.jsonl": _generic(_set0("output_length", -3))},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: 'output_length' must be a non-negative integer, got -3",),
    ),
    DataCase(
        "generic-output-length-string",
        G,
        {"c.jsonl": _generic(_set0("output_length", "8"))},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: 'output_length' must be a non-negative integer, got '8'",),
    ),
    DataCase(
        "generic-output-length-bool",
        G,
        {"c.jsonl": _generic(_set0("output_length", True))},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: 'output_length' must be a non-negative integer, got True",),
    ),
    DataCase(
        "generic-pre-gap-negative",
        G,
        {"c.jsonl": _generic(_set0("pre_gap", -1.5))},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: 'pre_gap' must be a non-negative number of seconds, got -1.5",),
    ),
    DataCase(
        "generic-pre-gap-string",
        G,
        {"c.jsonl": _generic(_set0("pre_gap", "1s"))},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: 'pre_gap' must be a non-negative number of seconds",),
    ),
    DataCase(
        "generic-not-utf8",
        G,
        {"c.jsonl": _generic().replace(b"question 3", b"qu\xe9stion 3", 1)},
        "c.jsonl",
        ("{d}/c.jsonl: line 4: not UTF-8 text (byte 0xe9",),
    ),
    DataCase(
        "generic-binary-garbage",
        G,
        {"c.jsonl": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"},
        "c.jsonl",
        ("{d}/c.jsonl: line 1: not UTF-8 text (byte 0x89 at column 1)",),
    ),
    DataCase(
        "generic-nested-too-deeply",
        G,
        {"c.jsonl": _line(3, DEEP)},
        "c.jsonl",
        ("{d}/c.jsonl: line 3: invalid JSON (nested too deeply to read)",),
    ),
    DataCase(
        "generic-folder-without-jsonl",
        G,
        {"c.json": _generic(), "README.md": b"# hi"},
        "",
        ("{d}: folder: holds no data files (.jsonl)",),
    ),
    DataCase(
        "generic-bad-second-shard",
        G,
        {"a.jsonl": _generic(), "b.jsonl": _line(7, "{oops}")},
        "",
        ("{d}/b.jsonl: line 7: invalid JSON",),
    ),
    # sammshen (Hugging Face schema, JSONL).
    DataCase(
        "sammshen-no-input",
        S,
        {"s.jsonl": _sammshen(_pop0("input"))},
        "s.jsonl",
        ("{d}/s.jsonl: line 1: missing 'input' (expected the sammshen schema",),
    ),
    DataCase(
        "sammshen-input-a-string",
        S,
        {"s.jsonl": _sammshen(_set0("input", "hi"))},
        "s.jsonl",
        ("{d}/s.jsonl: line 1: 'input' must be a non-empty list of messages",),
    ),
    DataCase(
        "sammshen-metadata-not-object",
        S,
        {"s.jsonl": _sammshen(_set0("metadata", [1]))},
        "s.jsonl",
        ("{d}/s.jsonl: line 1: 'metadata' must be an object",),
    ),
    DataCase(
        "sammshen-metadata-without-session",
        S,
        {"s.jsonl": _sammshen(_set0("metadata", {"request_index": 0}))},
        "s.jsonl",
        ("{d}/s.jsonl: line 1: missing or non-string 'session_id'",),
    ),
    DataCase(
        "sammshen-pre-gap-negative",
        S,
        {"s.jsonl": _sammshen(lambda rows: rows[3].update(pre_gap=-2))},
        "s.jsonl",
        ("{d}/s.jsonl: line 4: 'pre_gap' must be a non-negative number of seconds, got -2",),
    ),
    DataCase(
        "sammshen-corrupt-parquet",
        S,
        {"s.parquet": b"PAR1 this is not parquet PAR1"},
        "s.parquet",
        ("{d}/s.parquet: file: is not a readable parquet file",),
    ),
    DataCase(
        "sammshen-given-a-tau2-file",
        S,
        {TAU: _tau2(lambda d: None)},
        TAU,
        (f"{{d}}/{TAU}: line 1: invalid JSON",),
    ),
    # tau2-bench results files (one JSON document).
    DataCase("tau2-truncated", T, {TAU: TRUNCATED}, TAU, (f"{{d}}/{TAU}: line 11: invalid JSON",)),
    DataCase("tau2-empty-file", T, {TAU: b"  \n"}, TAU, (f"{{d}}/{TAU}: file: is empty",)),
    DataCase(
        "tau2-not-utf8",
        T,
        {TAU: _tau2(lambda d: None).replace(b"request 2", b"r\xe9quest 2")},
        TAU,
        (f"{{d}}/{TAU}: line 40: not UTF-8 text (byte 0xe9 at column 19)",),
    ),
    DataCase(
        "tau2-top-level-list",
        T,
        {TAU: b"[1, 2]"},
        TAU,
        (f"{{d}}/{TAU}: top level: not a tau2 results file (no 'simulations' list)",),
    ),
    DataCase(
        "tau2-no-simulations",
        T,
        {TAU: _tau2(lambda d: d.pop("simulations"))},
        TAU,
        (f"{{d}}/{TAU}: top level: not a tau2 results file",),
    ),
    DataCase(
        "tau2-simulations-a-mapping",
        T,
        {TAU: _tau2(lambda d: d.update(simulations={"a": 1}))},
        TAU,
        (f"{{d}}/{TAU}: top level: not a tau2 results file",),
    ),
    DataCase(
        "tau2-no-info",
        T,
        {TAU: _tau2(lambda d: d.pop("info"))},
        TAU,
        (f"{{d}}/{TAU}: info.environment_info.policy: missing or not a string",),
    ),
    DataCase(
        "tau2-info-a-list",
        T,
        {TAU: _tau2(lambda d: d.update(info=["airline"]))},
        TAU,
        (f"{{d}}/{TAU}: info.environment_info.policy: missing",),
    ),
    DataCase(
        "tau2-environment-a-string",
        T,
        {TAU: _tau2(lambda d: d["info"].update(environment_info="airline"))},
        TAU,
        (f"{{d}}/{TAU}: info.environment_info.policy: missing",),
    ),
    DataCase(
        "tau2-policy-not-a-string",
        T,
        {TAU: _tau2(lambda d: d["info"]["environment_info"].update(policy=["a"]))},
        TAU,
        (f"{{d}}/{TAU}: info.environment_info.policy: missing or not a string",),
    ),
    DataCase(
        "tau2-simulation-not-object",
        T,
        {TAU: _tau2(lambda d: d["simulations"].append("sim-2"))},
        TAU,
        (f"{{d}}/{TAU}: simulations[1]: must be an object with a 'messages' list",),
    ),
    DataCase(
        "tau2-messages-not-a-list",
        T,
        {TAU: _first_sim(lambda s: s.update(messages={"role": "user"}))},
        TAU,
        (f"{{d}}/{TAU}: simulations[0]: must be an object with a 'messages' list",),
    ),
    DataCase(
        "tau2-message-role-system",
        T,
        {TAU: _first_sim(lambda s: s["messages"].insert(3, {"role": "system", "content": "x"}))},
        TAU,
        (f"{{d}}/{TAU}: simulations[0].messages[3]: must be an object with role assistant, user or tool",),
    ),
    DataCase(
        "tau2-message-not-object",
        T,
        {TAU: _first_sim(lambda s: s["messages"].insert(1, None))},
        TAU,
        (f"{{d}}/{TAU}: simulations[0].messages[1]: must be an object with role",),
    ),
    DataCase(
        "tau2-tool-calls-not-a-list",
        T,
        {TAU: _first_sim(lambda s: s["messages"][2].update(tool_calls={"name": "x"}))},
        TAU,
        (f"{{d}}/{TAU}: simulations[0].messages[2]: 'tool_calls' must be a list",),
    ),
    DataCase(
        "tau2-tool-call-without-name",
        T,
        {TAU: _first_sim(lambda s: s["messages"][2].update(tool_calls=[{"arguments": {}}]))},
        TAU,
        (f"{{d}}/{TAU}: simulations[0].messages[2]: tool_calls[0] must be an object with a string 'name'",),
    ),
    DataCase(
        "tau2-sessions-with-no-calls",
        T,
        {TAU: _first_sim(lambda s: s.update(messages=s["messages"][:1]))},
        TAU,
        (f"{{d}}/{TAU}: no sessions found for dataset code 'tau2-bench-v1'",),
    ),
    DataCase(
        "tau2-no-simulations-at-all",
        T,
        {TAU: _tau2(lambda d: d.update(simulations=[]))},
        TAU,
        (f"{{d}}/{TAU}: no sessions found",),
    ),
    DataCase(
        "tau2-given-a-jsonl-file",
        T,
        {"c.jsonl": _generic()},
        "c.jsonl",
        ("{d}/c.jsonl: line 2: invalid JSON (Extra data",),
    ),
    DataCase(
        "tau2-folder-of-jsonl",
        T,
        {"c.jsonl": _generic(), "LICENSE": b"MIT"},
        "",
        ("{d}: folder: holds no data files (.json)",),
    ),
]


def _write(case: DataCase, folder: Path) -> Path:
    folder.mkdir()
    for name, data in case.files.items():
        (folder / name).write_bytes(data)
    return folder / case.path if case.path else folder


@pytest.mark.parametrize(
    ("code", "name", "data"),
    [
        (G, "c.jsonl", _generic()),
        (S, "s.jsonl", _jsonl(sammshen_rows())),
        (T, TAU, json.dumps(tau2_doc()).encode()),
    ],
)
def test_the_base_files_load(code: str, name: str, data: bytes, tmp_path: Path) -> None:
    (tmp_path / name).write_bytes(data)
    sessions = load_dataset(code, tmp_path / name)
    assert sum(len(s.calls) for s in sessions) in (6, 20)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_malformed_dataset_is_refused(
    case: DataCase, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "ds"
    path = _write(case, folder)
    touched = install_traps(monkeypatch)
    outcome = cli(["datasets", "inspect", "--dataset-code", case.code, str(path)], capsys)
    assert_refused(outcome, *(n.format(d=folder) for n in case.needles))
    assert touched == []


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)
    assert {c.code for c in CASES} == {G, S, T}
    assert copy.deepcopy(tau2_doc()) == tau2_doc()
