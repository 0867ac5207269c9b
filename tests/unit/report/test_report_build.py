"""build_report on the hand-made fixture campaign: figures, warnings, files, self-containment."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from kvoffload.cli.main import main
from kvoffload.errors import UserError
from kvoffload.ingest import Tables
from kvoffload.orchestrate.cell.deployment import REMOTE_MODELS
from kvoffload.report import build_report, findings_text, write_report
from kvoffload.report.build import _kv_bytes_input, analyse, capacity_inputs, summary_csv, summary_records
from kvoffload.report.model_config import STAGED_MODELS, find_model_config
from tests.support.models import LLAMA_8B
from tests.support.small_campaign import copy_small


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    return copy_small(tmp_path / "fixture-small")


def test_summary_figures_match_the_fixture_design(campaign: Path) -> None:
    s = analyse(campaign).summary.set_index("cell_id")
    # TTFTs of a1gpu: 0.10 + 0.02 (k-1) + 0.01 (u-1) for k = 1..3, u = 1..4; median of the 12 = 0.135.
    assert s.loc["a1gpu", "ttft_p50_s"] == pytest.approx(0.135)
    assert s.loc["a2cpu", "ttft_p50_s"] == pytest.approx(0.8 * 0.135)
    # 4 users x (100 + 200 + 300) prompt tokens over 150 s of requests.
    assert s.loc["a1gpu", "input_tokens_per_s"] == pytest.approx(2400 / 150)
    assert s.loc["a1gpu", "local_hit_rate"] == pytest.approx(0.5)
    assert s.loc["a2cpu", "external_hit_rate"] == pytest.approx(20 / 40)
    assert s.loc["a3nvme", "external_hit_rate"] == pytest.approx(10 / 40)
    assert s.loc["a1gpu", "prefill_mean_s"] == pytest.approx(0.1)
    assert s.loc["a1gpu", "queue_mean_s"] == pytest.approx(0.005)
    assert s.loc["a3nvme", "disk_read_gbps"] == pytest.approx(0.1)
    assert s.loc["a3nvme", "disk_write_latency_ms"] == pytest.approx(2.0)
    assert s.loc["a3nvme", "disk_util_pct"] == pytest.approx(50.0)
    assert s.loc["a3nvme", "gpu_power_w"] == pytest.approx(620.0)
    assert pd.isna(s.loc["a1gpu", "gpu_power_w"])  # no GPU telemetry there: absent, not 0
    # 2 chunks/s; the lmcache snapshots hold the counter values of T0 and T0+150.
    assert s.loc["a3nvme", "lmcache_l1_evicted_chunks"] == pytest.approx(2.0 * 150)
    assert s.loc["b1gpu", "requests_error"] == 1
    assert s.loc["b2cpu", "scrape_failures"] == 2


def test_fixture_figures_of_issue_34(campaign: Path) -> None:
    s = analyse(campaign).summary.set_index("cell_id")
    # KV usage over the replay window: the T0 round (sent, nothing held yet) is left out: 95 %, not the
    # 86.4 % of all eleven rounds.
    assert s.loc["a2cpu", "kv_usage_mean_pct"] == pytest.approx(95.0)
    # the L2 eviction counter under LMCache 0.5.6's name, never incremented: 0, known
    assert s.loc["a3nvme", "lmcache_l2_evicted_chunks"] == 0.0
    assert s.loc["a3nvme", "lmcache_evicted_chunks"] == pytest.approx(2.0 * 150)
    # CPU utilization per host is in the summary (and so in report --format json|csv)
    assert json.loads(s.loc["a1gpu", "cpu_util_pct_by_host"]) == {"gpu1": pytest.approx(25.0)}
    assert pd.isna(s.loc["a2cpu", "cpu_util_pct_by_host"])  # no node-exporter sampled there
    # the intact fixture needs no fallback; its dataset (/data/sample) is not on this machine
    kinds = {n["kind"] for text in s["data_notes"].dropna() for n in json.loads(text)}
    assert kinds == {"prefix_reuse_unknown"} and s["shared_prefix_reuse_share"].isna().all()


def test_report_files_and_warnings(campaign: Path) -> None:
    index = build_report(campaign)
    assert index == campaign / "report" / "index.html"
    md = (campaign / "report" / "report.md").read_text()
    for kind in (
        "concurrency_above_ceiling",
        "cell_not_done",
        "failed_requests",
        "scrape_gaps",
        "sessions_differ",
        "offload_not_exercised",
    ):
        assert f"**{kind}**" in md
    assert "| gpu | a1gpu | 4/4 | 12/12 |" in md
    html = index.read_text()
    # the methodology a reader has: docs/metrics.md, not a design file outside the package
    assert "Figures follow docs/metrics.md" in html and "DESIGN.md" not in html
    assert html.count("<svg") >= 7  # 4 plots for group a (incl. disk), 3 for group b
    assert "<script" not in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched from a network
    for name in ("summary", "rounds", "warnings", "requests", "samples"):
        assert (campaign / "tables" / f"{name}.parquet").is_file()


def test_report_shows_each_hosts_software_and_flags_the_vllm_change(campaign: Path) -> None:
    index = build_report(campaign)
    md = (campaign / "report" / "report.md").read_text()
    header = "| host | roles | cells | vllm | lmcache | kvoffload-lab | torch | caddy | node-exporter |"
    assert header + " GPU driver | CUDA |" in md  # no ROCm column: no host reported one
    # b2cpu ran vLLM 0.33.0 on gpu1, every other cell 0.32.0 (fixture README)
    assert "| client | client,lb | all | – | – | 0.1.0 | – | 2.6.2-5 | 1.5.0-1+b6 | – | – |" in md
    gpu1 = "| gpu1 | lmcache,vllm | all but b2cpu | 0.32.0 | 0.5.6 | 0.1.0 | 2.9.0 | – | 1.5.0-1+b6 |"
    assert gpu1 + " 580.159.04 | 13.0 |" in md
    assert "| gpu1 | lmcache,vllm | b2cpu | 0.33.0 | 0.5.6 |" in md
    # The campaign's settings, hosts and software come last: findings first.
    assert (
        md.index("## Validity warnings")
        < md.index("## Campaign settings")
        < md.index("### Software per host")
    )
    assert (
        "- **software_differs**: not comparable across these cells: vllm differs on the lmcache, vllm hosts "
        "(0.32.0 in a1gpu, a2cpu, a3nvme, b1gpu; 0.33.0 in b2cpu)"
    ) in md
    assert '**controller software versions**: {"kvoffload-lab": "0.1.0", "python": "3.11.2"}' in md
    html = index.read_text()
    assert "<h3>Software per host</h3>" in html
    assert "<td>all but b2cpu</td><td>0.32.0</td>" in html
    assert "<strong>software_differs</strong>" in html


def test_report_puts_findings_first_and_settings_last(campaign: Path) -> None:
    index = build_report(campaign)
    md = (campaign / "report" / "report.md").read_text()
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[:6] == [
        "## Which tier, at what scale, at what cost",  # issue 42: without an slo, a hint to set one
        "## Findings",
        "## Where each turn's prompt came from",
        "## Capacity: how much history each tier retains",
        "## Trade-off and recommendation",
        "## Validity warnings",
    ]
    assert sections[-1] == "## Campaign settings"
    # group b is not comparable (fixture README): the statement says so and why, in the findings
    findings = md[: md.index("## Capacity")]
    assert "- NOT A VALID COMPARISON (session counts differ (gpu: 4 achieved, 3 complete, 1 error" in findings
    assert "the gpu cell(s) did not run clean (gpu b1gpu: 1 failed request(s))" in findings
    assert "offload was never exercised: KV usage peaked at 50 %" in findings
    # a2cpu has TTFT x0.8 of a1gpu at every request: -20 % exactly; 4 sessions a side are below the
    # floor of an interval (docs/metrics.md "Validity rules")
    assert (
        "- cpu changes later-round p50 TTFT by -20 % (too few sessions for an interval: 4 against 4, at "
        "least 10 per side)"
    ) in findings
    assert "history was retained beyond the GPU cache (KV usage reached 95 %)" in findings
    assert "gpu tier routes sticky by the X-User-Id header" in findings
    # the first table of a group fits a laptop screen: at most 10 columns, headers spelled out
    first = md[md.index("### Tier comparison") :].splitlines()[2]
    assert first.count("|") - 1 <= 10 and "degr." not in md
    html = index.read_text()
    assert html.index("<h2>Findings</h2>") < html.index("<h2>Validity warnings</h2>")
    # the decision (issue 42) comes first, then the findings
    assert html.index("<h2>Which tier, at what scale, at what cost</h2>") == html.index("<h2>")
    assert html.index("<h2>Findings</h2>") == html.index("<h2>", html.index("<h2>") + 1)
    assert 'aria-label="later-round TTFT per tier"' in html


def test_summary_json_and_csv(campaign: Path) -> None:
    summary = analyse(campaign).summary
    records = summary_records(summary)
    assert [r["cell_id"] for r in records] == ["a1gpu", "a2cpu", "a3nvme", "b1gpu", "b2cpu"]
    assert records[0]["gpu_power_w"] is None and records[0]["tier"] == "gpu"
    csv = summary_csv(summary).splitlines()
    assert csv[0].startswith("cell_id,tier,model") and len(csv) == 6


def test_cli_report_json_to_file_and_bad_flags(campaign: Path, tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    assert main(["report", str(campaign), "--format", "json", "--output", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert list(doc) == ["summary", "findings", "attribution", "capacity", "decision"]
    # the fixture campaign sets no slo: the section says how to get one, and holds no table
    assert doc["decision"]["target"] is None and doc["decision"]["sweeps"] == []
    assert doc["decision"]["note"].startswith("No latency target: add `slo: {ttft_p95_s: <seconds>}`")
    # One attribution per comparison group and tier, over the cells the validity rules let in: a1gpu's
    # per-request sources disagree with its counters (its records and counters are separately made),
    # b1gpu was interrupted; both are left out, with why.
    views = doc["attribution"]
    assert [(v["tier"], v["concurrency"], v["cells"]) for v in views] == [
        ("gpu", 2, []), ("cpu", 2, ["a2cpu"]), ("nvme", 2, ["a3nvme"]), ("gpu", 8, []), ("cpu", 8, ["b2cpu"])
    ]  # fmt: skip
    gpu, cpu_view = views[0], views[1]
    assert [e["cell_id"] for e in gpu["excluded"]] == ["a1gpu"] and gpu["rounds"] == []
    assert "disagree with the counters" in gpu["excluded"][0]["reason"]
    assert views[3]["excluded"] == [
        {"cell_id": "b1gpu", "reason": "status 'interrupted' without DONE: a partial run"}
    ]
    # Schema-1 records on cpu: no GPU/LMCache split and no LMCache log lines, but every request's cached
    # tokens: round 2 of a2cpu is 4 users x 200 prompt tokens, 100 of each cached (fixture README).
    r2 = cpu_view["rounds"][1]
    assert (r2["cached_tokens"], r2["missed_tokens"], r2["said_cached"]) == (400, 400, 4)
    assert r2["gpu_tokens"] is None and r2["l1_lookup_tokens"] is None and cpu_view["split"] == "coarse"
    assert list(cpu_view["costs"]) == [
        "requests", "sessions", "basis", "method", "base_s", "base_ci_s", "cached_other", "l2_hit", "missed",
        "split",
    ]  # fmt: skip
    assert cpu_view["costs"]["missed"] == {
        "verdict": "not_estimable", "s_per_1k": None, "ci_s_per_1k": None,
        "why": "no request said every source and its TTFT",
    }  # fmt: skip
    assert [r["cell_id"] for r in doc["summary"]] == ["a1gpu", "a2cpu", "a3nvme", "b1gpu", "b2cpu"]
    assert [(f["tier"], f["concurrency"], f["comparable"]) for f in doc["findings"]] == [
        ("gpu", 2, True),
        ("cpu", 2, True),
        ("nvme", 2, True),
        ("gpu", 8, False),
        ("cpu", 8, False),
    ]
    cpu = doc["findings"][1]
    assert cpu["p50_change_vs_gpu_pct"] == pytest.approx(-20.0)
    assert cpu["p50_change_ci_pct"] is None  # 4 sessions a side: below the floor of an interval
    assert cpu["gpu_capacity_exceeded"] is True and cpu["cross_replica_sharing"] is False
    assert list(doc["capacity"]) == ["predicted", "measured", "recommendation", "knee_search"]
    assert doc["capacity"]["knee_search"] is None  # the fixture campaign runs no knee search
    cpu_pred = next(p for p in doc["capacity"]["predicted"] if p["tier"] == "cpu")
    # a2cpu's L1: 1e9 bytes at a usage ratio of 0.5 (fixture generator) = a 2e9-byte pool; no KV bytes
    # per token for model "tiny", so no tokens, and the output says why.
    l1 = next(i for i in cpu_pred["inputs"] if i["name"] == "L1 pool")
    assert l1["value"] == pytest.approx(2e9) and "lmcache_mp_l1_usage_ratio" in l1["source"]
    assert cpu_pred["tokens"] is None and "KV bytes per token" in cpu_pred["missing"]
    measured = {k["tier"]: k["status"] for k in doc["capacity"]["measured"]}
    assert measured == {"gpu": "not_reached", "cpu": "not_reached", "nvme": "too_few_points"}
    assert main(["report", str(campaign), "--format", "json", "--format", "csv"]) == 2
    assert main(["report", str(tmp_path / "missing")]) == 2


def test_campaign_without_cells_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "empty" / "cells").mkdir(parents=True)
    with pytest.raises(UserError, match="no cell folders"):
        build_report(tmp_path / "empty")


def test_report_of_a_campaign_whose_cells_were_all_skipped(tmp_path: Path) -> None:
    cell = tmp_path / "broken" / "cells" / "x"
    cell.mkdir(parents=True)
    (cell / "cell.json").write_text("{}")
    index = build_report(tmp_path / "broken")
    md = (index.parent / "report.md").read_text()
    assert "**skipped_cell** [x]" in md and "cell_id" in md
    assert "<svg" not in index.read_text()


def test_the_knee_search_is_told_in_words() -> None:
    from kvoffload.report.build import knee_search_lines

    ramp = {"tier": "cpu", "num_rounds": 5, "isl": 12000, "osl": "32", "outcome": "bracketed",
            "bracket": [10, 11], "steps": [
                {"action": "try", "concurrency": 16, "cell_id": "a", "reason": "grow"},
                {"action": "try", "concurrency": 12, "cell_id": "b", "reason": "bisect"},
                {"action": "bracketed", "concurrency": None, "cell_id": None,
                 "reason": "the knee lies between concurrency 10 and 12"}]}  # fmt: skip
    assert knee_search_lines([ramp]) == [
        "knee search, cpu (num_rounds=5, isl=12000, osl=32): bracketed; ran concurrency 16, 12; "
        "the knee lies between concurrency 10 and 12"
    ]
    assert knee_search_lines(None) == []


def test_the_sweep_and_the_knee_search_give_one_verdict_per_tier() -> None:
    from kvoffload.analysis.capacity import Knee
    from kvoffload.report.build import knee_verdicts

    fixed = {"model": "m", "num_rounds": 5, "isl": 12000, "osl": "32"}
    head = "(num_rounds=5, isl=12000, osl=32)"
    common: dict[str, Any] = {"model": "m", "axis": "concurrency", "fixed": fixed, "status": "not_reached",
                              "bracket": None, "history_bracket_tokens": None, "points": []}  # fmt: skip
    flat_text = "knee not reached in the measured range"
    sweep = Knee(tier="gpu", criterion="later-round hit rate below 45 %", **common,
                 statement=f"gpu {head}: {flat_text}, up to concurrency 12")  # fmt: skip
    other = Knee(tier="cpu", criterion="c", **common,
                 statement=f"cpu {head}: knee not reached in the measured range")  # fmt: skip
    last = {"action": "bracketed", "concurrency": None, "cell_id": None,
            "reason": "the knee lies between concurrency 8 (within p95 <= 1 s) and 12"}  # fmt: skip
    flat = {"action": "not_reached", "concurrency": None, "cell_id": None, "reason": "up to 32"}
    ramps = [
        {"tier": "gpu", "num_rounds": 5, "isl": 12000, "osl": "32", "node": "kvlab2", "outcome": "bracketed",
         "bracket": [8, 12], "steps": [last]},
        {"tier": "cpu", "num_rounds": 5, "isl": 12000, "osl": "32", "outcome": "not_reached", "bracket": None,
         "steps": [flat]},
    ]  # fmt: skip
    lines = knee_verdicts([sweep, other], ramps)
    assert len(lines) == 2  # one per tier, not four
    gpu = lines[0]
    assert gpu.startswith(
        f"gpu {head}: the knee search on node kvlab2 bracketed the knee between concurrency 8 and 12"
    )
    assert "knee not reached" not in gpu and "so the search's limit binds first" in gpu
    assert lines[1].endswith(
        "knee not reached in the measured range; the knee search ended not_reached: up to 32"
    )


def test_findings_text_is_the_reports_first_section(campaign: Path) -> None:
    built = write_report(campaign)
    md = (campaign / "report" / "report.md").read_text()
    text = findings_text(built.finding_groups, built.turn_statements)
    assert built.path == campaign / "report" / "index.html"
    lines = text.splitlines()
    assert lines[0] == "Findings:"
    # every statement of the Markdown's findings section, in its order, one per line
    section = md[md.index("## Findings") : md.index("## Capacity")]
    statements = [line[2:] for line in section.splitlines() if line.startswith("- ")]
    assert [line[4:] for line in lines if line.startswith("  - ")] == statements
    # group b is not comparable (fixture README): its title says so
    titles = [line.strip() for line in lines if line.startswith("  ") and not line.startswith("  - ")]
    assert titles[2:] == (["Where each turn's prompt came from"] if built.turn_statements else [])
    assert len(titles[:2]) == 2 and titles[1].endswith("(not comparable)") and "(not" not in titles[0]
    assert findings_text([]) == "Findings: no comparison group has a measured cell.\n"


def test_the_report_compares_the_runs_estimate_with_what_it_measured(campaign: Path) -> None:
    from kvoffload.report.build import timing_table
    from kvoffload.report.views import fmt

    estimate = {
        "total_s": 600.0,
        "phases": {"install": 240.0, "engine_start": 60.0, "replay": 120.0, "overhead": 120.0},
        "priors": {"sources": {"install_s": "default", "request_s": "profile tiny"}},
        "replay_model": "each cell's virtual users played as the replay's closed loop",
        "knee_search": {"cells": 6, "total_s": 300.0, "ramps": []},
        "measured": {
            "phases": {"install": 300.0, "engine_start": 30.0, "replay": 180.0, "overhead": 90.0},
            "total_s": 720.0,
            "wall_s": 960.0,
            "knee_search": {"cells": 4, "total_s": 240.0},
        },
    }
    table = timing_table({"estimate": estimate})
    assert table is not None
    rows = {r[0]: r[1:] for r in table.rows}
    # minutes, and estimated over measured: 240/300, 60/30, 120/180, 120/90
    assert rows["install (once per node)"] == ["4.0", "5.0", "0.80"]
    assert rows["engine starts"] == ["1.0", "0.5", "2.00"]
    assert rows["replays"][2] == "0.67"
    # issue 43, defect 11: like with like. The run's 960 s held a knee search of 240 s that the 600 s
    # left out (before, the row read 960 s against 600); the knee search beside its worst case
    assert rows["wall time of the campaign's cells (with the run's start)"] == ["10.0", "12.0", "0.83"]
    assert rows["knee search (worst case 6 cell(s), ran 4)"] == ["5.0", "4.0", "1.25"]
    assert "request profile tiny" in table.note and "closed loop" in table.note
    assert timing_table({}) is None and timing_table({"estimate": {"total_s": 1.0}}) is None
    # a campaign.json of before: its wall time may hold a knee search the estimate never had
    old = {**estimate, "measured": {"phases": estimate["measured"]["phases"], "total_s": 960.0}}
    old.pop("knee_search")
    before = timing_table({"estimate": old, "knee_search": [{}]})
    assert before is not None
    old_rows = {r[0]: r[1:] for r in before.rows}
    assert old_rows["wall time of the run (knee search included)"] == ["10.0", fmt(None), fmt(None)]
    meta = json.loads((campaign / "campaign.json").read_text())
    (campaign / "campaign.json").write_text(json.dumps({**meta, "estimate": estimate}))
    build_report(campaign)
    md = (campaign / "report" / "report.md").read_text()
    assert (
        "### Run time: estimate against measured" in md
        and "| wall time of the campaign's cells (with the run's start) | 10.0 | 12.0 | 0.83 |" in md
    )
    assert "**estimate**" not in md  # not dumped among the settings


def _hub_snapshot(cache: Path, model: str, revision: str, config: dict[str, Any], *, main: bool) -> Path:
    """A model's config.json laid out as huggingface_hub caches it: models--org--name/snapshots/<rev>/."""
    repo = cache / ("models--" + model.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    if main:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(revision)
    return snapshot / "config.json"


def test_a_hub_id_models_kv_bytes_come_from_the_hugging_face_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cell whose model is a hub id (engine vllm, TP 2) on a controller that cached its config.json:
    131072 B per token, and the source names the cache; main looked for a folder named `org/name` only."""
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    path = _hub_snapshot(cache, "meta-llama/Llama-3.1-8B", "abc123", LLAMA_8B, main=True)
    _hub_snapshot(
        cache, "meta-llama/Llama-3.1-8B", "old999", {**LLAMA_8B, "num_hidden_layers": 1}, main=False
    )
    monkeypatch.chdir(tmp_path)  # no folder of that name here
    config = {"model": "meta-llama/Llama-3.1-8B", "engine": "vllm", "tier": "cpu"}
    s = _kv_bytes_input(config)
    assert s.value == 131072
    assert str(path) in s.source and f"Hugging Face hub cache {cache}" in s.source  # refs/main's snapshot
    # the campaign's --kv-cache-dtype fp8 halves it; TP past the 8 KV heads copies them (16 ranks: x 2)
    assert _kv_bytes_input({**config, "extra_engine_args": ["--kv-cache-dtype", "fp8"]}).value == 65536
    assert _kv_bytes_input(config, [16]).value == 262144
    missing = _kv_bytes_input({**config, "model": "meta-llama/Other"})
    assert missing.value is None and "nor in the Hugging Face hub cache" in missing.source


def test_capacity_inputs_size_the_model_config_for_the_cells_tensor_parallel_size(tmp_path: Path) -> None:
    """cell.json `targets` carry each replica's GPUs: a TP-16 replica of an 8-KV-head model holds 16 heads
    (262144 B a token); a target without GPUs (an older file) leaves the model's 8 (131072 B)."""
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_8B))
    wide = ",".join(str(i) for i in range(16))
    rows = [
        {
            "cell_id": cid,
            "tier": "cpu",
            "config": json.dumps({"model": str(folder), "engine": "vllm", "tier": "cpu"}),
            "targets": json.dumps({"vllm-gpu1-0": {"kind": "vllm", "host": "gpu1", **gpus}}),
            "hosts": "{}",
            "l2_device": None,
        }
        for cid, gpus in (("tp16", {"gpus": wide}), ("older", {}))
    ]
    empty = pd.DataFrame()
    kv, _, _ = capacity_inputs(
        Tables(cells=pd.DataFrame(rows), requests=empty, sessions=empty, samples=empty)
    )
    assert kv["tp16"].value == 262144 and "from the model folder" in kv["tp16"].source
    assert kv["older"].value == 131072


