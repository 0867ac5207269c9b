"""The pair smoke check on recorded answers: kvoffload/orchestrate/checks/round_trip.py `round_trip`
against an
httpx transport that serves real vLLM 0.32 / LMCache 0.5.6 captures (tests/fixtures/lmcache-0.5.6-cpu,
tests/fixtures/vllm-0.32-cpu) stage by stage, and kvoffload/doctor/smoke.py's verdicts on them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvoffload.doctor import checks as dc
from kvoffload.doctor import smoke as ds
from kvoffload.orchestrate.checks.round_trip import Pair, round_trip, smoke_messages

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LMC = FIXTURES / "lmcache-0.5.6-cpu"
VLLM = FIXTURES / "vllm-0.32-cpu"
REPLICA, CACHE = "http://10.0.0.1:8000", "http://10.0.0.1:8080"


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def bumped(text: str, family: str, by: float) -> str:
    """A recorded exposition with one counter sample raised by `by` (an edit, said where used)."""
    pattern = re.compile(rf"^({re.escape(family)}_total\{{[^}}]*\}}) ([0-9.e+]+)$", re.MULTILINE)
    assert pattern.search(text), family
    return pattern.sub(lambda m: f"{m.group(1)} {float(m.group(2)) + by}", text, count=1)


# Real texts in the order of a round trip. LMCache: before the first request, the capture after one
# replica's replay; after it, the capture after the second replica's (L1 writes 97 -> 244, lookups
# 84 -> 168); after the second request, that capture with 768 more hit tokens (edited: no capture was
# taken after one more hit). vLLM: a fresh replica's counters, then replica 1's with the connector
# (external hits 0), then replica 2's (21343 external hits: KV replica 1 stored in the shared server).
LMCACHE_OK = (
    _text(LMC / "metrics-fs_native-after-replay.txt"),
    _text(LMC / "metrics-fs_native-after-l2-loads.txt"),
    bumped(_text(LMC / "metrics-fs_native-after-l2-loads.txt"), "lmcache_mp_lookup_hit_tokens", 768),
)
VLLM_OK = (
    _text(VLLM / "metrics-before.txt"),
    _text(LMC / "vllm-0.32-cpu-with-lmcache-connector-metrics.txt"),
    _text(LMC / "vllm-0.32-cpu-replica2-external-hits-metrics.txt"),
)


class Servers:
    """Both servers' answers: each /metrics advances a stage when a chat request was made."""

    def __init__(
        self,
        lmcache: tuple[str, str, str] = LMCACHE_OK,
        vllm: tuple[str, str, str] = VLLM_OK,
        status: dict[str, Any] | None = None,
        prompt_tokens: int = 1100,
        reset: tuple[int, Any] = (200, {"success": True}),
        replica: str = REPLICA,
        cache: str = CACHE,
    ) -> None:
        self.replica, self.cache = replica, cache
        self.lmcache, self.vllm = lmcache, vllm
        self.status = status if status is not None else json.loads(_text(LMC / "status.json"))
        self.prompt_tokens = prompt_tokens
        self.reset = reset
        self.asked = 0  # chat requests so far: the stage the counters show
        self.bodies: list[dict[str, Any]] = []
        self.calls: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        self.calls.append(f"{request.method} {url}")
        if url == f"{self.cache}/status":
            return httpx.Response(200, json=self.status)
        if url == f"{self.cache}/metrics":
            return httpx.Response(200, text=self.lmcache[self.asked])
        if url == f"{self.replica}/metrics":
            return httpx.Response(200, text=self.vllm[self.asked])
        if url == f"{self.replica}/v1/chat/completions":
            self.asked += 1
            self.bodies.append(json.loads(request.content))
            usage = {"prompt_tokens": self.prompt_tokens, "prompt_tokens_details": {"cached_tokens": 0}}
            return httpx.Response(200, json={"choices": [], "usage": usage})
        if url == f"{self.replica}/reset_prefix_cache":
            return httpx.Response(self.reset[0], json=self.reset[1])
        return httpx.Response(404, text="not found")


def trip(servers: Servers, **kwargs: Any) -> dict[str, Any]:
    client = httpx.Client(transport=httpx.MockTransport(servers))
    sleeps: list[float] = []
    pair = Pair("gpu01", REPLICA, CACHE, "tiny", 256)
    kwargs = {"store_wait_s": 0, "reset_bound_s": 0, **kwargs}
    return round_trip(pair, client, nonce="n0", sleep=sleeps.append, **kwargs)


