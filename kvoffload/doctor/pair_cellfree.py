"""The cell-free pair check's verdict (pure: the node's JSON in, a `Check` out; no IO, no ansible).

kvoffload/doctor/pair_node.py ran LMCache's own server and LMCache's own MP client (`lmcache bench
server`) as two transient units with the engine units' [Service] keys, no model, no cell; this module
reads what it brought back:
- the bench's output: per sequence, the MD5 digest of the KV it stored (cold pass) and of the KV it
  retrieved into zeroed blocks (warm pass), and its JSON summary (lmcache 0.5.6 wheel,
  lmcache/cli/commands/bench/server_bench/client.py `compute_checksums` logs `[seq N/cold] CHECKSUM:
  <digest> (<k> chunks)`; cases/baseline.py logs `[seq N] CHECKSUM MATCH OK` or `MISMATCH!`;
  command.py `_emit_server_bench_metrics` prints `results` with total_requests, checksum_ok and
  checksum_fail, and exits 0 whatever they say, so the digests are compared here);
- with an L2, a second bench run after L1 was emptied: its warm digests must equal the first run's
  cold ones (the bench's KV comes from a fixed seed), and the server must count L2 hits;
- the server's live metric names against the analysis's (kvoffload/analysis/names.py): a name it
  exports that the analysis does not know is a rename the report would read as "unknown", and a family
  this check's own store and retrieve must create that is absent is the same rename seen from the
  other side;
- the server process as the kernel ran it (no new privileges, no capabilities, LMCache's compiled
  modules mapped).
What only a GPU host shows, CUDA init in both sandboxes, CUDA IPC between the two units and a pinned
L1, is "not exercised on a CPU build" in the facts and the detail, never ok.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvoffload.analysis import names as N
from kvoffload.doctor.journal import first_error_line, last_words
from kvoffload.doctor.verdict import Check, Status
from kvoffload.metrics.samples import parse_exposition

NAME = "pair_cellfree"
NOT_ON_CPU = "not exercised on a CPU build"
# The parts only a CUDA host exercises, as the facts name them
GPU_PARTS = {
    "cuda_init": "CUDA init in both sandboxed units",
    "cuda_ipc": "CUDA IPC between the two units",
    "pinned_l1": "a pinned L1 under the unit's NUMA policy and LimitMEMLOCK",
}
# The server's families this check's own traffic creates (LMCache creates a counter at its first
# update): after a store and a retrieve through L1, and after a retrieve served from L2
L1_WRITES = "lmcache_mp_l1_write_chunks_total"
L1_READS = "lmcache_mp_l1_read_chunks_total"
LOOKUPS = "lmcache_mp_lookups_requests_total"
EXPECTED_L1 = (
    L1_WRITES,
    L1_READS,
    LOOKUPS,
    *N.LMC_LOOKUP_REQUESTED,
    *N.LMC_LOOKUP_HIT,
    *N.LMC_LOOKUP_HIT_L1,
    *N.LMC_L1_USAGE_BYTES,
)
EXPECTED_L2 = (*N.LMC_L2_STORED, *N.LMC_L2_LOADED, *N.LMC_LOOKUP_HIT_L2)
# LMCache's compiled module every server loads (the CPU build too); lmcache_fs with an fs_native L2
NATIVE = "lmcache_native"
# ... and the one a CUDA build needs for its transfers: LMCache 0.5.6 falls back to torch ops without a
# word when it does not load (issue 52), and lmcache_native has no torch-CUDA symbol to prove the pair
CUDA_OPS = "cuda_ops"
_FIX_ENGINE = "the engine venv's LMCache and torch do not fit together: reinstall the engine set (engine_set)"
_JOURNAL = "`journalctl -u 'kvoffload-doctor-pair-*'` on the node"

_CHECKSUM = re.compile(r"\[seq (\d+)/(cold|warm)\] CHECKSUM: ([0-9a-f]+) \((\d+) chunks\)")
_MATCH = re.compile(r"\[seq (\d+)\] CHECKSUM (MATCH OK|MISMATCH!)")
_LOOKUP = re.compile(r"\[seq (\d+)/(cold|warm)\] LOOKUP: (\d+)/(\d+) chunks hit")
_DEVICE = re.compile(r"\[rank \d+\] Allocated \d+ KV tensors on (\S+)")


@dataclass(frozen=True)
class BenchRun:
    """One `lmcache bench server` run as its output tells it."""

    name: str
    rc: int | None
    summary: Mapping[str, Any] | None
    digests: Mapping[tuple[int, str], str] = field(default_factory=dict)
    chunks: Mapping[tuple[int, str], int] = field(default_factory=dict)
    matched: Mapping[int, bool] = field(default_factory=dict)
    lookups: Mapping[tuple[int, str], tuple[int, int]] = field(default_factory=dict)
    device: str | None = None
    registered: bool = False
    error: str | None = None


def _summary(stdout: str) -> dict[str, Any] | None:
    """The bench's JSON summary (`--format json`): the block from a line `{` to the last line `}`."""
    lines = stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line == "{"]
    ends = [i for i, line in enumerate(lines) if line == "}"]
    if not starts or not ends or ends[-1] < starts[0]:
        return None
    try:
        parsed = json.loads("\n".join(lines[starts[0] : ends[-1] + 1]))
    except ValueError:
        return None
    results = (parsed.get("metrics") or {}).get("results") if isinstance(parsed, dict) else None
    return dict(results) if isinstance(results, dict) else None


