"""The doctor's smoke check of the vLLM/LMCache pair on a lab: bring the pair up, make one store/retrieve
round trip, stop it. The verdict is kvoffload/doctor/smoke.py's; this module only collects.

On each node of the lab, in parallel, through the roles and units a cell uses (deploy.yml, teardown.yml,
with the extravars of the campaign's first offload cell on that node): the node's software and model
are installed as `run` installs them (tags install, model: idempotent, so `run` later finds them in
place), then lmcache-server and ONE replica (the node's first) start and answer /health (the vllm role
waits for it), then `round_trip` runs from the controller, and the node's units are stopped whatever
happened. The replica runs with VLLM_SERVER_DEV_MODE=1, which the round trip's local prefix-cache reset
needs (a cell with cold_start: reset runs so too). Loading the model is what makes this slow on a real
lab (minutes for a large model): `doctor --no-smoke` leaves it out. Prints nothing.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from kvoffload.doctor import smoke as ds
from kvoffload.errors import UserError
from kvoffload.orchestrate.cell.coldstart import Endpoints
from kvoffload.orchestrate.cell.extravar_keys import check_declared
from kvoffload.orchestrate.cell.watch import scrape
from kvoffload.orchestrate.playbooks_api import (
    BETWEEN_CELLS_SKIP_TAGS,
    CELL_SKIP_TAGS,
    DEPLOY,
    JOURNAL_UNITS_VAR,
    NODE_INSTALL_TAGS,
    TEARDOWN,
)
from kvoffload.parallelism import tensor_parallel_size
from kvoffload.playbook import PlaybookFailed

if TYPE_CHECKING:
    from kvoffload.config import Cell, LabConfig
    from kvoffload.orchestrate.installs.wheelhouse import Wheels
    from kvoffload.playbook import PlaybookResult, PlaybookRunner

log = logging.getLogger(__name__)

# LMCache's own quickstart repeats this sentence 100 times to fill its chunks; the doctor repeats it
# enough for three chunks of the server's size, behind a nonce so that no earlier KV matches.
SENTENCE = "Explain the significance of KV cache in language models. "
STORE_WAIT_S = 60.0  # LMCache stores after the prefill, off the request's path: its counter lags
POLL_S = 0.5
RESET_BOUND_S = 30.0  # as the cold-start reset's bound
REQUEST_TIMEOUT_S = 600.0  # the first request on a fresh replica may compile kernels


class SmokeError(RuntimeError):
    """A step of the round trip answered what the check cannot go on from."""


@dataclass(frozen=True)
class Pair:
    """Where the round trip finds one node's pair: base URLs, the served model, LMCache's chunk size,
    and the replica's tensor-parallel ranks (each registers with lmcache-server on its own)."""

    node: str
    replica: str
    lmcache: str
    model: str
    chunk_size: int
    ranks: int = 1


