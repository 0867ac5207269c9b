"""Property tests of the dataset loaders (generic JSONL, sammshen, tau2-bench): any document, valid,
mutated or arbitrary, either loads into sessions that keep the loaders' invariants or raises the
loaders' own error (`UserError`, naming the file), never another exception.

Invariants of loaded sessions: unique session ids; every call of a session carries its id and its
index (0, 1, ...), in recorded order, and extends the call before it; messages are non-empty tuples of
objects with a string role; output lengths are None or >= 0, gaps finite and >= 0. Virtual users are
consecutive chunks of exactly num_rounds calls, len(session) // num_rounds of them, none below the
loader's floor. Deterministic (derandomized, no example database) and bounded in examples; run with
`--hypothesis-show-statistics` to see how many examples loaded and how many were refused.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import event, given
from hypothesis import strategies as st

from kvoffload.datasets import chunk_floor, load_dataset, virtual_users
from kvoffload.datasets.model import Session
from kvoffload.datasets.split import extends
from kvoffload.errors import UserError
from tests.support.datasets import generic_lines
from tests.support.properties import repeatable

PROPERTIES = repeatable(120)

# JSON values: what json.dumps writes and json.loads reads back.
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=12)}
) | st.fixed_dictionaries(  # a tool message answers a call by its id (kvoffload/datasets/chat.py)
    {
        "role": st.just("tool"),
        "content": st.text(max_size=12),
        "tool_call_id": st.text(min_size=1, max_size=4),
    }
)


@st.composite
def call_rows(draw: Any, messages_key: str, metadata: bool = False) -> list[Any]:
    """Rows of a trace, mostly right: each session's history grows call by call (now and then it is
    rewritten, which splits the session), and about one row in five is broken in one key or replaced
    by any JSON value. `metadata`: sammshen's re-shaped sample ({messages, metadata: {session_id}})."""
    histories: dict[str, list[dict[str, Any]]] = {}
    rows: list[Any] = []
    for _ in range(draw(st.integers(0, 8))):
        sid = draw(st.sampled_from(["a", "b", "c"]))
        history = [] if draw(st.integers(0, 3)) == 0 else histories.get(sid, [])
        history = [*history, *draw(st.lists(message, min_size=1, max_size=2))]
        histories[sid] = history
        row: dict[str, Any] = {"session_id": sid, messages_key: history}
        if draw(st.booleans()):
            row["output_length"] = draw(st.integers(0, 500))
        if not metadata and draw(st.booleans()):
            row["pre_gap"] = draw(st.floats(0, 10))
        if draw(st.integers(0, 4)) == 0:
            broken = draw(st.sampled_from(["session_id", messages_key, "output_length", "pre_gap", "row"]))
            if broken == "row":
                rows.append(draw(json_values))
                continue
            row[broken] = draw(json_values | st.integers(-3, -1) | st.floats())
        if metadata:
            meta = {k: row.pop(k) for k in ("session_id", "output_length") if k in row}
            row = {"model": "m", "messages": row.pop(messages_key), **row, "metadata": meta}
        rows.append(row)
    return rows


def _check_sessions(sessions: list[Session], code: str) -> None:
    assert sessions
    assert len({s.session_id for s in sessions}) == len(sessions)
    for session in sessions:
        assert session.calls
        for i, call in enumerate(session.calls):
            assert call.index == i and call.session_id == session.session_id
            assert call.messages
            assert all(isinstance(m, dict) and isinstance(m["role"], str) for m in call.messages)
            assert call.output_length is None or call.output_length >= 0
            assert math.isfinite(call.pre_gap) and call.pre_gap >= 0
        for previous, current in zip(session.calls, session.calls[1:], strict=False):
            assert extends(previous, current)
    by_session = {s.session_id: s for s in sessions}
    for rounds in (1, 2, 5):
        users = virtual_users(sessions, code, rounds)
        if rounds < chunk_floor(code):
            assert users == []
            continue
        assert len(users) == sum(len(s.calls) // rounds for s in sessions)
        for user in users:
            assert len(user.calls) == rounds
            chunk = by_session[user.session_id].calls[user.chunk * rounds : (user.chunk + 1) * rounds]
            assert user.calls == chunk


def _load_or_refuse(code: str, name: str, data: bytes, note: bool = True) -> list[Session] | None:
    """Load `data` written as `name`; None when the loader refused it with its own error naming the
    file. `note`: count loaded / refused examples (only inside a property)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        try:
            sessions = load_dataset(code, path)
        except UserError as exc:
            assert str(exc).startswith(str(path)), exc
            if note:
                event("refused")
            return None
    if note:
        event("loaded")
    _check_sessions(sessions, code)
    return sessions


def _jsonl(rows: list[Any]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _line_of(source: str) -> int:
    return int(source.rsplit(" ", 1)[1])  # "calls.jsonl:line 7"


@PROPERTIES
@given(call_rows("messages"))
def test_generic_rows_load_in_order_or_are_refused(rows: list[Any]) -> None:
    sessions = _load_or_refuse("generic", "calls.jsonl", _jsonl(rows))
    if sessions is not None:
        # every line is one call, and a session keeps the file order of its lines
        lines = [[_line_of(c.source) for c in s.calls] for s in sessions]
        assert all(session == sorted(session) for session in lines)
        assert sorted(n for session in lines for n in session) == list(range(1, len(rows) + 1))


@PROPERTIES
@given(call_rows("input") | call_rows("input", metadata=True))
def test_sammshen_rows_load_or_are_refused(rows: list[Any]) -> None:
    sessions = _load_or_refuse("sammshen", "trace.jsonl", _jsonl(rows))
    if sessions is not None:
        assert sum(len(s.calls) for s in sessions) == len(rows)


def _valid_generic(sessions: int = 2, calls: int = 6) -> bytes:
    lines = generic_lines(sessions, calls, output_length=4)
    return ("\n".join(lines) + "\n").encode()


@st.composite
def byte_mutations(draw: Any, data: bytes) -> bytes:
    """`data` with a few bytes flipped, cut or inserted, cut short, or a line written twice."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not out:
            break
        at = draw(st.integers(0, len(out) - 1))
        kind = draw(st.sampled_from(["flip", "cut", "insert", "truncate", "duplicate-line"]))
        if kind == "flip":
            out[at] = draw(st.integers(0, 255))
        elif kind == "cut":
            del out[at : at + draw(st.integers(1, 20))]
        elif kind == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=6))
        elif kind == "truncate":
            del out[at:]
        else:
            start = out.rfind(b"\n", 0, at) + 1
            end = out.find(b"\n", at)
            out[start:start] = out[start : (end if end >= 0 else len(out))] + b"\n"
    return bytes(out)