def parse_bench(raw: Mapping[str, Any]) -> BenchRun:
    """A bench run from the node's record of it (`rc`, `stdout`, `stderr_tail`)."""
    out = str(raw.get("stdout") or "")
    rc = raw.get("rc")
    digests: dict[tuple[int, str], str] = {}
    chunks: dict[tuple[int, str], int] = {}
    for seq, kind, digest, count in _CHECKSUM.findall(out):
        digests[(int(seq), kind)] = digest
        chunks[(int(seq), kind)] = int(count)
    device = _DEVICE.search(out)
    error = None
    if rc != 0:
        error = first_error_line(f"{out}\n{raw.get('stderr_tail') or ''}") or (
            f"exit status {rc}: {str(raw.get('stderr_tail') or '').strip()[-300:]}"
        )
    return BenchRun(
        name=str(raw.get("name", "?")),
        rc=rc if isinstance(rc, int) else None,
        summary=_summary(out),
        digests=digests,
        chunks=chunks,
        matched={int(seq): verdict == "MATCH OK" for seq, verdict in _MATCH.findall(out)},
        lookups={(int(s), k): (int(h), int(t)) for s, k, h, t in _LOOKUP.findall(out)},
        device=device.group(1) if device else None,
        registered="REGISTER_KV_CACHE: OK" in out,
        error=error,
    )


def l1_problems(run: BenchRun, sequences: int, chunks: int) -> list[str]:
    """What keeps the first run from proving a byte-exact store -> L1 -> retrieve (empty: nothing):
    every sequence stored cold (a full miss), hit in full warm, and its retrieved digest equals its
    stored one, as the bench's own summary must also say."""
    if run.error is not None:
        return [f"the bench failed: {run.error}"]
    out = []
    if not run.registered:
        out.append("the bench never registered its KV cache with the server")
    for seq in range(sequences):
        cold, warm = run.digests.get((seq, "cold")), run.digests.get((seq, "warm"))
        if cold is None or warm is None:
            out.append(f"sequence {seq}: no {'cold' if cold is None else 'warm'} checksum")
        elif cold != warm:
            out.append(f"sequence {seq}: retrieved KV digest {warm} differs from the stored {cold}")
        elif run.chunks.get((seq, "warm")) != chunks:
            out.append(f"sequence {seq}: {run.chunks.get((seq, 'warm'))} chunks compared, not {chunks}")
        if run.lookups.get((seq, "cold"), (None, None))[0] != 0:
            out.append(f"sequence {seq}: the cold lookup was no miss {run.lookups.get((seq, 'cold'))}")
        if run.lookups.get((seq, "warm")) != (chunks, chunks):
            out.append(
                f"sequence {seq}: the warm lookup hit {run.lookups.get((seq, 'warm'))} chunks, not all"
            )
        if seq in run.matched and not run.matched[seq]:
            out.append(f"sequence {seq}: the bench says CHECKSUM MISMATCH")
    summary = run.summary or {}
    if (summary.get("total_requests"), summary.get("checksum_ok"), summary.get("checksum_fail")) != (
        sequences,
        sequences,
        0,
    ):
        out.append(
            f"the bench's summary says {summary.get('checksum_ok')} of {summary.get('total_requests')} "
            f"checksums ok, {summary.get('checksum_fail')} failed (expected {sequences} of {sequences})"
        )
    return out


