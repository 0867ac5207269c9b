"""What a finished replay amounts to: the exit status of `kvoffload-lab replay` and its one-line verdict.

The one place that defines the exit codes. The CLI returns them and lists them in `--help`; the replay
role (roles/replay/vars/main.yml) treats `OK` and `SOME_FAILED` as a completed cell and fails the task
on the others; docs/contracts.md documents them. Pure: reads `SessionCounts`, no IO.
"""

from __future__ import annotations

from enum import IntEnum

from kvoffload.replay.records import SessionCounts


class ExitCode(IntEnum):
    """Exit statuses of `kvoffload-lab replay`."""

    OK = 0
    BAD_INPUT = 2
    SOME_FAILED = 3
    ALL_FAILED = 4
    STALLED = 5
    RESULTS_UNWRITABLE = 6
    INTERRUPTED = 130


MEANING: dict[ExitCode, str] = {
    ExitCode.OK: "every request succeeded",
    ExitCode.BAD_INPUT: "bad input (a flag, the dataset, --output); nothing was sent",
    ExitCode.SOME_FAILED: "some requests failed or a session raised; the replay ran to its end and "
    "sessions.json counts them",
    ExitCode.ALL_FAILED: "every request failed, or none could be sent (every warm-up failed)",
    ExitCode.STALLED: "stopped by the stall watchdog (--stall-timeout): requests were in flight and "
    "nothing arrived",
    ExitCode.RESULTS_UNWRITABLE: "the results could not be written (a full disk?); requests.jsonl holds "
    "whole records only",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C, SIGTERM); finished records are kept",
}

# The codes after which the cell's results are complete (its failures are counted, not missing).
COMPLETED = (ExitCode.OK, ExitCode.SOME_FAILED)


def exit_code(counts: SessionCounts) -> ExitCode:
    """The exit status a replay that ended with `counts` returns."""
    if counts.interrupted:
        return ExitCode.INTERRUPTED
    if counts.stopped_by == "stall":
        return ExitCode.STALLED
    if counts.stopped_by == "results":
        return ExitCode.RESULTS_UNWRITABLE
    if counts.ok_requests == 0:
        return ExitCode.ALL_FAILED
    if counts.failed_requests or counts.error:
        return ExitCode.SOME_FAILED
    return ExitCode.OK


def verdict(counts: SessionCounts) -> str | None:
    """The line that explains a non-zero exit status (None for OK): the last line the CLI prints."""
    code = exit_code(counts)
    first = f"; first: {counts.first_error}" if counts.first_error else ""
    if code is ExitCode.OK:
        return None
    if code is ExitCode.INTERRUPTED:
        return "replay interrupted; the records written so far are kept"
    if code is ExitCode.STALLED:
        return f"replay stalled: {counts.stop_reason}"
    if code is ExitCode.RESULTS_UNWRITABLE:
        return f"replay stopped: {counts.stop_reason}"
    if code is ExitCode.ALL_FAILED:
        if counts.stopped_by == "warmup":
            return f"replay failed: {counts.stop_reason}"
        if counts.requests == 0:
            return f"replay failed: no request could be sent ({counts.error} error sessions){first}"
        return f"replay failed: every request failed ({counts.failed_requests} of {counts.requests}){first}"
    return (
        f"replay completed with failures: {counts.failed_requests} of {counts.requests} requests failed, "
        f"{counts.error} error sessions{first}"
    )
