"""The cell-free pair check's node script (kvoffload/doctor/pair_node.py): the command lines it builds
and what it reads of a process, without systemd (a recorded run on a real systemd host is in
tests/fixtures/doctor/pair-cellfree, judged in test_doctor_pair_cellfree.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kvoffload.doctor import pair_node as pn

VENV = "/opt/kvoffload/venv"


def test_a_transient_unit_gets_exactly_the_keys_given_in_order() -> None:
    cmd = pn.unit_command(
        "kvoffload-doctor-pair-server-ab.service",
        {"NoNewPrivileges": "yes", "CapabilityBoundingSet": "", "SystemCallFilter": "~@clock @debug"},
        {"HOME": "/var/lib/kvoffload-lmcache"},
        [f"{VENV}/bin/lmcache", "server"],
        wait=False,
    )
    assert cmd == [
        "systemd-run",
        "--unit=kvoffload-doctor-pair-server-ab.service",
        "--collect",
        "--quiet",
        "-p",
        "NoNewPrivileges=yes",
        "-p",
        "CapabilityBoundingSet=",
        "-p",
        "SystemCallFilter=~@clock @debug",
        "--setenv=HOME=/var/lib/kvoffload-lmcache",
        "--",
        f"{VENV}/bin/lmcache",
        "server",
    ]
    waited = pn.unit_command("u", {}, {}, ["true"], wait=True)
    assert waited[4:6] == ["--wait", "--pipe"]  # the bench's output comes back through the pipe


def test_each_unit_keeps_its_state_folder_and_only_the_server_gets_the_l2_folder() -> None:
    base = {"User": "kvoffload-engine", "ProtectSystem": "strict"}
    server = pn.unit_properties(base, "server", "/mnt/nvme/.kvoffload-doctor-pair-1")
    assert server == {
        **base,
        "StateDirectory": "kvoffload-lmcache",
        "ReadWritePaths": "/mnt/nvme/.kvoffload-doctor-pair-1",
    }
    assert pn.unit_properties(base, "bench", "/mnt/x") == {**base, "StateDirectory": "kvoffload-vllm"}
    assert pn.unit_properties(base, "server") == {**base, "StateDirectory": "kvoffload-lmcache"}
    assert base == {"User": "kvoffload-engine", "ProtectSystem": "strict"}  # not changed in place
    assert pn.unit_env("bench")["HOME"] == "/var/lib/kvoffload-vllm"
    assert pn.unit_env("server")["LMCACHE_TRACK_USAGE"] == "false"


def test_the_bench_moves_two_sequences_of_four_chunks_in_different_blocks() -> None:
    spec, tokens = pn.kv_shape(256)
    # 4 chunks of 256 tokens in 16-token blocks: 64 blocks a sequence, three sequences' worth of blocks
    assert (spec, tokens) == ("(2,192,16,8,128):float16:4", 1024)
    with pytest.raises(ValueError, match="multiple of the bench's block size 16"):
        pn.kv_shape(250)
    argv = pn.bench_argv(VENV, 5001, 8001, "cpu", 256)
    assert argv[:3] == [f"{VENV}/bin/lmcache", "bench", "server"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert flags == {
        "--rpc-url": "tcp://127.0.0.1:5001",
        "--url": "http://127.0.0.1:8001",
        "--mode": "cpu",
        "--transfer-mode": "auto",
        "--num-tokens": "1024",
        "--kvcache-shape-spec": "(2,192,16,8,128):float16:4",
        "--start": "0",
        "--end": "2",
        "--interval": "0",
        "--format": "json",
    }


def test_the_server_listens_on_loopback_with_an_fs_native_l2_when_asked() -> None:
    argv = pn.server_argv(VENV, 5001, 8001, 256, 0.25, None)
    flags = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert argv[:2] == [f"{VENV}/bin/lmcache", "server"]
    assert flags == {
        "--host": "127.0.0.1",
        "--port": "5001",
        "--http-host": "127.0.0.1",
        "--http-port": "8001",
        "--chunk-size": "256",
        "--l1-size-gb": "0.25",
        "--eviction-policy": "LRU",
        "--supported-transfer-mode": "auto",
    }
    with_l2 = pn.server_argv(VENV, 5001, 8001, 256, 0.25, "/mnt/nvme/.p")
    assert json.loads(with_l2[-1]) == {
        "type": "fs_native",
        "base_path": "/mnt/nvme/.p",
        "num_workers": 2,
        "use_odirect": True,
    }
    assert with_l2[-2] == "--l2-adapter" and " " not in with_l2[-1]  # one word


def test_a_family_is_summed_over_its_label_sets() -> None:
    text = (
        "# TYPE lmcache_mp_l2_store_completed_objects_chunks_total counter\n"
        "lmcache_mp_l2_store_completed_objects_chunks_total 6.0\n"
        'lmcache_mp_l1_write_chunks_total{l1_tag="_default"} 8.0\n'
        'lmcache_mp_l1_write_chunks_total{l1_tag="other"} 1.0\n'
        "lmcache_mp_l1_write_chunks_created 1.7e9\n"
    )
    assert pn.family_sum(text, pn.L1_WRITES) == 9.0
    assert pn.family_sum(text, pn.L2_STORED) == 6.0
    assert pn.family_sum(text, "lmcache_mp_absent_total") == 0.0


def test_the_server_process_is_read_from_proc(tmp_path: Path) -> None:
    proc = tmp_path / "proc" / "42"
    proc.mkdir(parents=True)
    (proc / "status").write_text(
        "Name:\tpython3\nNoNewPrivs:\t1\nCapEff:\t0000000000000000\nVmLck:\t0 kB\nVmPin:\t0 kB\n"
    )
    lib = f"{VENV}/lib/python3.11/site-packages"
    (proc / "maps").write_text(
        f"7f00-7f01 r-xp 00000000 08:01 1 {lib}/lmcache/lmcache_native.cpython-311-x86_64-linux-gnu.so\n"
        f"7f01-7f02 r-xp 00000000 08:01 2 {lib}/torch/lib/libtorch_cpu.so\n"
        f"7f02-7f03 r-xp 00000000 08:01 3 {lib}/numpy/core/_multiarray_umath.so\n"
        "7f03-7f04 rw-p 00000000 00:00 0 \n"
    )
    (proc / "numa_maps").write_text("7f00 interleave:0-1 file=/x\n7f01 interleave:0-1 anon=3\n")
    facts = pn.process_facts(42, VENV, tmp_path)
    assert facts == {
        "status": {"NoNewPrivs": "1", "CapEff": "0000000000000000", "VmLck": "0 kB", "VmPin": "0 kB"},
        "mapped": ["libtorch_cpu.so", "lmcache_native.cpython-311-x86_64-linux-gnu.so"],
        "numa_policies": ["interleave:0-1"],
    }
    assert pn.process_facts(43, VENV, tmp_path) == {"status": {}, "mapped": [], "numa_policies": []}


def _args(tmp_path: Path) -> argparse.Namespace:
    props = json.dumps({"server": {"User": "kvoffload-engine"}, "bench": {}})
    return pn.parse_args(["--properties", props, "--venv", str(tmp_path / "venv")])


def test_without_an_engine_venv_the_check_is_skipped_and_changes_nothing(tmp_path: Path) -> None:
    facts = pn.PairRun(_args(tmp_path))()
    assert facts["skip"].startswith(f"no engine venv with LMCache at {tmp_path / 'venv'} yet")
    assert facts["passes"] == [] and "server" not in facts and "l2" not in facts
    assert list(tmp_path.iterdir()) == []


def test_without_systemd_the_check_fails_before_it_starts_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "lmcache").write_text("#!/bin/sh\n")
    monkeypatch.setattr(pn.shutil, "which", lambda _name: None)
    facts = pn.PairRun(_args(tmp_path))()
    assert facts["stage"] == "preflight"
    assert (
        facts["error"]
        == "no systemd here (systemd-run, /run/systemd/system): the engines run as systemd units"
    )
    assert facts["passes"] == [] and "server" not in facts
