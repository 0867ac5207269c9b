"""The vLLM/LMCache pair's smoke check, judged from what the round trip collected (pure: JSON in, a
`Check` out; no IO, no HTTP, no ansible).

LMCache's MP-mode quickstart verifies a pair in four steps: the server runs, the replica registers its
KV caches with it, a first request of a repeated prompt is stored and the same request again is
retrieved. The doctor checks the same four by the servers' own counters and status instead of log
lines (kvoffload/orchestrate/checks/round_trip.py collects them):
- started: lmcache-server and one replica came up through the cell's roles and units (else `error`);
- registered: the server's GET /status lists every rank of the replica. LMCache 0.5.6 lists worker
  instances (`registered_gpu_ids` on CUDA, `registered_non_cuda_instance_ids` on vLLM's CPU build), and
  each tensor-parallel rank is a worker of its own with its own random instance id (lmcache 0.5.6
  wheel, lmcache/integration/vllm/vllm_multi_process_adapter.py: `instance_id = uuid.uuid4()...` per
  worker adapter; /status from lmcache/v1/multiprocess/modules/lmcache_driven_transfer.py
  `report_status`, one entry per instance), so a TP-2 replica is two entries: ranks and replicas are
  counted apart, against the ranks of the one replica the smoke starts. More entries than its ranks are
  registrations the server still holds from an earlier process (one that died before its first
  request stays until --worker-registration-grace-seconds): a warning. A server whose /status has
  neither key (the simulator) leaves it to the store, which no unregistered replica can make;
- stored: after the first request `lmcache_mp_l1_write_chunks` rose (chunks written to L1), and the
  connector asked the server (`lmcache_mp_lookups_requests` rose);
- retrieved: after the replica's own prefix cache was emptied (POST /reset_prefix_cache, local only),
  the second request hit in LMCache (`lmcache_mp_lookup_hit_tokens`) and vLLM counted those tokens as
  external hits (`vllm:external_prefix_cache_hits`): the KV came back through the connector.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvoffload.doctor.verdict import Check, Status
from kvoffload.tiers import LMCACHE_REGISTRATION_GRACE_S

NAME = "smoke_pair"
# Counter families as kvoffload/orchestrate/cell/watch.py `scrape` names them (without `_total`)
L1_WRITES = "lmcache_mp_l1_write_chunks"
LOOKUPS = "lmcache_mp_lookups_requests"
HIT_TOKENS = "lmcache_mp_lookup_hit_tokens"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits"
LOCAL_HITS = "vllm:prefix_cache_hits"
# What the round trip keeps of each scrape: the families judged here
LMCACHE_FAMILIES = (L1_WRITES, LOOKUPS, HIT_TOKENS, "lmcache_mp_l1_read_chunks")
VLLM_FAMILIES = (EXTERNAL_HITS, LOCAL_HITS, "vllm:prompt_tokens")
# The stages at which both servers are scraped
STAGES = ("before", "after_first", "after_second")

_JOURNAL = "`journalctl -u kvoffload-lmcache -u kvoffload-vllm@<index>` on the node"
# A replica that registered its KV cache and died before its first request (its heartbeat starts with
# that request) stays registered, its KV pool mapped by the server, for the registration grace
# (kvoffload/profiles/resolve.py LMCACHE_REGISTRATION_GRACE_S): its restarts find the GPU memory taken.
_STALE = (
    "the registration (and the mapped KV pool) of a replica process that died before its first "
    f"request, for up to {LMCACHE_REGISTRATION_GRACE_S} s (--worker-registration-grace-seconds)"
)


def _delta(series: Mapping[str, Any], family: str, start: str, end: str) -> float | None:
    """`family` at stage `end` minus at `start` (an absent start reads 0: a counter not yet created);
    None when `end` lacks it."""
    then, now = series.get(start) or {}, series.get(end) or {}
    if family not in now:
        return None
    return float(now[family]) - float(then.get(family, 0.0))


def _registered_ranks(status: Mapping[str, Any]) -> int | None:
    """Worker instances (one per tensor-parallel rank) the server lists as registered; None when its
    /status does not say."""
    keys = ("registered_gpu_ids", "registered_non_cuda_instance_ids")
    if not any(k in status for k in keys):
        return None
    return len({i for k in keys for i in status.get(k) or []})


def _fail(detail: str, fix: str, facts: Mapping[str, Any]) -> Check:
    return Check(NAME, Status.FAIL, detail, fix, facts)


def judge(facts: Mapping[str, Any]) -> Check:
    """The smoke check's verdict from one node's round trip (`facts`: orchestrate/checks/round_trip.py
    `round_trip`,
    with the bring-up's `error` when it never got that far)."""
    summary = summarize(facts)
    if facts.get("error"):
        stage = facts.get("stage", "smoke")
        held = (
            f"; a replica that restarts while starting may be kept down by {_STALE}: its restarts "
            "cannot get that GPU memory back, stop lmcache-server with it (`kvoffload-lab teardown "
            "INVENTORY`) before trying again"
            if stage == "start"
            else ""
        )
        # the replica's own first error line, from the journal the teardown kept
        # (orchestrate/checks/round_trip.py)
        said = f"; the replica's journal: {facts['journal_error']}" if facts.get("journal_error") else ""
        return _fail(
            f"{stage}: {facts['error']}{said}",
            f"{_JOURNAL} says why; `run` would fail its first offload cell the same way{held}",
            summary,
        )
    registered, ranks, per_replica = summary["registered"], summary["registered_ranks"], summary["ranks"]
    if ranks == 0:
        return _fail(
            "the replica answers /health but lmcache-server lists no registered replica (GET /status)",
            "the connector's lmcache.mp.host/port must reach the server's --port (profiles/engine, "
            f"roles/lmcache_server); {_JOURNAL}",
            summary,
        )
    if ranks is not None and ranks < per_replica:
        return _fail(
            f"lmcache-server lists {ranks} of the replica's {per_replica} tensor-parallel ranks as "
            "registered (GET /status): each rank registers its own KV cache",
            f"a rank whose registration failed logs why; {_JOURNAL}",
            summary,
        )
    chunk = summary["chunk_size"]
    prompts = summary["prompt_tokens"]
    if not prompts[0] or (chunk and prompts[0] < chunk):
        return _fail(
            f"the first request's prompt was {prompts[0]} tokens, less than one LMCache chunk "
            f"({chunk}): nothing could be stored, nothing is proven",
            "a model whose tokenizer makes the smoke prompt that short is not expected; report it",
            summary,
        )
    problems = _problems(summary)
    if problems:
        return _fail("; ".join(problems), f"{_JOURNAL} (LMCache logs each store and retrieve)", summary)
    if facts.get("stop_error"):
        return Check(
            NAME,
            Status.WARN,
            f"the round trip worked, but stopping the pair failed: {facts['stop_error']}",
            "`kvoffload-lab teardown INVENTORY` stops every kvoffload unit",
            summary,
        )
    if ranks is not None and ranks > per_replica:
        return Check(
            NAME,
            Status.WARN,
            f"the round trip worked, but lmcache-server lists {ranks} registered workers for the one "
            f"replica of {per_replica} rank(s) it serves: it still holds {_STALE}",
            "stop lmcache-server with the node's replicas before a campaign (`kvoffload-lab teardown "
            f"INVENTORY`); {_JOURNAL} shows the replica's earlier exit",
            summary,
        )
    return Check(
        NAME,
        Status.OK,
        f"lmcache-server up, {_registered_text(registered, ranks, per_replica)}; first request "
        f"({prompts[0]} tokens) "
        f"stored {summary['stored_chunks']:.0f} chunks; after the replica's prefix cache was emptied the "
        f"same request hit {summary['hit_tokens']:.0f} tokens in LMCache, "
        f"{summary['external_hits']:.0f} external hits in vLLM",
        facts=summary,
    )


def _registered_text(registered: int | None, ranks: int | None, per_replica: int) -> str:
    if registered is None or ranks is None:
        return "registration not listed by this server (the store proves the connector reached it)"
    if per_replica == 1:
        return f"{registered} replica registered"
    return f"{registered} replica registered ({ranks} tensor-parallel ranks, each its own worker)"


def _problems(summary: Mapping[str, Any]) -> list[str]:
    """What the counters say went wrong with the store and the retrieve (empty when both happened)."""
    out = []
    if not summary["lookups_first"]:
        out.append(
            f"the first request made no LMCache lookup ({LOOKUPS} did not rise): the replica does not "
            "consult the server"
        )
    if not summary["stored_chunks"]:
        out.append(f"the first request stored nothing ({L1_WRITES} did not rise)")
    if not summary["hit_tokens"]:
        out.append(f"the second request found nothing in LMCache ({HIT_TOKENS} did not rise)")
    if not summary["external_hits"]:
        out.append(f"vLLM loaded nothing through the connector ({EXTERNAL_HITS} did not rise)")
        if summary["local_hits_second"]:
            out.append(
                f"the second request hit {summary['local_hits_second']:.0f} tokens in the replica's own "
                "prefix cache instead: the reset before it did not empty it"
            )
    return out


def summarize(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The figures the verdict rests on (kept in doctor.json beside it)."""
    lm, vl = facts.get("lmcache") or {}, facts.get("vllm") or {}
    status = facts.get("status") or {}
    requests: Sequence[Mapping[str, Any]] = facts.get("requests") or []
    ranks = _registered_ranks(status)
    per_replica = int(facts.get("ranks") or 1)
    return {
        "node": facts.get("node"),
        "replica": facts.get("replica"),
        "lmcache": facts.get("lmcache_url"),
        # replicas with every rank registered (the smoke starts one), and the worker entries behind them
        "registered": None if ranks is None else ranks // per_replica,
        "registered_ranks": ranks,
        "ranks": per_replica,
        "chunk_size": status.get("chunk_size") or facts.get("chunk_size"),
        "prompt_tokens": [r.get("prompt_tokens") for r in requests] or [None],
        "lookups_first": _delta(lm, LOOKUPS, "before", "after_first"),
        "stored_chunks": _delta(lm, L1_WRITES, "before", "after_first"),
        "hit_tokens": _delta(lm, HIT_TOKENS, "after_first", "after_second"),
        "external_hits": _delta(vl, EXTERNAL_HITS, "after_first", "after_second"),
        "local_hits_second": _delta(vl, LOCAL_HITS, "after_first", "after_second"),
        "seconds": facts.get("seconds"),
    }
