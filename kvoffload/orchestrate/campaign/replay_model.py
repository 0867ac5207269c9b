"""The run-time estimate's replay model for one lab: what each cell's replay will send and what a
request costs on its node, played by kvoffload/orchestrate/campaign/replay_time.py.

- `workload`: a cell's virtual users as the estimate sees them (tokens per round, the prefix an earlier
  prompt already sent, the answer's tokens, the recorded gap), from the users the replay will run (the
  caller hands them in: kvoffload/orchestrate/campaign/pools.py selects them as the replay does).
- `ReplayModel`: per cell, the replay's modelled seconds on its node (its replicas, their GPU KV cache,
  the tier's cache server), with the campaign's `honor_gaps` and `duration_s`. A `sim` campaign's
  requests cost what its cost profile says (the simulator's own model, docs/simulator.md); a real vLLM
  has no profile, and a request is the flat `request_s` (estimate.py's prior) split by
  `DEFAULT_SERIAL_SHARE`: there the first run's `replay_scale` sets the level.
Reads the simulator profile (a file of this package or the campaign's); no other IO.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kvoffload.config import Cell, LabConfig
from kvoffload.datasets import VirtualUser
from kvoffload.orchestrate.campaign.estimate import DEFAULT_SERIAL_SHARE
from kvoffload.orchestrate.campaign.replay_time import (
    Demand,
    FlatCost,
    Played,
    ProfileCost,
    Round,
    User,
    gpu_cache,
    play,
)
from kvoffload.replay.requests import RequestOptions, max_tokens
from kvoffload.tokenizer import ChatCounter, Tokenizer, render_message

if TYPE_CHECKING:
    from kvoffload.sim.profile import CostProfile

# Users modelled per (num_rounds, isl, osl): a larger pool is extrapolated from its first ones, so
# that `plan` stays quick on a dataset of thousands of sessions.
WORKLOAD_USERS = 512
# LMCache's chunk: a KV copy to or from the cache server moves whole chunks (docs/metrics.md).
CHUNK_TOKENS = 256
# The simulator's handling of a request beside its modelled engine time (its tokenizer worker renders,
# tokenizes and hashes the prompt; the HTTP layers and the replay client), per prompt token: a replay
# of tau2 at concurrency 2, no gaps, 160 requests of about 5K tokens on the tiny profile against one
# `sim serve` on loopback (2-core host, 2026-12-05) took 8.55 s where the profile's costs alone make
# 7.19 s: 17 ms a request, 3.4 us a token. The one figure fitted on a measurement; the other runs of
# that check are docs/metrics.md's "Run time: estimate against measured".
SIM_HANDLING_S_PER_TOKEN = 3.4e-6


def workload(
    users: Sequence[VirtualUser], counter: ChatCounter, osl: int | str, limit: int | None = None
) -> list[User]:
    """The estimate's view of a cell's virtual users, in the order the replay takes them (the first
    `limit`): per round, its prompt tokens (as the engine counts a chat, message by message), the
    leading tokens an earlier prompt already sent (the user's own history, or a prefix shared with an
    earlier user, e.g. a common system prompt: a whole-message prefix), the answer's tokens (max_tokens
    as the replay sends it: the campaign's osl, else the recorded length) and the recorded gap."""
    options = RequestOptions(model="", osl=osl if isinstance(osl, int) else None)
    generation = counter.count([])  # the generation prompt every chat ends with
    sent: set[int] = set()  # chained hashes of the message prefixes of earlier prompts
    others: set[int] = set()  # the same, of earlier users' prompts only
    out: list[User] = []
    for user in users[:limit]:
        rounds = []
        mine: set[int] = set()
        for call in user.calls:
            chain, tokens, reused, shared, matching = 0, 0, 0, 0, True
            for message in call.messages:
                tokens += counter.count([message]) - generation
                chain = hash((chain, render_message(message)))
                if matching and chain in sent:
                    reused = tokens
                    shared = tokens if chain in others else shared
                else:
                    matching = False
                    mine.add(chain)
            sent |= mine
            rounds.append(Round(tokens + generation, reused, max_tokens(call, options), call.pre_gap, shared))
        others |= mine
        out.append(tuple(rounds))
    return out


def _mean_context(users: Sequence[User]) -> float:
    rounds = [r for u in users for r in u]
    return sum(r.prompt_tokens + r.output_tokens for r in rounds) / len(rounds) if rounds else 0.0


