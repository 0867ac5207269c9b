"""The simulated engine core: continuous batching over a paged KV cache, in modelled wall-clock time.

One asyncio task runs engine steps back to back, like vLLM's scheduler + model runner:
- each step takes running requests first (one decode token each, or the next prefill chunk), then
  admits waiting requests first-come-first-served while `max_num_seqs`, the per-step token budget
  `max_num_batched_tokens` and free KV blocks allow (a request that does not fit blocks the queue);
- admission counts local prefix hits (`KVCache`) and, with a connector, the external hits the cache
  server reported at lookup beyond the local ones; only the rest is computed;
- a decode that needs a block when none is free preempts the most recently admitted request (its
  blocks are freed and it is recomputed later), as vLLM V1 does;
- the step's duration comes from the cost profile: prefill time `T(end) - T(start)` per chunk, one
  decode step for the decoding batch, plus connector loads (L1 -> GPU) and stores (GPU -> L1);
- steps are laid back to back on the modelled timeline (a step starts where the previous one ended,
  not when the event loop got round to it), so wake-up lateness does not accumulate; a dedicated
  timer thread wakes the loop at each step's end (asyncio's timers round to whole milliseconds);
- a step that produces first tokens is woken a little early (by the recent thread-to-loop hand-off
  time) and the loop then waits out the rest on the clock, so first tokens leave on time; the
  streams write them before the step's remaining bookkeeping runs, and the other streams are woken in
  small batches after it, so requests arriving meanwhile are not held behind hundreds of writes.
Streams are told about new tokens through `Request.notify`; the HTTP layer owns the wire format.
This module must not parse HTTP or know the OpenAI schema.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kvoffload.sim.connector import CacheClient
from kvoffload.sim.engine_metrics import EngineMetrics
from kvoffload.sim.kv_cache import Allocation, KVCache
from kvoffload.sim.profile import CostProfile

log = logging.getLogger(__name__)

# Streams are woken for the first token, the last one, and otherwise at most this often: waking 256
# streams every 5 ms decode step would cost more CPU than the rest of the simulator together. The
# replay client's records need only the first token and the end (TTFT, latency, TPOT as their ratio).
STREAM_FLUSH_S = 0.05
# When the event loop falls this far behind the modelled timeline, resynchronise (and say so).
MAX_BEHIND_S = 0.05
# Early wake-up for steps that produce first tokens: at most this much is spent waiting on the clock.
MAX_LEAD_S = 0.002
# The lead covers this quantile of the recent hand-offs (timer thread -> event loop): on a VM their tail
# (a vCPU woken from idle) is several times their median.
LEAD_QUANTILE = 0.9
HANDOFF_WINDOW = 64
# Other streams are woken this many at a time, with a turn of the event loop in between, so a request
# that arrives while hundreds of streams write is read (and its arrival stamped) within one batch.
WAKE_BATCH = 16


# The timer thread sleeps in slices of at most this much, so that a stopping engine never waits out a
# long step (a 128K-token prefill is seconds) before the process can exit: a pool thread is joined at
# interpreter exit. The last slice is one precise sleep, so slicing costs no precision.
TIMER_SLICE_S = 0.05


def _sleep_until(deadline: float, stop: threading.Event) -> None:
    while not stop.is_set():
        delay = deadline - time.monotonic()
        if delay <= 0:
            return
        time.sleep(min(delay, TIMER_SLICE_S))


def _precise_timer_thread() -> None:
    """Ask Linux for 1 us of timer slack on the timer thread (the default lets a sleep run 50 us over)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, in nanoseconds
    except (OSError, AttributeError):
        pass  # not Linux: the default slack only costs a little precision


@dataclass(eq=False)
class Request:
    """One chat completion inside the engine."""

    request_id: str
    num_prompt: int
    block_hashes: list[bytes]
    chunk_keys: list[bytes]
    max_tokens: int
    arrival: float
    ext_hit_tokens: int = 0
    # the body asked for LMCache's cached_token_stats (kv_transfer_params) and a connector answers it
    want_stats: bool = False
    # progress
    alloc: Allocation | None = None
    prefill_target: int = 0
    num_computed: int = 0
    num_output: int = 0
    counted: bool = False
    local_hit_tokens: int = 0
    ext_new_tokens: int = 0
    first_scheduled: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    finished: bool = False
    error: str | None = None
    created_cache_tokens: int = 0
    notify: asyncio.Event = field(default_factory=asyncio.Event)
    last_notify: float = 0.0
    first_write: float = 0.0

    @property
    def cached_tokens(self) -> int:
        return self.local_hit_tokens + self.ext_new_tokens

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prefill_target


