"""How long one cell's replay takes: the load model of the run-time estimate (estimate.py).

The replay is a closed loop (kvoffload/replay/runner.py): `concurrency` slots, each replaying one
virtual user's rounds in order, waiting the recorded gap before a round when the campaign honors gaps,
then taking the next user, until the pool ends, or `duration_s` stops new rounds (rounds in flight
finish; users waiting out a gap stop at once). This module plays that loop in modelled time.

A request's cost on its engine has two parts (`Demand`):
- serial: engine time that no other request can use: its prefill (the prompt less the prefix its
  engine already holds), its share of every decode step (per sequence and per context token) and its
  KV copies. An engine with n requests in flight shares its time between them (processor sharing), so
  this part stretches n times: the model of how a request's time grows with concurrency.
- delay: time that overlaps the other requests' (each decode step's fixed cost, paid once per step for
  the whole batch; the client, HTTP and tokenizing).
With n requests in flight a request then lasts delay + n x serial once the engine is busy, as a
continuously batching engine does: during one request every other one in flight also runs a prefill
and shares the decode steps. `kvoffload/orchestrate/campaign/estimate_inputs.py` derives the two parts from
the
simulator's cost profile, or splits a flat per-request time for a real vLLM without one.

Slots are spread over the replicas round-robin (Caddy's least_conn, or sticky by user, evens them
out); each replica is its own engine. Pure: no IO, no clock.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Round:
    """One request of a virtual user as the estimate sees it."""

    prompt_tokens: int
    # leading prompt tokens an unbounded prefix cache holds when the round is sent: the user's previous
    # prompt (teacher-forced history), or a prefix shared with an earlier user's prompt
    reused_tokens: int
    output_tokens: int
    gap_s: float = 0.0  # the recorded think/tool time before it (the first round's is never waited)
    shared_tokens: int = 0  # of the reused ones, those an earlier user's prompt sent (a common prefix)


User = tuple[Round, ...]


@dataclass(frozen=True)
class Demand:
    """One request's cost on its engine, in seconds (see the module docstring)."""

    serial_s: float
    delay_s: float


@dataclass(frozen=True)
class ProfileCost:
    """A request's `Demand` from an engine's cost figures (the simulator's cost profile).

    Serial: the prefill of the prompt past its cached prefix, the per-sequence and per-context-token
    cost of its decode steps, the KV it loads from and stores to the cache server (connector tiers).
    Delay: the decode steps' fixed cost (shared by the batch). `handling_s_per_token`: the servers' and
    the client's own handling of a request (tokenizing, hashing the prompt's blocks, HTTP), per prompt
    token; it runs beside the engine's steps on the same cores, so half of it counts as serial.
    The cache: a prefix shared between users stays (every request touches it); of a user's own history
    the engine keeps `retained` (the GPU prefix cache's share, `retained_share`); with a connector the
    rest is loaded from the cache server, `l2_share` of it read from its disk first. With `batch` set
    (fewer requests fit in the GPU KV cache at once than are in flight), a decode step's fixed cost is
    shared by `batch` requests only, and is serial."""

    prefill_s: Callable[[float, float], float]  # seconds to compute prompt positions start..end
    decode_base_s: float
    decode_per_seq_s: float
    decode_per_context_token_s: float
    handling_s_per_token: float = 0.0
    retained: float = 1.0
    connector: bool = False
    load_s_per_token: float = 0.0
    store_s_per_token: float = 0.0
    l2_share: float = 0.0
    l2_read_s_per_token: float = 0.0
    batch: float | None = None

    def demand(self, r: Round) -> Demand:
        reused = min(r.reused_tokens, max(0, r.prompt_tokens - 1))  # one prompt token is always computed
        shared = min(r.shared_tokens, reused)
        local = shared + self.retained * (reused - shared)
        cached = reused if self.connector else local
        loaded = cached - local
        mean_context = r.prompt_tokens + r.output_tokens / 2
        serial = (
            self.prefill_s(cached, r.prompt_tokens)
            + r.output_tokens * (self.decode_per_seq_s + self.decode_per_context_token_s * mean_context)
            + loaded * self.load_s_per_token
            + (r.prompt_tokens - cached) * self.store_s_per_token * self.connector
        )
        handling = r.prompt_tokens * self.handling_s_per_token / 2
        serial += handling
        steps = r.output_tokens * self.decode_base_s
        delay = handling + loaded * self.l2_share * self.l2_read_s_per_token
        if self.batch is not None:
            return Demand(serial + steps / self.batch, delay)
        return Demand(serial, delay + steps)


@dataclass(frozen=True)
class GpuCache:
    """What a replica's GPU KV cache holds with `in_flight` users taking turns on it (`gpu_cache`)."""

    retained: float  # share of a user's own history (past the prefix shared between users) kept
    batch: float | None  # requests that fit at once, when fewer than are in flight