def test_a_store_then_a_retrieve_by_the_real_counters_is_ok() -> None:
    servers = Servers()
    facts = trip(servers)
    assert "error" not in facts
    verdict = ds.judge(facts)
    assert verdict.status == dc.Status.OK, verdict.detail
    assert verdict.detail == (
        "lmcache-server up, 1 replica registered; first request (1100 tokens) stored 147 chunks; after "
        "the replica's prefix cache was emptied the same request hit 768 tokens in LMCache, 21343 "
        "external hits in vLLM"
    )
    assert verdict.facts["lookups_first"] == 84
    # the same prompt twice, with the replica's own prefix cache emptied (not LMCache's) in between
    assert servers.bodies[0] == servers.bodies[1] and servers.bodies[0]["max_tokens"] == 1
    assert f"POST {REPLICA}/reset_prefix_cache" in servers.calls  # no reset_external
    resets = [c for c in servers.calls if "reset_prefix_cache" in c]
    assert servers.calls.index(resets[0]) > servers.calls.index(f"POST {REPLICA}/v1/chat/completions")


def test_the_prompt_fills_three_chunks_behind_its_nonce() -> None:
    [message] = smoke_messages(256, "n0")
    assert message["content"].startswith("kvoffload-lab doctor smoke check n0. Explain")
    assert len(message["content"].split()) >= 3 * 256  # a word is at least one token
    assert smoke_messages(256, "n1") != smoke_messages(256, "n0")


@pytest.mark.parametrize(
    ("servers", "says"),
    [
        # the first request wrote nothing and asked nothing: the same LMCache capture before and after
        (
            Servers(lmcache=(LMCACHE_OK[0], LMCACHE_OK[0], LMCACHE_OK[0])),
            "the first request made no LMCache lookup (lmcache_mp_lookups_requests did not rise): the "
            "replica does not consult the server; the first request stored nothing "
            "(lmcache_mp_l1_write_chunks did not rise); the second request found nothing in LMCache "
            "(lmcache_mp_lookup_hit_tokens did not rise)",
        ),
        # stored, but the second request found nothing: after L1 was cleared (the real capture after
        # POST /cache/clear carries the same counters) and vLLM counted no external hit
        (
            Servers(
                lmcache=(LMCACHE_OK[0], LMCACHE_OK[1], _text(LMC / "metrics-after-cache-clear-l1.txt")),
                vllm=(VLLM_OK[0], VLLM_OK[1], VLLM_OK[1]),
            ),
            "the second request found nothing in LMCache (lmcache_mp_lookup_hit_tokens did not rise); "
            "vLLM loaded nothing through the connector (vllm:external_prefix_cache_hits did not rise)",
        ),
        # LMCache hit, vLLM loaded nothing: its own prefix cache answered (a reset that did not empty it)
        (
            Servers(vllm=(VLLM_OK[0], VLLM_OK[1], bumped(VLLM_OK[1], "vllm:prefix_cache_hits", 1024))),
            "vLLM loaded nothing through the connector (vllm:external_prefix_cache_hits did not rise); "
            "the second request hit 1024 tokens in the replica's own prefix cache instead: the reset "
            "before it did not empty it",
        ),
    ],
)
def test_a_missing_store_or_retrieve_fails_naming_the_counter(servers: Servers, says: str) -> None:
    verdict = ds.judge(trip(servers))
    assert (verdict.status, verdict.detail) == (dc.Status.FAIL, says)
    assert "journalctl -u kvoffload-lmcache" in verdict.fix


def test_registration_is_read_from_the_servers_status() -> None:
    status = json.loads(_text(LMC / "status.json"))
    # a server that lists no replica fails, even before the counters are looked at
    nobody = ds.judge(trip(Servers(status={**status, "registered_non_cuda_instance_ids": []})))
    assert nobody.status == dc.Status.FAIL and nobody.detail.startswith("the replica answers /health but")
    assert "lmcache.mp.host/port" in nobody.fix
    # a CUDA replica's worker is listed by its instance id (a random 63-bit number, not a GPU index)
    cuda = {**status, "registered_gpu_ids": [4417385112405863721], "registered_non_cuda_instance_ids": []}
    assert ds.judge(trip(Servers(status=cuda))).facts["registered"] == 1
    # a /status without either key (the simulator's) leaves it to the store
    bare = {k: v for k, v in status.items() if not k.startswith("registered_")}
    verdict = ds.judge(trip(Servers(status=bare)))
    assert verdict.status == dc.Status.OK
    assert "registration not listed by this server (the store proves the connector reached it)" in (
        verdict.detail
    )