def l2_problems(first: BenchRun, second: BenchRun, sequences: int) -> list[str]:
    """What keeps the second run (L1 emptied before it) from proving a byte-exact retrieve from L2: its
    warm digest of each sequence must equal the first run's cold (stored) digest."""
    if second.error is not None:
        return [f"the bench's run after L1 was emptied failed: {second.error}"]
    out = []
    for seq in range(sequences):
        stored, back = first.digests.get((seq, "cold")), second.digests.get((seq, "warm"))
        if back is None:
            out.append(f"sequence {seq}: nothing retrieved after L1 was emptied")
        elif stored != back:
            out.append(f"sequence {seq}: KV retrieved from L2 has digest {back}, stored was {stored}")
    return out


def metric_values(text: str) -> dict[str, float]:
    """Sample name -> sum over its label sets (histograms by their _sum/_count/_bucket samples)."""
    out: dict[str, float] = {}
    for s in parse_exposition(text, "lmcache", 0.0):
        out[s.name] = out.get(s.name, 0.0) + (s.value or 0.0)
    return out


def name_diff(present: Iterable[str], expected: Sequence[str]) -> tuple[list[str], list[str]]:
    """(names the server exports that the analysis does not know, expected families absent)."""
    names = set(present)
    return N.lmcache_unknown_names(names), sorted(set(expected) - names)


def _gpu_parts(facts: Mapping[str, Any], run: BenchRun, moved: bool) -> dict[str, str]:
    """The CUDA parts' standing: on a CPU build not exercised; on a CUDA build shown by a gpu-mode
    bench whose KV lived on a CUDA device and came back byte-exact through the server."""
    if facts.get("mode") != "gpu":
        return dict.fromkeys(GPU_PARTS, NOT_ON_CPU)
    on_cuda = bool(run.device and run.device.startswith("cuda"))
    proc = ((facts.get("server") or {}).get("process") or {}).get("status") or {}
    shown = on_cuda and moved
    return {
        "cuda_init": f"ok: the bench's KV on {run.device}, the server mapped it" if shown else "fail",
        "cuda_ipc": "ok: stored and retrieved through CUDA IPC handles" if shown else "fail",
        "pinned_l1": (
            f"ok: the CUDA build pins L1; VmLck {proc.get('VmLck', '?')}, VmPin {proc.get('VmPin', '?')}"
            if shown
            else "fail"
        ),
    }