@PROPERTIES
@given(byte_mutations(_valid_generic()))
def test_mutated_generic_bytes_load_or_name_the_line(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "calls.jsonl"
        path.write_bytes(data)
        try:
            sessions = load_dataset("generic", path)
        except UserError as exc:
            assert re.match(re.escape(str(path)) + r": (line \d+|file|no sessions)", str(exc)), exc
            event("refused")
            return
    event("loaded")
    _check_sessions(sessions, "generic")


@PROPERTIES
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_arbitrary_bytes_never_crash_a_loader(data: bytes) -> None:
    for code, name in (("generic", "x.jsonl"), ("sammshen", "x.jsonl"), ("tau2-bench-v1", "x.json")):
        _load_or_refuse(code, name, data)


def tau2_doc(calls: int = 4) -> dict[str, Any]:
    greeting = {"role": "assistant", "content": "Hi!", "timestamp": "2025-01-01T00:00:00"}
    history: list[dict[str, Any]] = [greeting]
    for c in range(calls):
        history += [
            {"role": "user", "content": f"ask {c}", "timestamp": f"2025-01-01T00:00:{2 * c + 1:02d}"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"t{c}", "name": "lookup", "arguments": {"q": c}}],
                "usage": {"completion_tokens": 5},
                "timestamp": f"2025-01-01T00:00:{2 * c + 2:02d}",
            },
            {"role": "tool", "id": f"t{c}", "content": "found", "requestor": "assistant"},
        ]
    return {
        "info": {"environment_info": {"domain_name": "retail", "policy": "Policy text."}},
        "simulations": [{"id": "1", "messages": history}, {"id": "2", "messages": history[:5]}],
    }


ODD_VALUES = st.sampled_from(["0001-01-01T00:00:00+14:00", "not a time", -1, None, [], {}, "user"])


def _mutate(doc: Any, draw: Callable[[Any], Any]) -> Any:
    """Replace one subtree of `doc` (chosen by walking down from the root) with another value."""
    if isinstance(doc, dict) and doc and draw(st.integers(0, 3)):
        key = draw(st.sampled_from(sorted(doc)))
        return {**doc, key: _mutate(doc[key], draw)}
    if isinstance(doc, list) and doc and draw(st.integers(0, 3)):
        i = draw(st.integers(0, len(doc) - 1))
        return [*doc[:i], _mutate(doc[i], draw), *doc[i + 1 :]]
    return draw(json_values | ODD_VALUES)


@PROPERTIES
@given(st.data())
def test_mutated_tau2_documents_load_or_are_refused(data: st.DataObject) -> None:
    doc = tau2_doc()
    for _ in range(data.draw(st.integers(1, 3))):
        doc = _mutate(doc, data.draw)
    sessions = _load_or_refuse("tau2-bench-v1", "results.json", json.dumps(doc).encode())
    if sessions is not None:
        for session in sessions:
            for call in session.calls:
                assert call.messages[0]["role"] == "system"
                assert all(m["role"] in ("system", "user", "assistant", "tool") for m in call.messages)


def test_the_unmutated_documents_load() -> None:
    """The properties start from documents that load, so refusals come from the mutations."""
    tau2 = _load_or_refuse("tau2-bench-v1", "results.json", json.dumps(tau2_doc()).encode(), note=False)
    assert tau2 is not None and [len(s.calls) for s in tau2] == [4, 1]
    generic = _load_or_refuse("generic", "calls.jsonl", _valid_generic(), note=False)
    assert generic is not None and [len(s.calls) for s in generic] == [6, 6]
