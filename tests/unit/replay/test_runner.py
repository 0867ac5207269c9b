"""The runner never fails silently: a raising user, a stalled server, failed warm-ups, recorded gaps."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kvoffload.datasets import Call, VirtualUser
from kvoffload.replay import runner as runner_module
from kvoffload.replay.outcome import ExitCode, exit_code
from kvoffload.replay.records import SessionCounts
from kvoffload.replay.requests import RequestOptions, build_payload
from kvoffload.replay.runner import ReplayConfig, ReplayRunner
from tests.unit.replay.loopback import HANG_S, records, serving, sessions, sse_app, users

GUARD_S = 60.0  # a hang guard only: every scenario ends in well under a second or two


def _replay(out: Path, pool: tuple[VirtualUser, ...], app: Any, **options: Any) -> SessionCounts:
    """Run a replay of `pool` (warm-ups off unless asked) against `app` served on loopback."""

    async def scenario() -> SessionCounts:
        async with serving(app) as url:
            config = ReplayConfig(
                base_url=url,
                concurrency=options.pop("concurrency", 2),
                num_rounds=len(pool[0].calls),
                output=out,
                request=RequestOptions(model="m"),
                warmup=options.pop("warmup", 0),
                **options,
            )
            counts = SessionCounts(
                requested_concurrency=config.concurrency,
                num_rounds=config.num_rounds,
                virtual_users_available=len(pool),
            )
            return await asyncio.wait_for(ReplayRunner(config, pool, counts).run(), GUARD_S)

    return asyncio.run(scenario())


def test_a_user_that_raises_is_an_error_session_and_its_slot_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:

    def build(call: Call, opts: RequestOptions) -> dict[str, Any]:
        if call.session_id == "s1":
            raise ValueError("cannot build this request")
        return build_payload(call, opts)

    monkeypatch.setattr("kvoffload.replay.runner.build_payload", build)
    out = tmp_path / "out"
    # One slot: the users after the one that raises must still be replayed by that same slot.
    with caplog.at_level(logging.ERROR, logger="kvoffload.replay.runner"):
        counts = _replay(out, users(3, 2), sse_app(), concurrency=1)

    assert (counts.achieved_sessions, counts.complete, counts.error, counts.exceptions) == (3, 2, 1, 1)
    assert (counts.requests, counts.failed_requests) == (4, 0)
    assert counts.first_error == "ValueError: cannot build this request"
    assert sorted({str(r["user_id"]) for r in records(out)}) == ["s0:0", "s2:0"]
    assert sessions(out)["error"] == 1 and sessions(out)["exceptions"] == 1
    logged = [r for r in caplog.records if "s1:0" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None  # with its traceback
    assert logged[0].exc_info[0] is ValueError
    assert exit_code(counts) is ExitCode.SOME_FAILED


def test_every_user_raising_is_a_run_with_nothing_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def build(call: Call, opts: RequestOptions) -> dict[str, Any]:
        raise KeyError("messages")

    monkeypatch.setattr("kvoffload.replay.runner.build_payload", build)
    counts = _replay(tmp_path / "out", users(3, 2), sse_app())
    assert (counts.error, counts.exceptions, counts.complete, counts.requests) == (3, 3, 0, 0)
    assert exit_code(counts) is ExitCode.ALL_FAILED


def test_a_stalled_server_stops_the_run_and_in_flight_requests_are_recorded_failed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # Role chunk, then nothing: both slots' first requests hang; three attempts allowed, none retried.
    counts = _replay(
        out, users(3, 4), sse_app(ttft=HANG_S), concurrency=2, stall_timeout_s=0.3, max_attempts=3
    )

    assert counts.stopped_by == "stall"
    assert counts.stop_reason is not None and "for 0.3 s" in counts.stop_reason
    assert "2 requests in flight" in counts.stop_reason
    recs = records(out)
    assert [(r["round"], r["status"], r["error"]) for r in recs] == [(1, "timeout", counts.stop_reason)] * 2
    assert (counts.achieved_sessions, counts.error, counts.failed_requests) == (2, 2, 2)  # 3rd never started
    on_disk = sessions(out)
    assert on_disk["stopped_by"] == "stall" and on_disk["stop_reason"] == counts.stop_reason
    assert exit_code(counts) is ExitCode.STALLED


def test_a_stall_during_the_warmups_stops_before_the_replay(tmp_path: Path) -> None:
    out = tmp_path / "out"
    counts = _replay(out, users(2, 2), sse_app(ttft=HANG_S), warmup=2, stall_timeout_s=0.3)
    assert counts.stopped_by == "stall" and counts.requests == 0 and counts.achieved_sessions == 0
    assert sessions(out)["stopped_by"] == "stall"
    assert records(out) == []
    assert exit_code(counts) is ExitCode.STALLED


def test_recorded_think_gaps_never_count_as_a_stall(tmp_path: Path) -> None:
    """Gaps three times the stall timeout with nothing in flight: the run completes untouched."""
    out = tmp_path / "out"
    counts = _replay(
        out, users(1, 3, pre_gap=1.5), sse_app(), concurrency=1, honor_gaps=True, stall_timeout_s=0.5
    )
    assert counts.stopped_by == "pool" and counts.stop_reason is None
    assert (counts.complete, counts.requests, counts.failed_requests) == (1, 3, 0)
    assert counts.duration_s >= 3.0  # the two gaps were really waited out
    assert exit_code(counts) is ExitCode.OK


def test_a_zero_stall_timeout_disables_the_watchdog(tmp_path: Path) -> None:
    out = tmp_path / "out"
    counts = _replay(out, users(1, 2), sse_app(ttft=HANG_S), stall_timeout_s=0.0, request_timeout_s=1.0)
    assert counts.stopped_by == "pool"
    assert [(r["status"], r["error"]) for r in records(out)] == [("timeout", "no complete answer within 1 s")]
    assert exit_code(counts) is ExitCode.ALL_FAILED


def test_failed_warmups_are_written_to_sessions_json_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "WARMUP_PAUSE_S", 0.01)
    out = tmp_path / "out"
    counts = _replay(out, users(2, 2), sse_app(fail_user="warmup-"), warmup=2)
    assert counts.stopped_by == "warmup" and counts.requests == 0
    assert counts.stop_reason is not None
    said = "all 2 warm-up requests failed in each of 3 rounds (HTTP 500: injected failure)"
    assert said in counts.stop_reason
    assert sessions(out)["stop_reason"] == counts.stop_reason
    assert exit_code(counts) is ExitCode.ALL_FAILED


def test_a_duration_stop_cuts_a_recorded_gap_short(tmp_path: Path) -> None:
    """A user waiting out a long gap when --duration ends the run does not hold the run for the gap."""
    out = tmp_path / "out"
    counts = _replay(
        out, users(1, 2, pre_gap=HANG_S), sse_app(), concurrency=1, honor_gaps=True, duration_s=0.3
    )
    assert counts.stopped_by == "duration"
    assert (counts.incomplete, counts.requests) == (1, 1)


class _FillingDisk:
    """os.write that takes `room` bytes in all, then writes part of a buffer and fails with ENOSPC."""

    def __init__(self, room: int) -> None:
        import os

        self.room = room
        self.real = os.write

    def __call__(self, fd: int, data: bytes) -> int:
        import errno
        import os

        if len(data) <= self.room:
            self.room -= len(data)
            return int(self.real(fd, data))
        if self.room:
            self.real(fd, data[: self.room])  # half a line reaches the file, as on a real device
            self.room = 0
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_leaves_whole_records_and_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _FillingDisk(room=1500)  # a few records, then the device is full mid-line
    monkeypatch.setattr("kvoffload.replay.records.os.write", disk)
    out = tmp_path / "out"
    counts = _replay(out, users(6, 3), sse_app(), concurrency=2)
    assert counts.stopped_by == "results"
    assert counts.stop_reason is not None and "No space left on device" in counts.stop_reason
    assert str(out / "requests.jsonl") in counts.stop_reason
    assert exit_code(counts) is ExitCode.RESULTS_UNWRITABLE
    text = (out / "requests.jsonl").read_text()
    assert text and text.endswith("\n")
    kept = records(out)  # every line parses: the half-written one was truncated away
    assert 0 < len(kept) < 18 and counts.requests == len(kept)
    assert sessions(out)["stopped_by"] == "results"  # sessions.json still written (rename, no os.write)


def test_record_log_undoes_a_short_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvoffload.replay.records import RecordLog, RequestRecord, ResultsUnwritable

    def record(i: int) -> RequestRecord:
        return RequestRecord(user_id=f"u{i}", session_id="s", chunk=0, round=i, request_id=str(i),
                             t_start=0.0, ttft_s=0.1, latency_s=0.2, tpot_s=0.01, prompt_tokens=10,
                             completion_tokens=2, cached_tokens=0, status="ok", http_status=200,
                             error=None, replica="r0", ttft_clock="kernel", late_s=None)  # fmt: skip

    path = tmp_path / "requests.jsonl"
    with RecordLog(path) as log_:
        log_.append(record(1))
        size = path.stat().st_size
        monkeypatch.setattr("kvoffload.replay.records.os.write", _FillingDisk(room=10))
        with pytest.raises(ResultsUnwritable, match="No space left on device"):
            log_.append(record(2))
        assert path.stat().st_size == size
        monkeypatch.undo()
        log_.append(record(3))  # room again: appending goes on after the last whole line
    assert [r.split('"round":')[1][0] for r in path.read_text().splitlines()] == ["1", "3"]


def test_read_time_stamps_are_recorded_and_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A client without kernel stamps (as through a proxy): every record says so, the log says it once."""
    import httpx

    def plain(*, limits: httpx.Limits, timeout: httpx.Timeout) -> httpx.AsyncClient:
        return httpx.AsyncClient(limits=limits, timeout=timeout)

    monkeypatch.setattr("kvoffload.replay.runner.stamped_client", plain)
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="kvoffload.replay.runner"):
        counts = _replay(out, users(2, 2), sse_app())
    kept = records(out)
    assert counts.requests == len(kept) == 4
    assert {(r["ttft_clock"], r["late_s"]) for r in kept} == {("read", None)}
    said = [r.getMessage() for r in caplog.records if "read-time" in r.getMessage()]
    assert len(said) == 2  # the first one, then the run's total
    assert said[-1].startswith("4 of 4 ok requests")


