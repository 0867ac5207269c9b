"""Malformed `kvoffload-lab replay` flags: exit 2 with argparse's message naming the flag, no traceback,
and no server contacted (--base-url points at a socket this test listens on; nothing may connect).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvoffload.cli.main import main
from tests.unit.replay.loopback import generic_dataset

# (flag, value, what the message must say); PORT is the listening socket's port, DATA the dataset's
# folder, TMP the test's own folder.
CASES: list[tuple[str, str, str]] = [
    ("--warmup", "-3", "greater than or equal to 0, got -3"),
    ("--warmup", "1.5", "must be an integer, got 1.5"),
    ("--warmup", "100000", "less than or equal to 1024"),
    ("--workers", "-1", "greater than or equal to 0, got -1"),
    ("--workers", "1000", "less than or equal to 256"),
    ("--duration", "-1", "must be a positive integer, got -1"),
    ("--duration", "0", "must be a positive integer, got 0"),
    ("--duration", "soon", "must be an integer, got 'soon'"),
    ("--concurrency", "0", "must be a positive integer, got 0"),
    ("--concurrency", "two", "must be an integer, got 'two'"),
    ("--concurrency", "2.5", "must be an integer, got 2.5"),
    ("--num-rounds", "-5", "must be a positive integer, got -5"),
    ("--num-rounds", "3", "3 is below the minimum chunk length 5 of --dataset-code generic"),
    ("--isl", "0", "must be a positive integer, got 0"),
    ("--osl", "0", "must be 'recorded' or a positive integer, got 0"),
    ("--osl", "recoded", "must be 'recorded' or a positive integer, got 'recoded'"),
    ("--max-sessions", "-2", "must be a positive integer, got -2"),
    ("--min-chunk-rounds", "0", "must be a positive integer, got 0"),
    ("--agentic-max-attempts", "0", "must be a positive integer, got 0"),
    ("--request-timeout", "0", "must be a positive number of seconds, got '0'"),
    ("--request-timeout", "nan", "must be a positive number of seconds, got 'nan'"),
    ("--request-timeout", "-64800", "must be a positive number of seconds"),
    ("--stall-timeout", "-1", "must be 0 (off) or a positive number of seconds, got '-1'"),
    ("--stall-timeout", "inf", "must be 0 (off) or a positive number of seconds, got 'inf'"),
    ("--base-url", "127.0.0.1:PORT", "must be an http:// or https:// URL with a host"),
    ("--base-url", "localhost:PORT", "must be an http:// or https:// URL with a host"),
    ("--base-url", "ftp://127.0.0.1:PORT", "must be an http:// or https:// URL with a host"),
    ("--base-url", "http://", "must be an http:// or https:// URL with a host"),
    ("--base-url", "http://127.0.0.1:99999", "port 99999 is out of range"),
    ("--base-url", "http://127.0.0.1:PORT/v1?model=m", "must not carry a query or a fragment"),
    ("--model", "", "String should have at least 1 character"),
    ("--dataset-code", "sharegpt", "unknown dataset code 'sharegpt': choose one of"),
    ("--dataset", "TMP/missing.jsonl", "TMP/missing.jsonl: no such file or folder"),
    ("--dataset", "", "must not be empty"),
    ("--output", "DATA", "exists and is not a folder"),
    ("--output", "TMP/used", "TMP/used/requests.jsonl already holds records"),
]


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A loopback socket that accepts connections (the kernel completes them without accept())."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        yield sock


def _connections(sock: socket.socket) -> int:
    n = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return n
        conn.close()
        n += 1


def _argv(port: int, data: Path, out: Path, *, drop: str = "") -> list[str]:
    """A good replay command line (without `drop` and its value)."""
    flags = {
        "--base-url": f"http://127.0.0.1:{port}",
        "--model": "m",
        "--dataset-code": "generic",
        "--dataset": str(data),
        "--concurrency": "2",
        "--num-rounds": "5",
        "--output": str(out),
    }
    return ["replay", *(x for flag, value in flags.items() if flag != drop for x in (flag, value))]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse
        rc = int(exc.code or 0)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value", "says"), CASES, ids=[f"{f} {v}" for f, v, _ in CASES])
def test_bad_flag_exits_2_naming_it_and_sends_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    listener: socket.socket,
    flag: str,
    value: str,
    says: str,
) -> None:
    data = generic_dataset(tmp_path / "data.jsonl")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "requests.jsonl").write_text('{"schema": 1}\n')
    port = listener.getsockname()[1]

    def fill(text: str) -> str:
        return text.replace("PORT", str(port)).replace("DATA", str(data)).replace("TMP", str(tmp_path))

    rc, err = _run([*_argv(port, data, tmp_path / "out"), fill(flag), fill(value)], capsys)
    assert rc == 2, err
    assert f"argument {flag}: " in err, err
    assert fill(says) in err, err
    assert "Traceback" not in err
    assert _connections(listener) == 0
    assert not (tmp_path / "out").exists()  # nothing written either


def test_a_required_flag_left_out_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], listener: socket.socket
) -> None:
    data = generic_dataset(tmp_path / "data.jsonl")
    port = listener.getsockname()[1]
    rc, err = _run(_argv(port, data, tmp_path / "out", drop="--concurrency"), capsys)
    assert rc == 2
    assert "the following arguments are required: --concurrency" in err
    assert "Traceback" not in err
    assert _connections(listener) == 0


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file: permissions cannot be tested")
def test_an_unreadable_dataset_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], listener: socket.socket
) -> None:
    data = generic_dataset(tmp_path / "data.jsonl")
    data.chmod(0)
    rc, err = _run(_argv(listener.getsockname()[1], data, tmp_path / "out"), capsys)
    assert rc == 2
    assert f"argument --dataset: {data}: not readable" in err
    assert _connections(listener) == 0


def test_the_listener_would_see_a_connection(listener: socket.socket) -> None:
    """The check above can fail: a connection to the listener is counted."""
    port = listener.getsockname()[1]
    with socket.create_connection(("127.0.0.1", port), timeout=10):
        pass
    assert _connections(listener) == 1
