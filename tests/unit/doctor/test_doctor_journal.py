"""The first error line of an engine's journal (kvoffload/doctor/journal.py), on lines in the formats
vLLM 0.32, LMCache 0.5.6, Python and systemd write them."""

from __future__ import annotations

from kvoffload.doctor.journal import MAX_CHARS, first_error_line, last_words

# `journalctl --output short-iso` of a replica whose engine core failed to start (vLLM's own format)
_AT = "2026-12-05T08:00:31+0000 lab-r1"
VLLM = "".join(
    f"{_AT} {line}\n"
    for line in (
        "systemd[1]: Started kvoffload-vllm@0.service - kvoffload-lab vLLM replica 0.",
        "python[812]: INFO 12-05 08:00:09 [api_server.py:1885] vLLM API server version 0.32.0",
        "python[812]: WARNING 12-05 08:00:20 [cpu.py:211] Pin memory is not supported on CPU.",
        "python[901]: (EngineCore_DP0 pid=901) ERROR 12-05 08:00:31 [core.py:866] EngineCore failed to "
        "start.",
        "python[901]: (EngineCore_DP0 pid=901) Traceback (most recent call last):",
        "python[901]: ValueError: No available memory for the cache blocks.",
        "python[812]: RuntimeError: Engine core initialization failed. See root cause above.",
        "systemd[1]: kvoffload-vllm@0.service: Main process exited, code=exited, status=1/FAILURE",
    )
)


def test_the_first_error_level_line_wins() -> None:
    assert first_error_line(VLLM) == (
        "(EngineCore_DP0 pid=901) ERROR 12-05 08:00:31 [core.py:866] EngineCore failed to start."
    )


def test_without_an_error_level_line_the_first_exception_line() -> None:
    text = VLLM.replace(") ERROR 12-05", ") INFO 12-05")
    assert first_error_line(text) == "ValueError: No available memory for the cache blocks."


def test_lmcache_colours_are_dropped() -> None:
    line = (
        "\x1b[31;20m[2026-12-05 07:54:48,496] LMCache ERROR:\x1b[0m Failed to allocate L1 memory "
        "\x1b[3m(l1_manager.py:88:lmcache.v1.distributed.l1_manager)\x1b[0m"
    )
    assert first_error_line(f"INFO ok\n{line}\n") == (
        "[2026-12-05 07:54:48,496] LMCache ERROR: Failed to allocate L1 memory "
        "(l1_manager.py:88:lmcache.v1.distributed.l1_manager)"
    )


def test_nothing_at_error_level_is_none_and_long_lines_are_cut() -> None:
    assert first_error_line("INFO started\nWARNING slow\n") is None
    long = "ERROR " + "x" * 500
    found = first_error_line(long)
    assert found is not None and len(found) == MAX_CHARS and found.endswith("...")
    # "ERROR" inside a word is no level
    assert first_error_line("INFO TERRORS_total rose\n") is None


def test_the_last_words_leave_systemds_lines_out() -> None:
    text = (
        "INFO Supported transfer mode: auto\n"
        "Address family not supported by protocol (src/ip_resolver.cpp:542)\n"
        "kvoffload-doctor-pair-server-ab.service: Main process exited, code=killed, status=6/ABRT\n"
        "kvoffload-doctor-pair-server-ab.service: Failed with result 'signal'.\n"
    )
    assert last_words(text, "kvoffload-doctor-pair-server-ab.service") == (
        "Address family not supported by protocol (src/ip_resolver.cpp:542)"
    )
    assert last_words("", "x.service") is None