def _settling_app(failing_warmups: int, mode: str) -> tuple[web.Application, list[dict[str, Any]]]:
    """A vLLM-like server whose first `failing_warmups` warm-ups answer 200 and then fail in the
    stream: an error event (mode "event", what vLLM 0.32 streams when the engine fails a request,
    e.g. a KV load under kv_load_failure_policy fail), end tokenless (mode "eos") or end before
    [DONE] (mode "cut")."""
    bodies: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bodies.append(body)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        base = {"id": "chatcmpl-t", "object": "chat.completion.chunk", "model": body["model"]}
        role = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        lines = [role]
        warmups = sum(1 for b in bodies if "warm-up" in b["messages"][0]["content"])
        failing = "warm-up" in body["messages"][0]["content"] and warmups <= failing_warmups
        if failing and mode == "event":
            lines.append({"error": {"message": "KV load failed", "type": "InternalServerError", "code": 500}})
        elif failing:
            stop = {**base, "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop"}]}
            lines += [stop, {**base, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1}}]
        else:
            tok = {**base, "choices": [{"index": 0, "delta": {"content": " a"}, "finish_reason": "length"}]}
            lines += [tok, {**base, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1}}]
        if failing and mode == "cut":
            lines = lines[:1]  # the role chunk, and the body ends: a proxy or a server cut it
        for line in lines:
            await resp.write(f"data: {json.dumps(line)}\n\n".encode())
        if not (failing and mode == "cut"):
            await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app, bodies