def _cuda_status(*instance_ids: int, world_size: int) -> dict[str, Any]:
    """The recorded /status (vLLM's CPU build) as a CUDA server lists workers: one entry per worker in
    `registered_gpu_ids` and `cache_context_meta` (lmcache 0.5.6 wheel,
    lmcache/v1/multiprocess/modules/lmcache_driven_transfer.py `report_status`), edited: no CUDA
    capture was taken."""
    status = json.loads(_text(LMC / "status.json"))
    meta = {"model_name": "tiny", "world_size": world_size, "kv_cache_layout": {"num_layers": 22}}
    return {
        **status,
        "registered_non_cuda_instance_ids": [],
        "non_cuda_context_meta": {},
        "registered_gpu_ids": list(instance_ids),
        "cache_context_meta": {str(i): meta for i in instance_ids},
    }


# two ranks of one TP-2 replica: each worker adapter draws its own instance id
RANK_IDS = (4417385112405863721, 731158236511702518)


def test_tensor_parallel_ranks_are_counted_apart_from_replicas() -> None:
    pair = Pair("gpu01", REPLICA, CACHE, "tiny", 256, ranks=2)
    client = httpx.Client(
        transport=httpx.MockTransport(Servers(status=_cuda_status(*RANK_IDS, world_size=2)))
    )
    facts = round_trip(pair, client, nonce="n0", store_wait_s=0, sleep=lambda _s: None)
    verdict = ds.judge(facts)
    assert verdict.status == dc.Status.OK, verdict.detail
    assert verdict.detail.startswith(
        "lmcache-server up, 1 replica registered (2 tensor-parallel ranks, each its own worker); "
    )
    facts = verdict.facts
    assert (facts["registered"], facts["registered_ranks"], facts["ranks"]) == (1, 2, 2)


def test_a_rank_that_did_not_register_fails_and_extra_registrations_warn() -> None:
    two_ranks = Pair("gpu01", REPLICA, CACHE, "tiny", 256, ranks=2)
    one = Servers(status=_cuda_status(RANK_IDS[0], world_size=2))
    client = httpx.Client(transport=httpx.MockTransport(one))
    verdict = ds.judge(round_trip(two_ranks, client, nonce="n0", store_wait_s=0, sleep=lambda _s: None))
    assert verdict.status == dc.Status.FAIL
    assert verdict.detail == (
        "lmcache-server lists 1 of the replica's 2 tensor-parallel ranks as registered (GET /status): each "
        "rank registers its own KV cache"
    )
    # one single-GPU replica, two workers listed: the server still holds an earlier process's registration
    stale = Servers(status=_cuda_status(*RANK_IDS, world_size=1))
    verdict = ds.judge(trip(stale))
    assert verdict.status == dc.Status.WARN
    assert verdict.detail == (
        "the round trip worked, but lmcache-server lists 2 registered workers for the one replica of 1 "
        "rank(s) it serves: it still holds the registration (and the mapped KV pool) of a replica process "
        "that died before its first request, for up to 2100 s (--worker-registration-grace-seconds)"
    )


def test_a_prompt_shorter_than_a_chunk_proves_nothing() -> None:
    verdict = ds.judge(trip(Servers(prompt_tokens=100)))
    assert verdict.status == dc.Status.FAIL
    assert verdict.detail.startswith("the first request's prompt was 100 tokens, less than one LMCache chunk")


@pytest.mark.parametrize(
    ("servers", "stage", "error"),
    [
        (Servers(reset=(404, {"detail": "Not Found"})), "prefix-cache reset", "VLLM_SERVER_DEV_MODE=1"),
        (Servers(reset=(200, {"success": False})), "prefix-cache reset", "{'success': false} for 0 s"),
        (Servers(status={}), "store", None),  # an empty /status is no error: the counters decide
    ],
)
def test_a_step_that_fails_is_named(servers: Servers, stage: str, error: str | None) -> None:
    facts = trip(servers)
    if error is None:
        assert "error" not in facts and ds.judge(facts).status == dc.Status.OK
        return
    assert facts["stage"] == stage and error in facts["error"]
    verdict = ds.judge(facts)
    assert verdict.status == dc.Status.FAIL and verdict.detail.startswith(f"{stage}: ")