class ReplayModel:
    """Each cell's replay in modelled seconds on a node of `lab` (see the module docstring).
    `users(cell)`: the virtual users the cell's replay will run, in order."""

    def __init__(
        self,
        lab: LabConfig,
        users: Callable[[Cell], Sequence[VirtualUser]],
        tokenizer: Tokenizer,
        request_s: float,
        profile: CostProfile | None = None,
    ) -> None:
        self.lab = lab
        self.users = users
        self.counter = ChatCounter(tokenizer)
        self.request_s = request_s
        self.profile = profile
        self._work: dict[tuple[int, int, str], tuple[list[User], int]] = {}
        self._capacity: dict[tuple[str, str], float | None] = {}

    def basis(self) -> str:
        """How the replay time is modelled, in words (campaign.json `estimate.replay_model`)."""
        c = self.lab.campaign
        loop = (
            "each cell's virtual users played as the replay's closed loop"
            + (", waiting the recorded gaps" if c.honor_gaps else "")
            + (f", stopped at duration_s {c.duration_s}" if c.duration_s else "")
            + "; a request's engine time is shared by the requests in flight on its replica"
        )
        if self.profile is not None:
            return (
                f"{loop}, its cost from the simulator profile {self.profile.name} (prefill past the cached "
                "prefix, decode steps, KV copies; the GPU prefix cache kept by its size)"
            )
        return (
            f"{loop}, a flat {self.request_s:g} s a request alone, {100 * DEFAULT_SERIAL_SHARE:.0f} % of "
            "it engine time (an assumption: no cost profile for a real vLLM; earlier cells set the level)"
        )

    def _workload(self, cell: Cell) -> tuple[list[User], int]:
        key = (cell.num_rounds, cell.isl, str(cell.osl))
        if key not in self._work:
            pool = self.users(cell)
            self._work[key] = (workload(pool, self.counter, cell.osl, WORKLOAD_USERS), len(pool))
        return self._work[key]

    def seconds(self, cell: Cell, node: str) -> float:
        """The cell's replay on `node`, in modelled seconds (sessions.json `duration_s`)."""
        users, total = self._workload(cell)
        if not users:
            return 0.0
        host = next((n for n in self.lab.nodes if n.name == node), None)
        replicas = max(1, len(host.replicas)) if host is not None else 1
        in_flight = math.ceil(min(cell.concurrency, total) / replicas)  # users per replica
        campaign = self.lab.campaign

        def run(running: float | None) -> Played:
            cost = self._cost(cell, node, users, in_flight, min(cell.concurrency, total), running)
            return play(
                users,
                cell.concurrency,
                replicas,
                cost,
                honor_gaps=campaign.honor_gaps,
                duration_s=campaign.duration_s,
            )

        first = run(None)
        # with gaps fewer requests run at once than users take turns: play again with the GPU cache
        # those requests leave for the others' histories
        played = run(first.in_flight).seconds if campaign.honor_gaps else first.seconds
        if total <= len(users):
            return played
        # the rest of a larger pool at the pace of its first users, never past the duration's cap
        scaled = played * total / len(users)
        return min(scaled, max(played, float(campaign.duration_s))) if campaign.duration_s else scaled

    def _cost(
        self,
        cell: Cell,
        node: str,
        users: Sequence[User],
        in_flight: int,
        slots: int,
        running: float | None,
    ) -> Callable[[Round], Demand]:
        profile = self.profile
        if profile is None:
            return FlatCost(self.request_s, DEFAULT_SERIAL_SHARE).demand
        per_token = profile.model.kv_bytes_per_token
        cache = gpu_cache(users, in_flight, self._gpu_tokens(cell, node, profile), running)
        connector = cell.tier != "gpu"
        l2_share = 0.0
        if cell.tier == "nvme":
            # the cache server's L1 holds the most recent chunks; what the users in flight need
            # beyond it is read back from the L2 files first
            need = slots * _mean_context(users)
            l2_share = max(0.0, 1.0 - self._l1_tokens(cell, per_token) / need) if need else 0.0
        chunk_overhead = profile.transfer.per_chunk_overhead_s / CHUNK_TOKENS
        return ProfileCost(
            profile.prefill.seconds,
            profile.decode.form().base_s,
            profile.decode.form().per_seq_s,
            profile.decode.form().per_context_token_s,
            handling_s_per_token=SIM_HANDLING_S_PER_TOKEN,
            retained=cache.retained,
            connector=connector,
            load_s_per_token=per_token / (profile.transfer.host_to_device_gbps * 1e9) + chunk_overhead,
            store_s_per_token=per_token / (profile.transfer.device_to_host_gbps * 1e9) + chunk_overhead,
            l2_share=l2_share,
            l2_read_s_per_token=per_token / (profile.disk.read_gbps * 1e9),
            batch=cache.batch,
        ).demand

    def _gpu_tokens(self, cell: Cell, node: str, profile: CostProfile) -> float | None:
        """A replica's GPU KV cache in tokens, as the simulator computes it from the cell's flags
        (kvoffload/sim/engine_args.py); None when the flags do not parse."""
        key = (cell.tier, node)
        if key not in self._capacity:
            self._capacity[key] = _sim_capacity(self.lab, cell, node, profile)
        return self._capacity[key]

    def _l1_tokens(self, cell: Cell, per_token: int) -> float:
        """Tokens the cell's cache server keeps in L1: its size (the campaign's, else the tier
        profile's) up to the eviction watermark."""
        from kvoffload.profiles.resolve import lmcache_profile

        assert cell.lmcache_profile is not None
        p = lmcache_profile(cell.tier)
        gb = cell.lmcache_l1_size_gb if cell.lmcache_l1_size_gb is not None else p.l1_size_gb
        # --l1-size-gb is GiB in the simulator and LMCache (docs/simulator.md)
        return gb * 2**30 * p.eviction_trigger_watermark / per_token


def _sim_capacity(lab: LabConfig, cell: Cell, node: str, profile: CostProfile) -> float | None:
    from kvoffload.errors import UserError
    from kvoffload.profiles.resolve import engine_profile
    from kvoffload.sim.engine_args import derive_capacity, parse_engine_args

    campaign = lab.campaign
    argv = ["model", *engine_profile(campaign.gpu_vendor, cell.tier).args]
    if campaign.kv_cache_memory_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(campaign.kv_cache_memory_bytes)]
    if campaign.num_gpu_blocks_override is not None:
        argv += ["--num-gpu-blocks-override", str(campaign.num_gpu_blocks_override)]
    argv += list(campaign.extra_engine_args)
    host = next((n for n in lab.nodes if n.name == node), None)
    if host is not None and host.replicas:
        argv += ["--tensor-parallel-size", str(len(host.replicas[0].gpus.split(",")))]
    try:
        args = parse_engine_args(argv)
        return float(derive_capacity(args, profile).tokens(args.block_size))
    except (SystemExit, UserError, ValueError):
        return None