@pytest.mark.parametrize("mode", ["event", "eos", "cut"])
def test_a_warmup_round_that_fails_in_the_stream_is_repeated_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setattr(runner_module, "WARMUP_PAUSE_S", 0.01)
    app, bodies = _settling_app(failing_warmups=2, mode=mode)
    counts = _replay(tmp_path / "out", users(2, 2), app, warmup=2)
    assert counts.stopped_by == "pool" and counts.requests == 4 and counts.failed_requests == 0
    # One failed round (both of its warm-ups), then a round that answered.
    assert len(counts.warmup_errors) == 1
    said = "error event in the stream: KV load failed (InternalServerError)"
    if mode == "eos":
        said = "stream ended without a token (1 completion tokens, none with text; finish_reason 'stop')"
    if mode == "cut":
        said = "the stream ended before [DONE] without a token (cut by the server or a proxy)"
    assert counts.warmup_errors[0] == f"HTTP 200: {said}"
    assert sessions(tmp_path / "out")["warmup_errors"] == counts.warmup_errors
    # Warm-ups ask ignore_eos as the replayed requests do.
    assert all(b.get("ignore_eos") is True for b in bodies)


def test_warmups_that_keep_failing_stop_after_the_last_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "WARMUP_PAUSE_S", 0.01)
    app, bodies = _settling_app(failing_warmups=100, mode="event")
    counts = _replay(tmp_path / "out", users(2, 2), app, warmup=2)
    assert counts.stopped_by == "warmup" and counts.requests == 0
    assert len(counts.warmup_errors) == runner_module.WARMUP_ROUNDS == len(bodies) // 2
    assert counts.stop_reason is not None
    assert f"in each of {runner_module.WARMUP_ROUNDS} rounds (HTTP 200: error event" in counts.stop_reason


def test_warmups_that_reach_no_server_are_not_repeated(tmp_path: Path) -> None:
    async def scenario() -> SessionCounts:
        config = ReplayConfig(
            base_url="http://127.0.0.1:9",  # discard: nothing listens
            concurrency=1,
            num_rounds=1,
            output=tmp_path / "out",
            request=RequestOptions(model="m"),
            warmup=2,
        )
        counts = SessionCounts(requested_concurrency=1, num_rounds=1, virtual_users_available=1)
        return await asyncio.wait_for(ReplayRunner(config, users(1, 1), counts).run(), GUARD_S)

    counts = asyncio.run(scenario())
    assert counts.stopped_by == "warmup" and len(counts.warmup_errors) == 1
    assert "ConnectError" in counts.warmup_errors[0]
