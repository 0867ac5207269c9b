"""kvoffload/playbook/runner.py: what a failed task's message keeps for the cell's error (its first
line, and the end of a unit's journal that kvoffload_start_units quotes after it)."""

from __future__ import annotations

from kvoffload.playbook.runner import MESSAGE_LINE_CHARS, MESSAGE_TAIL_LINES, _message


def test_a_one_line_message_is_cut_at_its_head_and_stderr_adds_its_last_line() -> None:
    res = {"msg": "non-zero return code " + "x" * 1000, "stderr": "one\ntwo: the reason"}
    head, stderr = _message(res).split(": stderr: ")
    assert head == ("non-zero return code " + "x" * 1000)[:400]
    assert stderr == "two: the reason"


def test_the_journal_after_the_first_line_keeps_its_last_lines() -> None:
    journal = [f"line {i} " + "y" * 500 for i in range(30)]
    msg = "systemctl start exited 1: Job for kvoffload-caddy.service failed\n" + "\n".join(journal)
    lines = _message({"msg": msg}).splitlines()
    assert lines[0] == "systemctl start exited 1: Job for kvoffload-caddy.service failed"
    assert lines[1] == "..."  # lines left out say so
    assert [line.split(" y")[0] for line in lines[2:]] == [
        f"line {i}" for i in range(30 - MESSAGE_TAIL_LINES, 30)
    ]
    assert all(len(line) == MESSAGE_LINE_CHARS for line in lines[2:])


def test_a_short_message_stays_whole() -> None:
    assert _message({"msg": "a\nb"}) == "a\nb"
    assert _message({}) == "no message"
