"""`kvoffload-lab plan`: cells, ceilings with warnings, DONE detection, exit 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kvoffload.cli.main import main
from kvoffload.config import load_lab
from tests.support.datasets import generic_lines

ROOT = Path(__file__).resolve().parents[3]


def _generic_dataset(folder: Path, sessions: int, calls: int) -> Path:
    """`sessions` conversations of `calls` calls each, every call extending the previous one."""
    folder.mkdir()
    lines = generic_lines(sessions, calls)
    (folder / "calls.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def _lab(tmp_path: Path) -> tuple[Path, Path]:
    inventory = yaml.safe_load((ROOT / "inventories" / "example" / "hosts.yml").read_text())
    inventory["all"]["vars"].pop("kvoffload_campaign")
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump(inventory))
    _generic_dataset(tmp_path / "data", sessions=2, calls=10)
    campaign = {
        "name": "plantest",
        "model": "m",
        "gpu_vendor": "amd",
        # AMD with real vLLM is refused (test_amd_with_real_vllm_is_refused); the simulator takes it.
        "engine": "sim",
        "sim_profile": "mi300x-llama-8b",
        "dataset": {"code": "generic", "path": "data"},
        "tiers": ["gpu", "nvme"],
        "concurrency": [2, 8],
        "num_rounds": [5],
        "isl": 4096,
    }
    camp = tmp_path / "campaign.yml"
    camp.write_text(yaml.safe_dump(campaign))
    return inv, camp


EXAMPLE = ROOT / "inventories" / "example" / "hosts.yml"
EXAMPLE_DATASET = "/data/lmcache-agentic-traces"


def _example_with_its_dataset_here(tmp_path: Path) -> Path:
    """The example inventory with its sammshen dataset pointed at the sample shipped in data/."""
    inventory = yaml.safe_load(EXAMPLE.read_text())
    inventory["all"]["vars"]["kvoffload_campaign"]["dataset"]["path"] = str(ROOT / "data" / "sammshen-sample")
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump(inventory))
    return inv


@pytest.mark.skipif(Path(EXAMPLE_DATASET).exists(), reason="the example's dataset is on this machine")
def test_the_example_without_its_dataset_here_is_refused_naming_the_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`run` ships the dataset from this machine: `plan` no longer estimates "replays 0.0 min" for a
    dataset that is not here, it exits 2 before printing anything (issue 43, defect 12)."""
    assert main(["plan", str(EXAMPLE)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert (
        f"kvoffload-lab: error: {EXAMPLE}: all.vars.kvoffload_campaign.dataset.path: {EXAMPLE_DATASET} does "
        "not exist on this machine: `run` ships the dataset from here to the client hosts; put the dataset "
        "file or folder there, or give its path"
    ) in err


def test_example_inventory_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(_example_with_its_dataset_here(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "18 cell(s) to run, 0 already DONE" in out
    assert "nvidia-nvme" in out and "header X-User-Id" in out and "least_conn" in out
    # the sample's one session of 35 calls: 3 virtual users of 10 rounds, 1 of 25
    assert "concurrency exceeds the dataset's 3 virtual users; the extra 253 slots add no load" in out
    # real vLLM, no earlier run: the default engine start
    words = " ".join(out.split())  # the caption wraps
    assert "engine start default (real vLLM) (180 s)" in words and "replays count 0" not in words


def test_ceiling_warning_and_done_cells(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv, camp = _lab(tmp_path)
    cells = load_lab(inv, camp).cells
    done = cells[0]
    (tmp_path / "results" / "plantest" / "cells" / done.id).mkdir(parents=True)
    (tmp_path / "results" / "plantest" / "cells" / done.id / "DONE").write_text("")
    # A cell folder without DONE (interrupted) is run again.
    (tmp_path / "results" / "plantest" / "cells" / cells[1].id).mkdir(parents=True)
    rc = main(["plan", str(inv), "--campaign", str(camp), "--results", str(tmp_path / "results")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "3 cell(s) to run, 1 already DONE" in out
    assert "amd-gpu" in out and "amd-nvme" in out
    # 2 sessions x 10 calls at num_rounds 5: 4 virtual users, so concurrency 8 exceeds it in both tiers.
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2
    assert all("exceeds the dataset's 4 virtual users" in line for line in warnings)
    # Model "m" has no tokenizer here: the table of tokens per round says the fallback counted.
    assert "input tokens per round (users of 5 rounds; a cell's isl bounds the last)" in out
    assert "counted by kvoffload-fallback (approximate" in out
    rows = [line for line in out.splitlines() if line.startswith("│") and line.count("│") == 7]
    assert [int(line.split("│")[1]) for line in rows] == [1, 2, 3, 4, 5]
    assert all(int(line.split("│")[2]) == 4 for line in rows)  # 4 virtual users, one call each
    # the estimate of the 3 cells to run, from the campaign's sim profile (nothing measured yet)
    words = " ".join(out.split())  # the caption wraps
    assert "estimated wall time: " in words and "then the slowest node" in words
    assert "engine start profile mi300x-llama-8b" in words and "a request profile mi300x-llama-8b" in words


def test_a_knee_search_beyond_the_producible_load_is_warned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv, camp = _lab(tmp_path)
    doc = yaml.safe_load(camp.read_text())
    doc.update(concurrency=[2], max_sessions=3, knee_search={"slo_p95_ttft_s": 1.0, "max_concurrency": 64})
    camp.write_text(yaml.safe_dump(doc))
    rc = main(["plan", str(inv), "--campaign", str(camp), "--results", str(tmp_path / "results")])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 0
    # 4 virtual users at num_rounds 5, none dropped at isl 4096, cut at max_sessions 3: they hold 1
    assert (
        "warning: knee_search.max_concurrency 64 exceeds the 1 sessions the 3 virtual users a cell replays "
        "at num_rounds 5, isl 4096 hold (4 in the dataset, 0 dropped by the isl filter, max_sessions 3): the "
        "ramp stops at 1"
    ) in out
    # and the campaign's own concurrency 2 is above what 3 users hold (issue 53)
    assert (
        "warning: concurrency 2 (num_rounds 5): at most 3 users replay it, and a closed loop holds at most 1 "
        "sessions at once for a session"
    ) in out


def test_a_level_above_what_the_users_hold_is_warned_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 53: the demo asked for 32 sessions of 32 users, a synchronized start and a drain. 4 users
    hold 2 at once for a session: concurrency 3 is warned once (not per tier), 2 is not."""
    inv, camp = _lab(tmp_path)
    doc = yaml.safe_load(camp.read_text())
    doc.update(concurrency=[2, 3], slo={"ttft_p95_s": 0.5}, knee_search={"enabled": False})
    camp.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(inv), "--campaign", str(camp), "--results", str(tmp_path / "results")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    said = (
        "warning: concurrency 3 (num_rounds 5): at most 4 users replay it, and a closed loop holds at most 2 "
        'sessions at once for a session (docs/metrics.md "Steady window"): its load would not be held '
        "and the decision will not judge it; raise max_sessions (or use a larger dataset) to at least 6, or "
        "lower the concurrency to 2"
    )
    assert out.count(said) == 1
    assert "warning: concurrency 2 (" not in out


def test_a_hub_model_counts_with_the_hf_cache_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokenizers import Tokenizer, models

    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "r1"
    snapshot.mkdir(parents=True)
    Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")).save(str(snapshot / "tokenizer.json"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    inv = _example_with_its_dataset_here(tmp_path)
    assert main(["plan", str(inv)]) == 0
    assert f"counted by {snapshot / 'tokenizer.json'}" in capsys.readouterr().out
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    assert main(["plan", str(inv)]) == 0
    assert "counted by kvoffload-fallback" in capsys.readouterr().out


def test_bad_input_exits_2_naming_file_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv, camp = _lab(tmp_path)
    campaign = yaml.safe_load(camp.read_text())
    campaign["concurrency"] = [2, -4]
    camp.write_text(yaml.safe_dump(campaign))
    assert main(["plan", str(inv), "--campaign", str(camp)]) == 2
    err = capsys.readouterr().err
    assert f"{camp}: concurrency[1]: must be a positive integer, got -4" in err


def test_a_dataset_message_a_chat_server_refuses_exits_2_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv, camp = _lab(tmp_path)
    calls = tmp_path / "data" / "calls.jsonl"
    lines = calls.read_text().splitlines()
    lines[4] = lines[4].replace('"role": "assistant"', '"role": "bot"')
    calls.write_text("\n".join(lines) + "\n")
    assert main(["plan", str(inv), "--campaign", str(camp), "--results", str(tmp_path / "results")]) == 2
    captured = capsys.readouterr()
    assert f"{calls}: line 5: 'messages[2]': role 'bot' is not one a chat server accepts" in captured.err
    assert "roles allowed: system, developer, user, assistant, tool" in captured.err
    assert "Traceback" not in captured.err and "cell(s) to run" not in captured.out


def test_amd_with_real_vllm_needs_a_source_for_the_rocm_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # issue 44: amd runs the engine set of build rocm, whose wheels are on no public index
    inv, camp = _lab(tmp_path)
    campaign = yaml.safe_load(camp.read_text())
    campaign.pop("sim_profile")
    camp.write_text(yaml.safe_dump({**campaign, "engine": "vllm"}))
    assert main(["plan", str(inv), "--campaign", str(camp)]) == 2
    err = capsys.readouterr().err
    assert "engine set rocm-vllm0.32 (build rocm) comes from no public index" in err
    assert f"{camp}: engine_source" in err and "Traceback" not in err


def test_offload_replicas_off_the_lmcache_host_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv, camp = _lab(tmp_path)
    inventory = yaml.safe_load(inv.read_text())
    # gpu02 stays a node, but leaves lmcache and lb: its cpu/nvme cells would have no cache server
    del inventory["all"]["children"]["lmcache"]["hosts"]["gpu02.lab.example"]
    del inventory["all"]["children"]["lb"]["hosts"]["gpu02.lab.example"]
    inv.write_text(yaml.safe_dump(inventory))
    assert main(["plan", str(inv), "--campaign", str(camp)]) == 2
    err = capsys.readouterr().err
    assert f"{inv}: host gpu02.lab.example (group vllm): tiers nvme" in err
    assert "need every node in group lmcache" in err
    assert "8 replicas need Caddy on the node: add it to group lb" in err
    # The gpu tier alone runs no cache server; Caddy is still needed for 8 replicas.
    inventory["all"]["children"]["lb"]["hosts"]["gpu02.lab.example"] = None
    inv.write_text(yaml.safe_dump(inventory))
    camp.write_text(yaml.safe_dump({**yaml.safe_load(camp.read_text()), "tiers": ["gpu"]}))
    assert main(["plan", str(inv), "--campaign", str(camp)]) == 0


@pytest.mark.parametrize(
    ("engine", "utilization", "warned"),
    [
        ("vllm", None, False),  # vLLM's 0.9 leaves 8 GiB of the assumed 80 GiB GPU
        ("vllm", "0.99", True),  # 0.8 GiB left
        ("vllm", "0.985", False),  # 1.2 GiB left
        ("sim", "0.999", False),  # the simulator's cache server holds no GPU memory
    ],
)
def test_plan_warns_when_the_utilization_leaves_no_room_for_lmcache_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: str, utilization: str | None, warned: bool
) -> None:
    inv, camp = _lab(tmp_path)
    campaign = yaml.safe_load(camp.read_text())
    campaign["concurrency"] = [2]  # no ceiling warning
    if engine == "vllm":
        campaign.update(engine="vllm", gpu_vendor="nvidia", sim_profile=None)
    if utilization is not None:
        campaign["extra_engine_args"] = ["--gpu-memory-utilization", utilization]
    camp.write_text(yaml.safe_dump(campaign))
    assert main(["plan", str(inv), "--campaign", str(camp), "--results", str(tmp_path / "results")]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long warnings
    room = [w for w in out.split("warning: ")[1:] if "lmcache-server holds about 1 GiB on every GPU" in w]
    assert len(room) == (1 if warned else 0)  # the nvme tier only: the gpu tier runs no server
    if warned:
        assert room[0].startswith("tier nvme: --gpu-memory-utilization")
        assert "0.80 GiB of a 80 GiB GPU (assumed" in room[0] and "give at most 0.987" in room[0]
        # With the KV cache sized in bytes vLLM ignores the utilization: no warning.
        campaign["kv_cache_memory_bytes"] = 1 << 30
        camp.write_text(yaml.safe_dump(campaign))
        main(["plan", str(inv), "--campaign", str(camp), "--results", str(tmp_path / "results")])
        assert "lmcache-server holds about" not in capsys.readouterr().out


def test_plan_warns_when_an_l1_pool_exceeds_a_hosts_recorded_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 53: a campaign asking for a 100 GiB cpu L1 on a lab whose doctor record gives gpu01 24 GiB
    is warned before it runs; gpu02, which no record sizes, is named as not checked."""
    inv, camp = _lab(tmp_path)
    campaign = yaml.safe_load(camp.read_text())
    campaign.update(concurrency=[2], tiers=["gpu", "cpu"], lmcache_l1_size_gb={"cpu": 100})
    camp.write_text(yaml.safe_dump(campaign))
    record = tmp_path / "results" / "plantest" / "doctor-run" / "doctor.json"
    record.parent.mkdir(parents=True)
    memory = {"name": "memory", "status": "ok", "detail": "x", "facts": {"mem_total": 24 * 2**30}}
    record.write_text(json.dumps({"hosts": [{"host": "gpu01.lab.example", "checks": [memory]}]}))
    assert main(["plan", str(inv), "--campaign", str(camp), "--results", str(tmp_path / "results")]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert (
        "warning: tier cpu: its L1 pool of 100 GiB (the campaign's lmcache_l1_size_gb.cpu) exceeds the 24.0 "
        "GiB of memory of gpu01.lab.example (MemTotal, its doctor record "
    ) in out
    assert "give the campaign a smaller lmcache_l1_size_gb.cpu" in out
    assert "L1 pools against host memory: not checked on gpu02.lab.example (no doctor record under" in out