def test_a_reset_refused_while_blocks_are_held_is_asked_again() -> None:
    servers = Servers()
    answers = iter([(200, {"success": False}), (200, {"success": False}), (200, {"success": True})])

    def held(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/reset_prefix_cache":
            code, body = next(answers)
            return httpx.Response(code, json=body)
        return servers(request)

    sleeps: list[float] = []
    client = httpx.Client(transport=httpx.MockTransport(held))
    pair = Pair("gpu01", REPLICA, CACHE, "tiny", 256)
    facts = round_trip(pair, client, nonce="n0", store_wait_s=0, sleep=sleeps.append)
    assert "error" not in facts and sleeps == [0.5, 0.5]
    assert ds.judge(facts).status == dc.Status.OK


def test_an_unreachable_server_and_a_failed_bring_up_fail_with_their_stage() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused", request=request)

    client = httpx.Client(transport=httpx.MockTransport(refuse))
    facts = round_trip(Pair("gpu01", REPLICA, CACHE, "tiny", 256), client, store_wait_s=0)
    assert (facts["stage"], facts["error"]) == ("status", "ConnectError: Connection refused")
    deploy = {"node": "gpu01", "stage": "start", "error": "gpu01: 'Wait for replica 0 healthy' failed"}
    verdict = ds.judge(deploy)
    assert verdict.status == dc.Status.FAIL
    assert verdict.detail == "start: gpu01: 'Wait for replica 0 healthy' failed"
    assert "`run` would fail its first offload cell the same way" in verdict.fix
    # a replica that died while starting may be held down by its own earlier registration
    assert verdict.fix.endswith(
        "; a replica that restarts while starting may be kept down by the registration (and the mapped "
        "KV pool) of a replica process that died before its first request, for up to 2100 s "
        "(--worker-registration-grace-seconds): its restarts cannot get that GPU memory back, stop "
        "lmcache-server with it (`kvoffload-lab teardown INVENTORY`) before trying again"
    )
    assert "grace" not in ds.judge({**deploy, "stage": "install"}).fix


def test_a_pair_left_running_warns() -> None:
    facts = {**trip(Servers()), "stop_error": "gpu01: 'Stop the cell's units' failed"}
    verdict = ds.judge(facts)
    assert verdict.status == dc.Status.WARN and "kvoffload-lab teardown" in verdict.fix


def test_the_store_is_waited_for_within_its_bound() -> None:
    """LMCache stores after the prefill: the first scrapes may not show it yet."""
    servers = Servers()
    late = iter([LMCACHE_OK[0], LMCACHE_OK[0], LMCACHE_OK[1]])  # the stage after the first request

    def lagging(request: httpx.Request) -> httpx.Response:
        if str(request.url) == f"{CACHE}/metrics" and servers.asked == 1:
            return httpx.Response(200, text=next(late))
        return servers(request)

    client = httpx.Client(transport=httpx.MockTransport(lagging))
    sleeps: list[float] = []
    facts = round_trip(
        Pair("gpu01", REPLICA, CACHE, "tiny", 256), client, nonce="n0", store_wait_s=60, sleep=sleeps.append
    )
    assert sleeps == [0.5, 0.5]  # two scrapes without the store, the third with it
    assert ds.judge(facts).status == dc.Status.OK


def test_smoke_pair_without_a_round_trip_says_why() -> None:
    assert dc.smoke_pair(None, "sim", True).detail == "no vLLM/LMCache pair on this host"
    skipped = dc.smoke_pair(None, "vllm", True)
    assert (skipped.status, skipped.detail) == (
        dc.Status.SKIP,
        "server start, registration and store/retrieve round trip not run: --no-smoke",
    )
    failed_first = dc.smoke_pair(None, "vllm", True, why_not="a check above failed")
    assert failed_first.detail.endswith("not run: a check above failed")
    ok = dc.smoke_pair(None, "vllm", True, trip(Servers()))
    assert ok.status == dc.Status.OK and ok.name == "smoke_pair"
