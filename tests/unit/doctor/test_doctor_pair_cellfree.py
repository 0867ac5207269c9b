"""The cell-free pair check's verdict (kvoffload/doctor/pair_cellfree.py) on the node script's answers
recorded on a systemd host with the real LMCache 0.5.6 CPU build (tests/fixtures/doctor/README.md), and
on those answers changed by one fact: a retrieved chunk that differs, a renamed metric, a module that
did not load, a gpu-mode run."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvoffload.analysis import names as N
from kvoffload.doctor import pair_cellfree as pc
from kvoffload.doctor.checks import Check, Status

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "doctor" / "pair-cellfree"


def _ok() -> dict[str, Any]:
    facts: dict[str, Any] = json.loads((FIXTURES / "cpu-l2-ok.json").read_text())
    return facts


def _edit_stdout(facts: dict[str, Any], run: int, old: str, new: str) -> dict[str, Any]:
    out = copy.deepcopy(facts)
    stdout = out["passes"][run]["stdout"]
    assert stdout.count(old) >= 1, old
    out["passes"][run]["stdout"] = stdout.replace(old, new, 1)
    return out


def _failed(facts: dict[str, Any], *said: str) -> Check:
    """The verdict on `facts`, asserted a failure whose detail says each of `said`."""
    check = pc.judge(facts)
    assert check.status == Status.FAIL, check.detail
    for words in said:
        assert words in check.detail, check.detail
    return check


def test_the_recorded_cpu_run_is_ok_byte_exact_through_l1_and_l2() -> None:
    check = pc.judge(_ok())
    assert check.status == Status.OK, check.detail
    parts = check.facts["parts"]
    assert (
        parts["store_retrieve_l1"]
        == "ok: 2 sequences x 4 chunks stored and retrieved byte-exact (MD5 per chunk)"
    )
    assert parts["store_retrieve_l2"].startswith(
        "ok: after L1 was emptied the same KV came back byte-exact from L2"
    )
    assert parts["compiled_ops"] == "ok: LMCache's lmcache_fs, lmcache_native loaded in the sandboxed server"
    assert parts["metric_names"].startswith("ok: ") and parts["sandboxed_units"].startswith("ok: ")
    assert check.facts["byte_exact"] is True and check.facts["mode"] == "cpu"
    # what only a GPU shows is said to be not exercised, in the facts and the detail, never ok
    assert {parts[p] for p in pc.GPU_PARTS} == {"not exercised on a CPU build"}
    assert (
        "not exercised on a CPU build: CUDA init in both sandboxed units, CUDA IPC between the two units"
        in (check.detail)
    )
    assert (
        check.facts["applied"]["NoNewPrivileges"] == "yes"
        and check.facts["applied"]["LimitMEMLOCK"] == "infinity"
    )


def test_the_bench_output_is_read_per_sequence() -> None:
    first, second = (pc.parse_bench(p) for p in _ok()["passes"])
    assert first.digests == {
        (0, "cold"): "c66822ad0985fd20",
        (0, "warm"): "c66822ad0985fd20",
        (1, "cold"): "8757caaad79e69b9",
        (1, "warm"): "8757caaad79e69b9",
    }
    assert first.matched == {0: True, 1: True} and first.registered and first.device == "cpu"
    assert first.lookups == {
        (0, "cold"): (0, 4),
        (0, "warm"): (4, 4),
        (1, "cold"): (0, 4),
        (1, "warm"): (4, 4),
    }
    assert first.summary == {"total_requests": 2, "checksum_ok": 2, "checksum_fail": 0, "pass_rate": 100.0}
    # after L1 was emptied the cold pass already hits (from L2) and only the warm pass is checksummed
    assert second.digests == {(0, "warm"): "c66822ad0985fd20", (1, "warm"): "8757caaad79e69b9"}
    assert second.lookups[(0, "cold")] == (4, 4)
    assert pc.l1_problems(first, 2, 4) == [] and pc.l2_problems(first, second, 2) == []


def test_a_retrieved_chunk_that_differs_fails_even_when_the_bench_exits_0() -> None:
    """The bench exits 0 whatever its checksums say (server_bench/command.py): the digests decide."""
    bad = _edit_stdout(
        _ok(), 0, "[seq 1/warm] CHECKSUM: 8757caaad79e69b9", "[seq 1/warm] CHECKSUM: 0000caaad79e69b9"
    )
    check = _failed(
        bad, "sequence 1: retrieved KV digest 0000caaad79e69b9 differs from the stored 8757caaad79e69b9"
    )
    assert check.facts["byte_exact"] is False
    # the bench's own verdict and summary are read too
    worse = _edit_stdout(bad, 0, "[seq 1] CHECKSUM MATCH OK", "[seq 1] CHECKSUM MISMATCH!")
    worse = _edit_stdout(
        worse, 0, '"checksum_ok": 2,\n      "checksum_fail": 0', '"checksum_ok": 1,\n      "checksum_fail": 1'
    )
    problems = pc.l1_problems(pc.parse_bench(worse["passes"][0]), 2, 4)
    assert "sequence 1: the bench says CHECKSUM MISMATCH" in problems
    assert "the bench's summary says 1 of 2 checksums ok, 1 failed (expected 2 of 2)" in problems


def test_kv_from_l2_is_compared_with_what_the_first_run_stored() -> None:
    bad = _edit_stdout(
        _ok(), 1, "[seq 0/warm] CHECKSUM: c66822ad0985fd20", "[seq 0/warm] CHECKSUM: 8757caaad79e69b9"
    )
    check = _failed(
        bad, "sequence 0: KV retrieved from L2 has digest 8757caaad79e69b9, stored was c66822ad0985fd20"
    )
    assert check.facts["parts"]["store_retrieve_l1"].startswith("ok: ")  # L1 itself was fine
    # no L2 on the host: the second run is neither asked nor judged
    no_l2 = copy.deepcopy(_ok())
    no_l2["l2"] = {"path": None, "why_not": "no L2 on this host (no nvme cell)"}
    no_l2["passes"] = no_l2["passes"][:1]
    check = pc.judge(no_l2)
    assert check.status == Status.OK
    assert check.facts["parts"]["store_retrieve_l2"] == "skip: no L2 on this host (no nvme cell)"


def test_a_cold_lookup_that_hits_or_a_warm_one_that_misses_proves_nothing() -> None:
    bad = _edit_stdout(_ok(), 0, "[seq 0/cold] LOOKUP: 0/4", "[seq 0/cold] LOOKUP: 2/4")
    bad = _edit_stdout(bad, 0, "[seq 1/warm] LOOKUP: 4/4", "[seq 1/warm] LOOKUP: 3/4")
    problems = pc.l1_problems(pc.parse_bench(bad["passes"][0]), 2, 4)
    assert problems == [
        "sequence 0: the cold lookup was no miss (2, 4)",
        "sequence 1: the warm lookup hit (3, 4) chunks, not all",
    ]


def test_the_live_metric_names_are_diffed_against_the_analysis() -> None:
    text = _ok()["metrics_text"]
    present = pc.metric_values(text)
    assert pc.name_diff(present, [*pc.EXPECTED_L1, *pc.EXPECTED_L2]) == ([], [])
    # a renamed family: an unknown name on the server and a missing one the check's traffic creates
    renamed = text.replace("lmcache_mp_l1_write_chunks", "lmcache_mp_l1_stored_chunks")
    assert renamed != text
    unknown, missing = pc.name_diff(pc.metric_values(renamed), pc.EXPECTED_L1)
    assert unknown == ["lmcache_mp_l1_stored_chunks_total"] and missing == [
        "lmcache_mp_l1_write_chunks_total"
    ]
    facts = _ok() | {"metrics_text": renamed}
    _failed(
        facts,
        "the server exports names the analysis does not know: lmcache_mp_l1_stored_chunks_total",
        "families a store and retrieve create are absent: lmcache_mp_l1_write_chunks_total",
    )


def test_every_expected_family_is_one_the_analysis_knows() -> None:
    assert set(pc.EXPECTED_L1) | set(pc.EXPECTED_L2) <= N.LMC_KNOWN_NAMES


def test_a_server_that_is_not_sandboxed_or_lacks_its_compiled_module_fails() -> None:
    facts = copy.deepcopy(_ok())
    facts["server"]["process"]["status"]["NoNewPrivs"] = "0"
    facts["server"]["process"]["mapped"] = ["libtorch_cpu.so"]
    check = _failed(
        facts,
        "the server ran with NoNewPrivs 0, not 1: not the units' sandbox",
        "LMCache's compiled lmcache_native module is not loaded in the server",
    )
    assert "reinstall the engine set" in check.fix


def test_a_server_that_dies_names_its_last_words() -> None:
    facts = json.loads((FIXTURES / "cpu-server-af-unix-only.json").read_text())
    check = pc.judge(facts)
    assert check.status == Status.FAIL
    assert check.detail == (
        "server: the server unit is inactive before it answered; the server logged: Address family not "
        "supported by protocol (src/ip_resolver.cpp:542)"
    )
    assert "journalctl -u 'kvoffload-doctor-pair-*'" in check.fix


def test_a_failed_bench_names_its_error() -> None:
    facts = copy.deepcopy(_ok())
    facts["passes"] = facts["passes"][:1]
    facts["passes"][0] |= {
        "rc": 1,
        "stdout": "Connecting to LMCache MP Server at tcp://127.0.0.1:1 (mode=cpu) ...\n",
        "stderr_tail": "ERROR: REGISTER_KV_CACHE failed for rank 0 (instance_id=1000)\n",
    }
    check = pc.judge(facts)
    assert check.status == Status.FAIL
    assert check.detail.startswith(
        "the bench failed: ERROR: REGISTER_KV_CACHE failed for rank 0 (instance_id=1000)"
    ), check.detail


@pytest.mark.parametrize("device", ["cuda:0", "cpu"])
def test_a_gpu_mode_run_shows_the_cuda_parts_only_with_its_kv_on_a_cuda_device(device: str) -> None:
    facts = copy.deepcopy(_ok())
    facts["mode"] = "gpu"
    facts["server"]["process"]["mapped"].append("cuda_ops.cpython-312-x86_64-linux-gnu.so")
    for p in facts["passes"]:
        p["stdout"] = re.sub(r"KV tensors on \S+", f"KV tensors on {device}", p["stdout"])
    check = pc.judge(facts)
    parts = check.facts["parts"]
    if device == "cuda:0":
        assert check.status == Status.OK, check.detail
        assert parts["cuda_ipc"] == "ok: stored and retrieved through CUDA IPC handles"
        assert parts["pinned_l1"].startswith("ok: the CUDA build pins L1; VmLck 0 kB, VmPin 0 kB")
        assert "not exercised" not in check.detail
    else:  # a gpu-mode bench whose KV stayed in host memory showed no CUDA
        assert check.status == Status.FAIL
        assert "CUDA IPC between the two units not shown by a gpu-mode bench" in check.detail


def test_without_an_answer_the_check_says_why() -> None:
    assert pc.check(None, False).detail == "no vLLM/LMCache pair on this host"
    assert pc.check(None, True).detail == "not run: --no-pair-check"
    skipped = pc.check({"skip": "no engine venv with LMCache at /opt/kvoffload/venv yet"}, True)
    assert (skipped.status, skipped.detail) == (
        Status.SKIP,
        "no engine venv with LMCache at /opt/kvoffload/venv yet",
    )
    lost = pc.check({"stage": "playbook", "error": "unreachable at 'Run the pair': ssh"}, True)
    assert (lost.status, lost.detail) == (Status.FAIL, "playbook: unreachable at 'Run the pair': ssh")


def test_a_cuda_build_whose_server_did_not_load_cuda_ops_fails() -> None:
    """Issue 52: a CUDA server with lmcache_native but without cuda_ops moves KV with torch ops (LMCache's
    silent fallback); lmcache_native alone proves nothing about the torch pair."""
    facts = copy.deepcopy(_ok())
    facts["mode"] = "gpu"
    for p in facts["passes"]:
        p["stdout"] = re.sub(r"KV tensors on \S+", "KV tensors on cuda:0", p["stdout"])
    check = pc.judge(facts)
    assert check.status == Status.FAIL
    assert "compiled cuda_ops module is not loaded in the server on a CUDA build" in check.detail