def smoke_messages(chunk_size: int, nonce: str) -> list[dict[str, str]]:
    """A chat prompt of at least three chunks' worth of tokens (a sentence is ten tokens or more)."""
    repeats = max(8, (3 * chunk_size) // 8)
    return [{"role": "user", "content": f"kvoffload-lab doctor smoke check {nonce}. " + SENTENCE * repeats}]


def _keep(sums: Mapping[str, float], families: Sequence[str]) -> dict[str, float]:
    return {f: sums[f] for f in families if f in sums}


@dataclass
class _Counters:
    """Both servers' counters of the round trip, by stage (`before`, `after_first`, `after_second`)."""

    pair: Pair
    client: httpx.Client
    lm: dict[str, dict[str, float]] = field(default_factory=dict)
    vl: dict[str, dict[str, float]] = field(default_factory=dict)

    def read(self, stage: str) -> None:
        self.lm[stage] = _keep(
            scrape(f"{self.pair.lmcache}/metrics", client=self.client), ds.LMCACHE_FAMILIES
        )
        self.vl[stage] = _keep(scrape(f"{self.pair.replica}/metrics", client=self.client), ds.VLLM_FAMILIES)

    def wait_for(
        self,
        family: str,
        stage: str,
        since: str,
        bound_s: float,
        poll_s: float,
        sleep: Callable[[float], None],
    ) -> None:
        """Scrape until `family` rose above stage `since` (or the bound passes: the verdict says so)."""
        deadline = time.monotonic() + bound_s
        while True:
            self.read(stage)
            if (
                self.lm[stage].get(family, 0.0) > self.lm[since].get(family, 0.0)
                or time.monotonic() >= deadline
            ):
                return
            sleep(poll_s)


def round_trip(
    pair: Pair,
    client: httpx.Client,
    *,
    nonce: str | None = None,
    store_wait_s: float = STORE_WAIT_S,
    reset_bound_s: float = RESET_BOUND_S,
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """LMCache's quickstart by counters: the server's /status (registration), then the same request
    twice with the replica's own prefix cache emptied in between; both servers' counters before, after
    the first (once the store shows) and after the second. Never raises for what the servers answer:
    a step that fails is the facts' `stage` and `error`."""
    t0 = time.monotonic()
    counters = _Counters(pair, client)
    facts: dict[str, Any] = {
        "node": pair.node,
        "replica": pair.replica,
        "lmcache_url": pair.lmcache,
        "chunk_size": pair.chunk_size,
        "ranks": pair.ranks,
        "requests": [],
        "lmcache": counters.lm,
        "vllm": counters.vl,
    }
    body = {
        "model": pair.model,
        "messages": smoke_messages(pair.chunk_size, nonce or secrets.token_hex(8)),
        "max_tokens": 1,
        "stream": False,
    }
    step = "status"
    try:
        facts["status"] = _json(client.get(f"{pair.lmcache}/status"), "lmcache-server GET /status")
        step = "counters"
        counters.read("before")
        step = "first request"
        facts["requests"].append(_usage(client.post(f"{pair.replica}/v1/chat/completions", json=body)))
        step = "store"
        counters.wait_for(ds.L1_WRITES, "after_first", "before", store_wait_s, poll_s, sleep)
        step = "prefix-cache reset"
        _reset_local(client, pair.replica, reset_bound_s, poll_s, sleep)
        step = "second request"
        facts["requests"].append(_usage(client.post(f"{pair.replica}/v1/chat/completions", json=body)))
        step = "retrieve"
        counters.wait_for(ds.HIT_TOKENS, "after_second", "after_first", store_wait_s, poll_s, sleep)
    except (httpx.HTTPError, SmokeError, ValueError) as exc:
        facts["stage"] = step
        facts["error"] = f"{type(exc).__name__}: {exc}" if isinstance(exc, httpx.HTTPError) else str(exc)
    facts["seconds"] = round(time.monotonic() - t0, 3)
    return facts


def _json(resp: httpx.Response, what: str) -> dict[str, Any]:
    if resp.status_code != 200:
        raise SmokeError(f"{what} answered HTTP {resp.status_code} {resp.text[:200]!r}")
    body = resp.json()
    if not isinstance(body, dict):
        raise SmokeError(f"{what} answered {str(body)[:200]!r}, not a JSON object")
    return body


def _usage(resp: httpx.Response) -> dict[str, Any]:
    usage = _json(resp, "the replica's POST /v1/chat/completions").get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return {"prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": details.get("cached_tokens")}


def _reset_local(
    client: httpx.Client, replica: str, bound_s: float, poll_s: float, sleep: Callable[[float], None]
) -> None:
    """Empty the replica's own prefix cache, not LMCache's (no reset_external), so that the second
    request can only find its prompt's KV through the connector. vLLM answers {"success": false} while
    blocks are still held (a store in flight): asked again within `bound_s`, as the cold-start reset
    is (orchestrate/cell/coldstart.py)."""
    deadline = time.monotonic() + bound_s
    while True:
        resp = client.post(f"{replica}/reset_prefix_cache")
        if resp.status_code == 404:
            raise SmokeError(
                "POST /reset_prefix_cache answered 404: the replica runs without VLLM_SERVER_DEV_MODE=1"
            )
        if _json(resp, "POST /reset_prefix_cache").get("success") is not False:
            return
        if time.monotonic() + poll_s > deadline:
            raise SmokeError(
                f"POST /reset_prefix_cache answered {{'success': false}} for {bound_s:.0f} s: blocks "
                "still held"
            )
        sleep(poll_s)


def offload_cell(lab: LabConfig) -> Cell | None:
    """The cell whose configuration the smoke deploys: the campaign's first cpu cell (no L2 to wipe),
    else its first nvme cell; None when the campaign has no offload cell."""
    for tier in ("cpu", "nvme"):
        found = next((c for c in lab.cells if c.tier == tier), None)
        if found is not None:
            return found
    return None


def smoke_extravars(base: Mapping[str, Any], lab: LabConfig, node: str) -> dict[str, Any]:
    """A cell's extravars (`base`, its plan's on `node`) narrowed to the pair: the node's
    first replica only, no Caddy, vLLM's dev mode for the local prefix-cache reset."""
    first = lab.node(node).replicas[0]
    narrowed = {
        **base,
        "vllm_replicas": [{"index": first.index, "gpus": first.gpus}],
        "caddy_enabled": False,
        "vllm_env": dict(sorted({**base["vllm_env"], "VLLM_SERVER_DEV_MODE": "1"}.items())),
    }
    check_declared(narrowed)
    return narrowed


def pair_of(extravars: Mapping[str, Any], lab: LabConfig, node: str, chunk_size: int) -> Pair:
    """The round trip's endpoints, from the cell's metric targets (the URLs the sampler reads)."""
    first = lab.node(node).replicas[0]
    ends = Endpoints.from_targets(extravars["replay_metrics_targets"])
    replica = ends.replicas.get(f"vllm-{node}-{first.index}")
    if replica is None or ends.lmcache is None:
        raise SmokeError(f"no replica {first.index} or lmcache-server among the targets of node {node}")
    return Pair(
        node, replica, ends.lmcache, lab.served_model_name, chunk_size, tensor_parallel_size(first.gpus)
    )


class Installs(Protocol):
    """What the round trip needs of the campaign's runner (campaign/runner.py CampaignRunner, which
    cli/doctor.py hands in): the lab, the wheelhouse and the playbooks, and provisioning without the
    doctor's own gate. A Protocol, so that the checks never import the campaign."""

    lab: LabConfig
    hosts_python: str | None
    wheels: Wheels | None
    playbooks: PlaybookRunner

    def prepare_wheelhouse(self) -> None: ...

    def provision(self, check: bool = False, gate: bool = True) -> PlaybookResult: ...


class PairSmoke:
    """The smoke check on every node asked: `__call__(nodes, hosts_python)` -> node -> round trip facts
    (with `stage`/`error` where the bring-up or the round trip stopped)."""

    def __init__(self, runner: Installs, out: Path, client: httpx.Client | None = None) -> None:
        self.runner = runner
        self.lab = runner.lab
        self.out = out
        self.client = client or httpx.Client(timeout=httpx.Timeout(30.0, read=REQUEST_TIMEOUT_S))

    def __call__(self, nodes: Sequence[str], hosts_python: str | None) -> dict[str, dict[str, Any]]:
        if not nodes:
            return {}
        shutil.rmtree(self.out, ignore_errors=True)
        self.out.mkdir(parents=True)
        if hosts_python is not None:
            self.runner.hosts_python = hosts_python
        stage = "wheelhouse"
        try:
            if self.runner.wheels is None:
                self.runner.prepare_wheelhouse()
            stage = "provision"
            self.runner.provision(gate=False)  # the doctor judged the hosts itself, in full
        except (PlaybookFailed, UserError, OSError, RuntimeError) as exc:
            # every node's check says it: the doctor's other checks and its record still come out
            return {n: {"node": n, "stage": stage, "error": str(exc)} for n in nodes}
        with ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="smoke") as pool:
            return dict(zip(nodes, pool.map(self.node, nodes), strict=True))

    def _limit(self, node: str) -> str | None:
        """The node's hosts (a lab of several nodes), as a cell's deploy is limited."""
        return ",".join(self.lab.node_hosts(self.lab.node(node))) if self.lab.multi_node else None

    def node(self, node: str) -> dict[str, Any]:
        from kvoffload.contracts.layout import CellPaths
        from kvoffload.orchestrate.cell.plan import CellPlan
        from kvoffload.profiles.resolve import lmcache_profile

        cell = offload_cell(self.lab)
        if cell is None:
            return {"node": node, "stage": "plan", "error": "the campaign has no cpu or nvme cell"}
        folder = self.out / node
        facts_dir = folder / "facts"
        facts_dir.mkdir(parents=True)
        assert self.runner.wheels is not None  # prepare_wheelhouse() built them
        plan = CellPlan.build(self.lab, cell, CellPaths(folder / "cell"), self.runner.wheels, node)
        extravars = smoke_extravars(plan.extravars, self.lab, node)
        stage = "install"

        def play(playbook: str, switches: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
            self.runner.playbooks.run(
                playbook,
                {**extravars, **(switches or {})},
                limit=self._limit(node),
                ident=f"{time.strftime('%Y%m%dT%H%M%S')}-doctor-smoke-{node}-{stage}",
                fact_cache=facts_dir,
                **kwargs,
            )

        result: dict[str, Any] = {"node": node}
        try:
            # the node's software and model as `run` installs them; its periodic disk jobs are never masked
            # for the smoke (no `quiet`), so there is nothing to unmask at its end
            play(DEPLOY, tags=NODE_INSTALL_TAGS)
            stage = "start"
            play(DEPLOY, skip_tags=CELL_SKIP_TAGS)
            stage = "endpoints"
            pair = pair_of(extravars, self.lab, node, lmcache_profile(cell.tier).chunk_size)
            result = round_trip(pair, self.client)
        except (PlaybookFailed, SmokeError) as exc:
            result |= {"stage": stage, "error": str(exc)}
        finally:
            stage = "stop"
            # after a failure the teardown keeps every stopped unit's journal, as after a failed cell
            failed = bool(result.get("error"))
            try:
                play(
                    TEARDOWN,
                    {JOURNAL_UNITS_VAR: "all"} if failed else None,
                    skip_tags=BETWEEN_CELLS_SKIP_TAGS,
                )
            except PlaybookFailed as exc:
                log.error("doctor smoke: stopping the pair on %s failed: %s", node, exc)
                result["stop_error"] = str(exc)
        if failed:
            said = replica_journal_error(Path(extravars["replay_controller_dir"]), node, extravars)
            if said is not None:
                result["journal_error"] = said
        result["cell"] = cell.id
        return result


def replica_journal_error(cell_dir: Path, node: str, extravars: Mapping[str, Any]) -> str | None:
    """The first error line of the smoke's replica's journal as the teardown kept it after a failure
    (roles/vllm tasks/teardown_journal.yml: `<cell>/units/<host>--<unit>.failed-cell.journal.txt`);
    None when there is none (the replica never started, or said nothing at ERROR level)."""
    from kvoffload.doctor.journal import first_error_line

    index = extravars["vllm_replicas"][0]["index"]
    path = cell_dir / "units" / f"{node}--kvoffload-vllm@{index}.service.failed-cell.journal.txt"
    try:
        return first_error_line(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