@dataclass
class _Step:
    prefills: list[tuple[Request, int, int]] = field(default_factory=list)
    decodes: list[Request] = field(default_factory=list)
    stores: list[tuple[list[bytes], float]] = field(default_factory=list)
    duration: float = 0.0
    tokens: int = 0
    first_tokens: int = 0


class Engine:
    """Scheduler, KV cache and timing model of one simulated vLLM replica."""

    def __init__(
        self,
        profile: CostProfile,
        kv: KVCache,
        metrics: EngineMetrics,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        cache_client: CacheClient | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.profile = profile
        self.kv = kv
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.cache = cache_client
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._wake = asyncio.Event()
        self._clock = clock or time.monotonic
        self._timer = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="sim-step-timer", initializer=_precise_timer_thread
        )
        self._stopping = threading.Event()
        # How long the timer thread took to resume the loop, lately: a step with first tokens is woken
        # early by a high quantile of these, then waits on the clock.
        self._handoffs: deque[float] = deque(maxlen=HANDOFF_WINDOW)
        self._lead_s = 0.0
        self._due: list[Request] = []  # streams with tokens to write, woken after the step's bookkeeping

    @property
    def chunk_bytes(self) -> int:
        """Modelled bytes of one connector chunk (known once the cache server told its chunk size)."""
        size = self.cache.chunk_size if self.cache is not None else 256
        return size * self.profile.model.kv_bytes_per_token

    # ---- intake -------------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.prefill_target = req.num_prompt
        self.waiting.append(req)
        self._publish_gauges()
        self._wake.set()

    # ---- main loop ----------------------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline: float | None = None  # end of the previous step on the modelled timeline
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                deadline = None
            now = self._clock()
            if deadline is None or now - deadline > MAX_BEHIND_S:
                if deadline is not None:
                    log.warning(
                        "simulator is %.0f ms behind modelled time (CPU overloaded)", (now - deadline) * 1e3
                    )
                start = now
            else:
                start = deadline  # back to back: lateness of the last wake-up is not carried over
            step = self._schedule(start)
            if not step.prefills and not step.decodes:
                self._wake.clear()
                await self._wake.wait()
                deadline = None
                continue
            deadline = start + step.duration
            await self._wait_until(loop, deadline, precise=step.first_tokens > 0)
            self._complete_prefills(step, deadline)
            # Let the streams whose first token was just produced write it before the bookkeeping of
            # a large decode batch and the next step's scheduling hold the loop (both are on the
            # modelled timeline already, so doing them a moment later changes no modelled time).
            await asyncio.sleep(0)
            self._complete_rest(step, deadline)
            await self._wake_streams()

    async def _wait_until(self, loop: asyncio.AbstractEventLoop, deadline: float, precise: bool) -> None:
        """Return at `deadline`; with `precise`, wake early by the recent hand-off time, then spin."""
        lead = self._lead_s if precise else 0.0
        target = deadline - lead
        if target - self._clock() > 0:
            # A timer thread wakes the loop through its self-pipe: asyncio's own timers round the
            # epoll timeout up to whole milliseconds.
            await loop.run_in_executor(self._timer, _sleep_until, target, self._stopping)
            late = max(0.0, self._clock() - target)
            self._handoffs.append(late)
            ordered = sorted(self._handoffs)
            self._lead_s = min(MAX_LEAD_S, 1.2 * ordered[int(LEAD_QUANTILE * (len(ordered) - 1))])
        while precise and self._clock() < deadline:
            pass  # at most MAX_LEAD_S; nothing else needs this core's time more than a due token

    # ---- scheduling ---------------------------------------------------------------------------
    def _schedule(self, now: float) -> _Step:
        step = _Step()
        budget = self.max_num_batched_tokens
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            assert req.alloc is not None
            if req.in_prefill:
                n = min(req.prefill_target - req.num_computed, budget)
                step.prefills.append((req, req.num_computed, req.num_computed + n))
                budget -= n
                i += 1
                continue
            need = self.kv.blocks_needed(req.num_computed + 1) - len(req.alloc.blocks)
            while need > 0 and not self.kv.grow(req.alloc, need):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            if req.alloc is None:
                continue  # req preempted itself (preemption frees the allocation)
            step.decodes.append(req)
            budget -= 1
            i += 1
        load_s = 0.0
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                req = self.waiting[0]
                admitted = self._admit(req)
                if admitted is None:
                    break
                self.waiting.popleft()
                load_s += admitted
                if req.first_scheduled is None:
                    req.first_scheduled = now
                n = min(req.prefill_target - req.num_computed, budget)
                step.prefills.append((req, req.num_computed, req.num_computed + n))
                budget -= n
                self.running.append(req)
        store_s = 0.0
        prefill_s = 0.0
        for req, s, e in step.prefills:
            prefill_s += self.profile.prefill.seconds(s, e)
            if e == req.prefill_target and req.num_output == 0:
                step.first_tokens += 1
            if e == req.prefill_target and self.cache is not None and req.num_output == 0:
                keys, seconds = self._store_plan(req)
                if keys:
                    step.stores.append((keys, seconds))
                    store_s += seconds
        decode_s = 0.0
        if step.decodes:
            ctx = sum(r.num_computed for r in step.decodes)
            decode_s = self.profile.decode_step_s(len(step.decodes), ctx)
        step.duration = prefill_s + decode_s + load_s + store_s
        step.tokens = sum(e - s for _, s, e in step.prefills) + len(step.decodes)
        return step

    def _admit(self, req: Request) -> float | None:
        """Take blocks for a waiting request; the connector load time, or None if it does not fit."""
        bs = self.kv.block_size
        total = req.prefill_target
        max_hit_blocks = (total - 1) // bs
        hit_blocks = self.kv.count_hits(req.block_hashes, max_hit_blocks)
        local = hit_blocks * bs
        ext = min(req.ext_hit_tokens, total - 1) if not req.counted else 0
        ext_new = max(0, ext - local)
        computed = local + ext_new
        blocks = self.kv.blocks_needed(total + 1)
        if not self.kv.can_allocate(hit_blocks, blocks, req.block_hashes):
            return None
        req.alloc = self.kv.allocate(hit_blocks, blocks, req.block_hashes)
        req.num_computed = computed
        load_s = 0.0
        if not req.counted:
            req.counted = True
            req.local_hit_tokens = local
            req.ext_new_tokens = ext_new
            m = self.metrics
            m.prompt_tokens.inc(req.num_prompt)
            m.prefix_queries.inc(req.num_prompt)
            m.prefix_hits.inc(local)
            m.cached_device.inc(local)
            m.prompt_local_hit.inc(local)
            m.prompt_computed.inc(req.num_prompt - computed)
            m.prompt_cached.inc(computed)
            if self.cache is not None:
                m.ext_queries.inc(req.num_prompt - local)
                m.ext_hits.inc(ext_new)
                m.cached_external.inc(ext_new)
                m.prompt_external.inc(ext_new)
            if ext_new > 0 and self.cache is not None:
                chunks = -(-ext_new // self.cache.chunk_size)
                nbytes = ext_new * self.profile.model.kv_bytes_per_token
                load_s = chunks * self.profile.transfer.per_chunk_overhead_s + (
                    nbytes / (self.profile.transfer.host_to_device_gbps * 1e9)
                )
        return load_s

    def _store_plan(self, req: Request) -> tuple[list[bytes], float]:
        """The chunks a finished prefill stores (those the server did not report) and the copy time."""
        assert self.cache is not None
        keys = req.chunk_keys[req.ext_hit_tokens // self.cache.chunk_size :]
        return keys, len(keys) * self.profile.transfer.store_s(self.chunk_bytes)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        if req.alloc is not None:
            self.kv.free(req.alloc)
            req.alloc = None
        # Recompute the prompt and what was generated so far; the next prefill emits one more token.
        req.prefill_target = req.num_prompt + max(0, req.num_output - 1)
        req.num_computed = 0
        self.waiting.appendleft(req)
        self.metrics.preemptions.inc()

    # ---- completion ---------------------------------------------------------------------------
    def _complete_prefills(self, step: _Step, t: float) -> None:
        """End the step's prefill chunks; a request whose prompt is done emits its next token.

        Only what the token's stream needs happens here; the blocks are registered in
        `_complete_rest`, before anything can look them up (unless the request ends now).
        """
        self.metrics.iteration_tokens.observe(step.tokens)
        produced = 0
        for req, _s, e in step.prefills:
            if req.finished:
                continue  # aborted by its client during the step
            req.num_computed = e
            if e < req.prefill_target:
                continue
            if req.num_output + 1 >= req.max_tokens:
                self._register(req, t)  # its blocks are freed as it finishes
            self._emit(req, t)
            produced += 1
        self.metrics.generation_tokens.inc(produced)

    def _register(self, req: Request, t: float) -> None:
        """Make a computed prompt's full blocks findable by later prefix lookups."""
        assert req.alloc is not None
        new_blocks = self.kv.register(req.alloc, req.block_hashes, req.num_prompt // self.kv.block_size)
        if req.num_output == 0 or req.first_token_time == t:  # the first prefill, not a recompute
            req.created_cache_tokens = new_blocks * self.kv.block_size

    def _complete_rest(self, step: _Step, t: float) -> None:
        """Register the finished prefills' blocks, end the decodes, run the stores, count the step."""
        m = self.metrics
        for req, _s, e in step.prefills:
            if e == req.prefill_target and req.alloc is not None and not req.finished:
                self._register(req, t)
        if self.cache is not None:
            for keys, _seconds in step.stores:
                self.cache.store(keys, self.chunk_bytes)
        produced = 0
        if step.decodes:
            m.itl.observe_n(step.duration, len(step.decodes))
        for req in step.decodes:
            if req.finished:
                continue
            req.num_computed += 1
            self._emit(req, t)
            produced += 1
        m.generation_tokens.inc(produced)
        self._publish_gauges()

    def _emit(self, req: Request, t: float) -> None:
        req.num_output += 1
        req.last_token_time = t
        first = req.first_token_time is None
        if first:
            req.first_token_time = t
            self.metrics.ttft.observe(t - req.arrival)
        if req.num_output >= req.max_tokens:
            self._finish(req, t)
        if first:
            req.last_notify = t
            req.notify.set()
        elif req.finished or t - req.last_notify >= STREAM_FLUSH_S:
            req.last_notify = t
            self._due.append(req)

    async def _wake_streams(self) -> None:
        """Wake the streams that have tokens due, WAKE_BATCH at a time."""
        due, self._due = self._due, []
        for i in range(0, len(due), WAKE_BATCH):
            for req in due[i : i + WAKE_BATCH]:
                req.notify.set()
            await asyncio.sleep(0)

    def _finish(self, req: Request, t: float) -> None:
        req.finished = True
        req.finish_time = t
        if req in self.running:
            self.running.remove(req)
        if req.alloc is not None:
            self.kv.free(req.alloc)
            req.alloc = None
        m = self.metrics
        m.success["length"].inc()
        m.e2e.observe(t - req.arrival)
        scheduled = req.first_scheduled if req.first_scheduled is not None else req.arrival
        first = req.first_token_time if req.first_token_time is not None else t
        m.queue_time.observe(scheduled - req.arrival)
        m.inference_time.observe(t - scheduled)
        m.prefill_time.observe(first - scheduled)
        m.decode_time.observe(t - first)
        m.request_prompt_tokens.observe(req.num_prompt)
        m.request_generation_tokens.observe(req.num_output)
        m.request_max_tokens.observe(req.max_tokens)
        if req.num_output > 1:
            m.tpot.observe((t - first) / (req.num_output - 1))

    def fail(self, req: Request, message: str) -> None:
        """Mark a request failed before it was queued (e.g. the cache server is gone)."""
        req.error = message
        req.finished = True
        self.metrics.success["error"].inc()
        req.notify.set()

    def _publish_gauges(self) -> None:
        m = self.metrics
        m.running.set(len(self.running))
        m.waiting.set(len(self.waiting))
        m.waiting_capacity.set(len(self.waiting))
        m.kv_usage.set(self.kv.usage())

    def close(self) -> None:
        """At shutdown (after cancelling `run`): end the timer thread's sleep now, not at the step's end."""
        self._stopping.set()
        self._timer.shutdown(wait=False, cancel_futures=True)

    def abort(self, req: Request) -> None:
        """The client went away: release what the request holds."""
        if req.finished:
            return
        req.finished = True
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        if req.alloc is not None:
            self.kv.free(req.alloc)
            req.alloc = None
        self.metrics.success["abort"].inc()
        self._publish_gauges()