def test_capacity_inputs_bound_the_profiles_l1_by_the_smallest_lmcache_host(tmp_path: Path) -> None:
    """Issue 53: the cpu profile's 64 GiB L1 (what the DRAM cost is priced from when the server gives no
    pool size) on lmcache hosts of 23.5 and 128 GiB is bounded by the smaller, 23.5 GiB; nvme's 8 GiB
    fits and stays as the profile states it."""

    def cell(cid: str, tier: str, host: str) -> dict[str, Any]:
        return {
            "cell_id": cid,
            "tier": tier,
            "config": json.dumps({"model": "m", "engine": "sim", "sim_profile": "tiny", "tier": tier}),
            "targets": json.dumps({"lmcache": {"kind": "lmcache", "host": host}}),
            "hosts": json.dumps({"small": {"ram_gib": 23.5}, "big": {"ram_gib": 128}}),
            "l2_device": None,
        }

    empty = pd.DataFrame()
    cells = pd.DataFrame([cell("c1", "cpu", "big"), cell("c2", "cpu", "small"), cell("n1", "nvme", "small")])
    _, profile_l1, _ = capacity_inputs(Tables(cells=cells, requests=empty, sessions=empty, samples=empty))
    assert profile_l1["cpu"].value == 23.5 and profile_l1["cpu"].unit == "GiB"
    assert profile_l1["cpu"].source.startswith(
        "kvoffload/profiles/lmcache/cpu.yaml l1_size_gb = 64 GiB, more than the 23.5 GiB of memory of small, "
        "the lmcache-server host of cell c2"
    )
    assert profile_l1["nvme"].value == 8.0
    assert profile_l1["nvme"].source == "kvoffload/profiles/lmcache/nvme.yaml l1_size_gb"


def test_the_staged_models_folder_is_the_one_the_vllm_role_fills(tmp_path: Path) -> None:
    assert Path(str(REMOTE_MODELS)) == STAGED_MODELS
    staged = tmp_path / "models"
    (staged / "org--name").mkdir(parents=True)
    (staged / "org--name" / "config.json").write_text("{}")
    found = find_model_config("org/name", cache=tmp_path / "empty-cache", staged=staged)
    assert found is not None and found.path == staged / "org--name" / "config.json"
    assert "staged copy" in found.where
    assert find_model_config("org/none", cache=tmp_path / "empty-cache", staged=staged) is None