def gpu_cache(
    users: Sequence[User], in_flight: int, capacity_tokens: float | None, running: float | None = None
) -> GpuCache:
    """A replica's GPU prefix cache of `capacity_tokens` under `in_flight` users taking turns on it, of
    whom `running` send at once on average (all of them when None: no gaps). From their mean round: the
    prefix shared between users is held once (every request uses it); a running request holds the rest
    of its prompt and answer, so fit = (capacity - shared) / (context - shared) requests run at once.
    While every user's history fits, all of it stays. Else what the running requests leave is all that
    keeps the others' histories until their next round, and least recently used eviction of histories
    reused in turn keeps about that room's share of what they need. Unknown size: everything fits."""
    rounds = [r for u in users for r in u]
    if capacity_tokens is None or not rounds or in_flight <= 0:
        return GpuCache(1.0, None)
    context = sum(r.prompt_tokens + r.output_tokens for r in rounds) / len(rounds)
    shared = min(context - 1.0, sum(r.shared_tokens for r in rounds) / len(rounds))
    own = max(1.0, context - shared)
    fit = max(1.0, (capacity_tokens - shared) / own)
    if fit >= in_flight:
        return GpuCache(1.0, None)
    sending = float(in_flight) if running is None else min(float(in_flight), max(0.0, running))
    run = min(fit, sending)
    room = capacity_tokens - shared - run * own
    retained = max(0.0, min(1.0, room / ((in_flight - run) * own))) if in_flight > run else 1.0
    return GpuCache(retained, fit if fit < sending else None)


@dataclass(frozen=True)
class FlatCost:
    """A request's `Demand` without a cost profile: `request_s` alone, of which `serial_share` is engine
    time that requests in flight share (see estimate.py for the figures and their basis)."""

    request_s: float
    serial_share: float

    def demand(self, r: Round) -> Demand:
        return Demand(self.request_s * self.serial_share, self.request_s * (1.0 - self.serial_share))


@dataclass
class _Engine:
    """One replica under processor sharing: `virtual` advances by dt / n while n requests are in it."""

    virtual: float = 0.0
    clock: float = 0.0
    jobs: list[tuple[float, int]] = field(default_factory=list)  # heap of (virtual finish, slot)

    def advance(self, t: float) -> None:
        if self.jobs and t > self.clock:
            self.virtual += (t - self.clock) / len(self.jobs)
        self.clock = t

    def next_done(self) -> float:
        if not self.jobs:
            return math.inf
        return self.clock + (self.jobs[0][0] - self.virtual) * len(self.jobs)


@dataclass(frozen=True)
class Played:
    """A replay in modelled time: its seconds (sessions.json `duration_s`) and the requests in flight
    on a replica at once, on average over that time."""

    seconds: float
    in_flight: float


def play(
    users: Sequence[User],
    concurrency: int,
    replicas: int,
    demand: Callable[[Round], Demand],
    *,
    honor_gaps: bool = False,
    duration_s: float | None = None,
) -> Played:
    """The replay's closed loop in modelled time (see the module docstring)."""
    slots = min(max(1, concurrency), len(users))
    if slots == 0:
        return Played(0.0, 0.0)
    engines = [_Engine() for _ in range(max(1, replicas))]
    queue = iter(users)
    # per slot: its user, the round it is on (index), what it waits for
    current: list[User | None] = [None] * slots
    index = [0] * slots
    timers: list[tuple[float, int, int, str]] = []  # (time, order, slot, "send" | "done")
    order = 0
    t = 0.0
    last_end = 0.0
    stopped = False

    def push(when: float, slot: int, what: str) -> None:
        nonlocal order
        heapq.heappush(timers, (when, order, slot, what))
        order += 1

    def start_round(slot: int, now: float) -> None:
        """The slot's next round: its gap first, else the request now; a new user after the last."""
        user = current[slot]
        if user is None or index[slot] >= len(user):
            user = next(queue, None)
            current[slot], index[slot] = user, 0
            if user is None:
                return
        gap = user[index[slot]].gap_s if honor_gaps and index[slot] > 0 else 0.0
        push(now + gap, slot, "send")

    def send(slot: int, now: float) -> None:
        user = current[slot]
        assert user is not None
        cost = demand(user[index[slot]])
        engine = engines[slot % len(engines)]
        engine.advance(now)
        heapq.heappush(engine.jobs, (engine.virtual + max(0.0, cost.serial_s), slot))
        delays[slot] = max(0.0, cost.delay_s)

    delays = [0.0] * slots
    busy = 0  # requests sent and not done
    busy_s = 0.0  # their integral over time
    for slot in range(slots):
        start_round(slot, 0.0)
    while True:
        engine_next = min(engines, key=lambda e: e.next_done())
        t_engine = engine_next.next_done()
        t_timer = timers[0][0] if timers else math.inf
        t_next = min(t_engine, t_timer)
        if t_next == math.inf:
            break
        if duration_s is not None and not stopped and t_next >= duration_s:
            # the deadline: no new round; users waiting out a gap stop now
            busy_s += busy * (duration_s - t)
            stopped = True
            t = last_end = max(last_end, duration_s)
            timers = [x for x in timers if x[3] == "done"]
            heapq.heapify(timers)
            continue
        busy_s += busy * (t_next - t)
        if t_engine <= t_timer:
            t = t_engine
            engine_next.advance(t)
            _, slot = heapq.heappop(engine_next.jobs)
            push(t + delays[slot], slot, "done")
            continue
        t, _, slot, what = heapq.heappop(timers)
        if what == "send":
            send(slot, t)
            busy += 1
        else:
            busy -= 1
            last_end = max(last_end, t)
            index[slot] += 1
            if not stopped:
                start_round(slot, t)
    return Played(last_end, busy_s / (last_end * len(engines)) if last_end > 0 else 0.0)