def _process_problems(facts: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(problems, LMCache modules mapped) of the server process as the kernel ran it."""
    proc = (facts.get("server") or {}).get("process") or {}
    status = proc.get("status") or {}
    mapped = [m.split(".")[0] for m in proc.get("mapped") or [] if not m.startswith("libtorch")]
    out = []
    if status and status.get("NoNewPrivs") != "1":
        out.append(
            f"the server ran with NoNewPrivs {status.get('NoNewPrivs')}, not 1: not the units' sandbox"
        )
    if status and status.get("CapEff", "0").strip("0"):
        out.append(f"the server ran with capabilities {status.get('CapEff')}: not the units' sandbox")
    if proc and NATIVE not in mapped:
        out.append(f"LMCache's compiled {NATIVE} module is not loaded in the server")
    if proc and facts.get("mode") == "gpu" and CUDA_OPS not in mapped:
        out.append(
            f"LMCache's compiled {CUDA_OPS} module is not loaded in the server on a CUDA build: LMCache "
            "moves "
            "KV with torch ops instead (an engine set whose torch LMCache was not built for)"
        )
    return out, sorted(set(mapped))


def judge(facts: Mapping[str, Any]) -> Check:
    """The check's verdict from one node's answer (kvoffload/doctor/pair_node.py)."""
    if facts.get("skip"):
        return Check(NAME, Status.SKIP, str(facts["skip"]))
    if facts.get("error") and not facts.get("passes"):
        server = facts.get("server") or {}
        journal = str(server.get("journal") or "")
        said = first_error_line(journal) or last_words(journal, str(server.get("unit") or ""))
        return Check(
            NAME,
            Status.FAIL,
            f"{facts.get('stage', 'start')}: {facts['error']}"
            + (f"; the server logged: {said}" if said else ""),
            f"{_JOURNAL} says why; the engines' units have the same keys and would fail the same way",
            _summary_facts(facts, {}),
        )
    sequences = int(facts.get("sequences") or 0)
    chunks = int(facts.get("chunks_per_sequence") or 0)
    runs = [parse_bench(p) for p in facts.get("passes") or []]
    parts: dict[str, str] = {}
    problems: list[str] = []

    def part(name: str, found: list[str], ok: str) -> None:
        parts[name] = "fail: " + "; ".join(found) if found else f"ok: {ok}"
        problems.extend(found)

    first = runs[0] if runs else BenchRun("l1", None, None, error="no bench run")
    proc_problems, mapped = _process_problems(facts)
    part("sandboxed_units", proc_problems, "both units ran with the engine units' [Service] keys")
    part(
        "compiled_ops",
        [],
        f"LMCache's {', '.join(mapped) or 'modules'} loaded in the sandboxed server"
        if mapped
        else "the server and the bench imported LMCache",
    )
    part(
        "store_retrieve_l1",
        l1_problems(first, sequences, chunks),
        f"{sequences} sequences x {chunks} chunks stored and retrieved byte-exact (MD5 per chunk)",
    )
    l2 = facts.get("l2") or {}
    metrics = metric_values(str(facts.get("metrics_text") or ""))
    expected: list[str] = list(EXPECTED_L1)
    if l2.get("path"):
        second = runs[1] if len(runs) > 1 else BenchRun("l2", None, None, error="no run after L1 was emptied")
        found = l2_problems(first, second, sequences)
        hits = metrics.get(N.LMC_LOOKUP_HIT_L2[0], 0.0)
        if not found and not hits:
            found = [f"the server counted no L2 hit ({N.LMC_LOOKUP_HIT_L2[0]} 0) after L1 was emptied"]
        part(
            "store_retrieve_l2",
            found,
            f"after L1 was emptied the same KV came back byte-exact from L2 ({hits:.0f} L2-hit tokens)",
        )
        expected += EXPECTED_L2
    else:
        parts["store_retrieve_l2"] = f"skip: {l2.get('why_not') or 'no L2 on this host'}"
    if metrics:
        unknown, missing = name_diff(metrics, expected)
        found = []
        if unknown:
            found.append(f"the server exports names the analysis does not know: {', '.join(unknown)}")
        if missing:
            found.append(f"families a store and retrieve create are absent: {', '.join(missing)}")
        part("metric_names", found, f"{len(metrics)} live names, all known to kvoffload/analysis/names.py")
    else:
        part("metric_names", ["no /metrics read from the server"], "")
    if facts.get("error"):
        problems.append(f"{facts.get('stage')}: {facts['error']}")
    moved = not l1_problems(first, sequences, chunks)
    parts.update(_gpu_parts(facts, first, moved))
    for name in GPU_PARTS:
        if parts[name] == "fail":
            problems.append(f"{GPU_PARTS[name]} not shown by a gpu-mode bench")
    summary = _summary_facts(facts, parts)
    if problems:
        return Check(
            NAME,
            Status.FAIL,
            "; ".join(problems),
            f"{_JOURNAL} and the bench's output in doctor/pair_cellfree.json say more"
            + (f"; {_FIX_ENGINE}" if any("compiled" in p for p in problems) else ""),
            summary,
        )
    gpu_note = (
        f"; {NOT_ON_CPU}: {', '.join(GPU_PARTS.values())}"
        if facts.get("mode") != "gpu"
        else "; CUDA init in both units, CUDA IPC and the pinned L1 shown"
    )
    return Check(
        NAME,
        Status.OK,
        f"lmcache server and lmcache bench server ran as two units with the engines' [Service] keys: "
        f"{parts['store_retrieve_l1'][4:]}; L2 {parts['store_retrieve_l2']}; "
        f"{parts['compiled_ops'][4:]}; metric names known{gpu_note}",
        facts=summary,
    )


def _summary_facts(facts: Mapping[str, Any], parts: Mapping[str, str]) -> dict[str, Any]:
    """What doctor.json keeps beside the verdict (the node's full answer is in pair_cellfree.json)."""
    server = facts.get("server") or {}
    return {
        "mode": facts.get("mode"),
        "parts": dict(parts),
        "byte_exact": bool(parts) and str(parts.get("store_retrieve_l1", "")).startswith("ok"),
        "l2": (facts.get("l2") or {}).get("path"),
        "applied": server.get("applied"),
        "process": server.get("process"),
        "start_seconds": server.get("start_seconds"),
        "seconds": facts.get("seconds"),
    }


def check(facts: Mapping[str, Any] | None, pair_here: bool, why_not: str | None = None) -> Check:
    """The check on one host: its verdict with the node's answer, else why it did not run."""
    if not pair_here:
        return Check(NAME, Status.SKIP, "no vLLM/LMCache pair on this host")
    if facts is None:
        return Check(NAME, Status.SKIP, f"not run: {why_not or '--no-pair-check'}")
    return judge(facts)
