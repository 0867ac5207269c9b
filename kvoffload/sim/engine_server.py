"""HTTP face of the simulated engine: vLLM's OpenAI-compatible endpoints on aiohttp.

Serves `POST /v1/chat/completions` (SSE streaming and not), `POST /tokenize` (a `prompt` string or
chat `messages`, counted as the engine counts them), `GET /v1/models`, `/health`, `/ping`,
`/load`, `/version`, `/metrics`, and `POST /reset_prefix_cache` (only with VLLM_SERVER_DEV_MODE=1, as
in vLLM; `?reset_external=true` also has the connector clear the cache server's L1). Response bodies,
SSE events, usage and error shapes copy real vLLM 0.32 (`tests/fixtures/vllm-0.32-cpu/`). Every
response carries `x-kvoffload-replica: <host>:<port>` so the replay client can record which replica
answered. The wire format lives here; tokenizing and
hashing in `kvoffload.sim.prep` (a worker process); scheduling and timing in `kvoffload.sim.engine`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import secrets
import socket
import sys
import time
from collections.abc import Coroutine, Mapping
from typing import Any

from aiohttp import web

from kvoffload import aio
from kvoffload.errors import UserError
from kvoffload.sim.connector import CacheClient, CacheServerUnavailable
from kvoffload.sim.engine import Engine, Request
from kvoffload.sim.engine_args import Capacity, EngineArgs, StartupPlan, derive_capacity, derive_startup
from kvoffload.sim.engine_metrics import VERSION, EngineMetrics
from kvoffload.sim.http_common import (
    BACKLOG,
    LARGE_BODY,
    Handler,
    app_runner,
    fastapi_errors,
    metrics_handler,
    stop_on_signals,
    validation_error,
)
from kvoffload.sim.kv_cache import KVCache
from kvoffload.sim.prep import PrepWorker, WorkerDied
from kvoffload.sim.profile import CostProfile, load_profile

log = logging.getLogger("kvoffload.sim.serve")

REPLICA_HEADER = "x-kvoffload-replica"
TIMINGS_ENV = "KVOFFLOAD_SIM_TIMINGS"
FINGERPRINT = f"vllm-{VERSION}-kvsim"
# Without max_tokens real vLLM generates until EOS; the simulator has no EOS, so it stops here.
DEFAULT_MAX_TOKENS = 128
_WORDS = (" the", " cache", " token", " block", " of", " and", " to", " prefix", " a", " is")


_BOOL_MSG = "Input should be a valid boolean, unable to interpret input"


def _query_bool(raw: str) -> bool | None:
    """A query flag as FastAPI (pydantic) reads a bool; None when it is not one."""
    text = raw.strip().lower()
    if text in ("1", "true", "t", "yes", "y", "on"):
        return True
    if text in ("0", "false", "f", "no", "n", "off"):
        return False
    return None


def _error(status: int, message: str, err_type: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return web.json_response(body, status=status)


class EngineServer:
    """The aiohttp application of one simulated replica."""

    def __init__(self, args: EngineArgs, profile: CostProfile, capacity: Capacity) -> None:
        self.args = args
        self.profile = profile
        self.capacity = capacity
        self.model_name = args.served_model_names[0]
        host = args.host if args.host not in ("0.0.0.0", "::", "") else socket.gethostname()
        self.replica = f"{host}:{args.port}"
        self.created = int(time.time())
        self.dev_mode = os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
        # Opt-in for bench/sim_ttft.py: each request's modelled TTFT, kept under its x-request-id and
        # served on GET /kvoffload/timings. Off by default (it grows with every request).
        self.timings: dict[str, dict[str, float]] | None = {} if os.environ.get(TIMINGS_ENV) == "1" else None
        self.seed = args.model.encode()
        cache_info = {
            "block_size": str(args.block_size),
            "enable_prefix_caching": str(args.enable_prefix_caching),
            "gpu_memory_utilization": str(args.gpu_memory_utilization),
            "kv_cache_memory_bytes": str(capacity.kv_cache_memory_bytes),
            "kv_cache_size_tokens": str(capacity.tokens(args.block_size)),
            "num_gpu_blocks": str(capacity.num_gpu_blocks),
            "num_gpu_blocks_override": str(args.num_gpu_blocks_override),
            "cache_dtype": "auto",
            "prefix_caching_hash_algo": "sha256",
            "num_cpu_blocks": "None",
        }
        self.metrics = EngineMetrics(
            self.model_name, capacity.max_model_len, cache_info, lmcache_mp=args.connector is not None
        )
        self.kv = KVCache(capacity.num_gpu_blocks, args.block_size, args.enable_prefix_caching)
        self.cache: CacheClient | None = None
        if args.connector is not None:
            # LMCache labels its lookup counters with vLLM's model (the path), not the served name.
            self.cache = CacheClient(args.connector, args.model)
        self.engine = Engine(
            profile,
            self.kv,
            self.metrics,
            args.max_num_seqs,
            args.max_num_batched_tokens,
            cache_client=self.cache,
        )
        self._engine_task: asyncio.Task[None] | None = None
        self.prep = PrepWorker(args.model, args.block_size, self.seed)
        self.stop = asyncio.Event()
        self.failed: BaseException | None = None

    # ---- lifecycle ----------------------------------------------------------------------------
    def app(self) -> web.Application:
        # The replica header goes on every answer, the FastAPI-shaped 404 and 405 included.
        app = web.Application(middlewares=[self._replica_header, fastapi_errors], client_max_size=LARGE_BODY)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/health", self.empty)
        app.router.add_get("/ping", self.empty)
        app.router.add_post("/ping", self.empty)
        app.router.add_get("/load", self.load)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", metrics_handler(self.metrics.registry))
        if self.dev_mode:
            app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        if self.timings is not None:
            app.router.add_get("/kvoffload/timings", self.timings_endpoint)
        return app

    async def start_up(self, plan: StartupPlan) -> None:
        """What `vllm serve` does before its API server listens, in its order and with its log lines.

        Weight load and graph capture take the plan's modelled seconds (the tokenizer worker starts
        inside the load); the connector waits for the cache server between the two, where vLLM's
        engine core creates it. Nothing listens meanwhile: /health is refused, as on a loading vLLM.
        """
        begun = time.monotonic()
        log.info(
            "simulated start-up: weights load %.1f s (%s), graph capture %.1f s (%s)",
            plan.model_load_s,
            plan.model_load_source,
            plan.graph_capture_s,
            plan.graph_capture_source,
        )
        log.info("Starting to load model %s...", self.args.model)
        await self.prep.start()
        await asyncio.sleep(max(0.0, begun + plan.model_load_s - time.monotonic()))
        loaded = time.monotonic() - begun
        log.info("Loading weights took %.2f seconds", loaded)
        log.info(
            "Model loading took %.4f GiB memory and %.6f seconds",
            self.profile.model.weights_gib / self.args.tensor_parallel_size,
            loaded,
        )
        log.info("GPU KV cache size: %s tokens", f"{self.capacity.tokens(self.args.block_size):,}")
        log.info(
            "Maximum concurrency for %s tokens per request: %.2fx",
            f"{self.capacity.max_model_len:,}",
            self.capacity.tokens(self.args.block_size) / self.capacity.max_model_len,
        )
        if self.cache is not None:
            await self.cache.connect()
            log.info(
                "connected to LMCache MP server at %s (chunk size %d)", self.cache.base, self.cache.chunk_size
            )
        if plan.graph_capture_s > 0:
            captured = time.monotonic()
            await asyncio.sleep(plan.graph_capture_s)
            log.info(
                "Graph capturing finished in %.0f secs, took %.2f GiB",
                time.monotonic() - captured,
                self.profile.model.runtime_overhead_gib,
            )
        log.info(
            "init engine (profile, create kv cache, warmup model) took %.2f seconds", time.monotonic() - begun
        )
        self._engine_task = asyncio.get_running_loop().create_task(self.engine.run())
        self._engine_task.add_done_callback(self._engine_done)
        # Objects made at start-up live as long as the process: keep them out of every later
        # collection, so a full collection does not stall the loop for milliseconds (vLLM does the same).
        gc.collect()
        gc.freeze()

    def _engine_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            # Like vLLM's EngineDeadError: stop serving so the unit manager restarts the replica.
            log.critical("engine loop died: %r", exc, exc_info=exc)
            self.failed = exc
            self.stop.set()

    async def shut_down(self) -> None:
        """Stop the engine loop, its timer thread, the connector and the tokenizer worker."""
        if self._engine_task is not None:
            self._engine_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._engine_task
        self.engine.close()
        if self.cache is not None:
            await self.cache.close()
        self.prep.close()

    @web.middleware
    async def _replica_header(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        resp = await handler(request)
        if not resp.prepared:
            resp.headers[REPLICA_HEADER] = self.replica
        return resp

    # ---- small endpoints ----------------------------------------------------------------------
    async def empty(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def load(self, _request: web.Request) -> web.Response:
        return web.json_response({"server_load": len(self.engine.running) + len(self.engine.waiting)})

    async def version(self, _request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """vLLM's dev endpoint; `reset_external=true` also has the connector clear the cache server's L1.

        `reset_running_requests` is accepted; the simulator never preempts for it, so a reset while
        requests hold blocks answers `{"success": false}` either way.
        """
        flags: dict[str, bool] = {}
        for name in ("reset_running_requests", "reset_external"):
            raw = request.query.get(name, "false")
            value = _query_bool(raw)
            if value is None:
                return validation_error(["query", name], _BOOL_MSG, raw, kind="bool_parsing")
            flags[name] = value
        success = self.kv.reset()
        if flags["reset_external"] and self.cache is not None:
            success = await self.cache.clear() and success
        return web.json_response({"success": success})

    async def models(self, _request: web.Request) -> web.Response:
        data = [
            {
                "id": name,
                "object": "model",
                "created": self.created,
                "owned_by": "vllm",
                "root": self.args.model,
                "parent": None,
                "max_model_len": self.capacity.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{secrets.token_hex(8)}",
                        "object": "model_permission",
                        "created": self.created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in self.args.served_model_names
        ]
        return web.json_response({"object": "list", "data": data})

    # ---- tokenize ------------------------------------------------------------------------------
    def _tokenizer_died(self, exc: WorkerDied) -> web.Response:
        """A request's answer when the tokenizer worker died: the server stops (the unit restarts it)."""
        if not self.stop.is_set():
            log.critical("tokenizer worker died: %r", exc)
            self.failed = exc
            self.stop.set()
        return _error(500, "tokenizer worker died", "InternalServerError")

    async def _json_for_model(self, request: web.Request) -> dict[str, Any] | web.Response:
        """The request's JSON object, or vLLM's error answer: not JSON, not an object, unknown model."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "request body is not valid JSON", "BadRequestError")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object", "BadRequestError")
        model = body.get("model", self.model_name)
        if model not in self.args.served_model_names:
            aliases = ", ".join(self.args.served_model_names)
            return _error(
                404,
                f"The model `{model}` does not exist. Valid aliases: {aliases}.",
                "NotFoundError",
                "model",
            )
        return body

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's `POST /tokenize`: `{"count", "max_model_len", "tokens", "token_strs"}`."""
        body = await self._json_for_model(request)
        if isinstance(body, web.Response):
            return body
        prompt, messages = body.get("prompt"), body.get("messages")
        add_generation_prompt = body.get("add_generation_prompt", True)
        query: str | list[Mapping[str, Any]]
        if isinstance(prompt, str) and messages is None:
            query = prompt
        elif (
            prompt is None
            and isinstance(messages, list)
            and all(isinstance(m, dict) for m in messages)
            and isinstance(add_generation_prompt, bool)
        ):
            query = messages
        else:
            return _error(
                400,
                "give either prompt (a string) or messages (a list of message objects, with "
                "add_generation_prompt a boolean)",
                "BadRequestError",
            )
        try:
            tokens = await self.prep.tokenize(query, add_generation_prompt)
        except WorkerDied as exc:
            return self._tokenizer_died(exc)
        return web.json_response(
            {
                "count": len(tokens),
                "max_model_len": self.capacity.max_model_len,
                "tokens": tokens,
                "token_strs": None,
            }
        )

    # ---- chat completions ---------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        arrival = time.monotonic()
        body = await self._json_for_model(request)
        if isinstance(body, web.Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            return _error(
                400, "messages must be a non-empty list of message objects", "BadRequestError", "messages"
            )
        try:
            prepared = await self.prep.prepare(messages, self.cache.chunk_size if self.cache else 0)
        except WorkerDied as exc:
            return self._tokenizer_died(exc)
        n = prepared.num_tokens
        max_len = self.capacity.max_model_len
        if n > max_len - 1:
            return _error(
                400,
                f"This model's maximum context length is {max_len} tokens. However, your prompt contains at "
                f"least {n} input tokens, which exceeds this limit even without any output tokens. Please "
                f"reduce the length of the input prompt. (parameter=input_tokens, value={n})",
                "BadRequestError",
                "input_tokens",
            )
        raw_max = body.get("max_completion_tokens", body.get("max_tokens"))
        if raw_max is None:
            max_tokens = min(DEFAULT_MAX_TOKENS, max_len - n)
        elif isinstance(raw_max, bool) or not isinstance(raw_max, int) or raw_max < 1:
            return _error(
                400, f"max_tokens must be at least 1, got {raw_max}.", "BadRequestError", "max_tokens"
            )
        else:
            max_tokens = raw_max
        if n + max_tokens > max_len:
            return _error(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                f"context length is {max_len} tokens and your request has {n} input tokens "
                f"({max_tokens} > {max_len} - {n}).",
                "BadRequestError",
                "max_tokens",
            )
        stream = bool(body.get("stream", False))
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage", False)) if isinstance(options, dict) else False
        params = body.get("kv_transfer_params")
        if params is not None and not isinstance(params, dict):
            return _error(
                400, "kv_transfer_params must be an object", "BadRequestError", "kv_transfer_params"
            )
        req = Request(
            request_id=f"chatcmpl-{secrets.token_hex(8)}",
            num_prompt=n,
            block_hashes=prepared.block_hashes,
            chunk_keys=prepared.chunk_keys,
            max_tokens=max_tokens,
            arrival=arrival,
            want_stats=self.cache is not None and bool(params) and "cached_token_stats" in (params or {}),
        )
        if self.cache is not None:
            try:
                started = time.perf_counter()
                # vLLM's engine id of the request: the answer's id and a suffix of 8 hex digits.
                engine_id = f"{req.request_id}-{secrets.token_hex(4)}"
                hit_chunks, _l2 = await self.cache.lookup(req.chunk_keys, self.engine.chunk_bytes, engine_id)
                if self.metrics.lmcache_lookup is not None:
                    self.metrics.lmcache_lookup.observe(time.perf_counter() - started)
            except CacheServerUnavailable as exc:
                log.error("%s", exc)
                self.engine.fail(req, str(exc))
                return _error(500, f"KV connector failed: {exc}", "InternalServerError")
            req.ext_hit_tokens = hit_chunks * self.cache.chunk_size
        self.engine.add(req)
        try:
            resp = await self._stream(request, req, include_usage) if stream else await self._complete(req)
        except (ConnectionResetError, asyncio.CancelledError):
            self.engine.abort(req)
            raise
        self._keep_timings(request, req)
        return resp

    def _usage(self, req: Request, stream: bool) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": req.num_prompt,
            "total_tokens": req.num_prompt + req.num_output,
            "completion_tokens": req.num_output,
        }
        if self.args.enable_prompt_tokens_details:
            details: dict[str, Any] = {
                "cached_tokens": req.cached_tokens,
                "created_cache_tokens": req.created_cache_tokens,
            }
            if not stream:
                details["multimodal_tokens"] = None
            usage["prompt_tokens_details"] = details
        elif not stream:
            usage["prompt_tokens_details"] = None
        if not stream:
            usage["completion_tokens_details"] = None
        return usage

    def _per_request_metrics(self, req: Request) -> dict[str, Any] | None:
        """vLLM's `metrics` object (--enable-per-request-metrics), from the engine's own timestamps:
        queue = scheduled - arrival, TTFT = first token - scheduled (vLLM leaves the queue out),
        generation = last token - first token; `speculative_decoding` null (no draft model); None
        without the flag. Streams leave the null fields out, as vLLM's do."""
        if not self.args.enable_per_request_metrics:
            return None
        sched, first, last = req.first_scheduled, req.first_token_time, req.last_token_time
        n = req.num_output
        out: dict[str, Any] = dict.fromkeys(
            (
                "time_to_first_token_ms",
                "generation_time_ms",
                "queue_time_ms",
                "mean_itl_ms",
                "tokens_per_second",
                "speculative_decoding",
            )
        )
        if sched is not None:
            out["queue_time_ms"] = (sched - req.arrival) * 1000
            if first is not None:
                out["time_to_first_token_ms"] = (first - sched) * 1000
            if last is not None and last > sched:
                out["tokens_per_second"] = n / (last - sched)
        if first is not None and last is not None:
            out["generation_time_ms"] = (last - first) * 1000
            if n > 1:
                out["mean_itl_ms"] = (last - first) / (n - 1) * 1000
        return out

    def _kv_transfer_params(self, req: Request) -> dict[str, Any] | None:
        """LMCacheMPConnector's answer to `kv_transfer_params: {"cached_token_stats": true}`: the engine's
        own hit, LMCache's lookup hit and what was loaded beyond the first; None when not asked (or no
        connector, as vLLM without one)."""
        if not req.want_stats:
            return None
        return {
            "cached_token_stats": {
                "num_vllm_cached_tokens": req.local_hit_tokens,
                "num_lmcache_cached_tokens": req.ext_hit_tokens,
                "num_lmcache_extra_cached_tokens": req.ext_new_tokens,
            }
        }

    def _keep_timings(self, request: web.Request, req: Request) -> None:
        rid = request.headers.get("x-request-id")
        if self.timings is not None and rid and req.first_token_time is not None:
            self.timings[rid] = {
                "modelled_ttft_s": req.first_token_time - req.arrival,
                "first_write_late_s": req.first_write - req.first_token_time if req.first_write else 0.0,
            }

    async def timings_endpoint(self, _request: web.Request) -> web.Response:
        return web.json_response(self.timings)

    async def _complete(self, req: Request) -> web.Response:
        await req.notify.wait()
        while not req.finished:
            req.notify.clear()
            await req.notify.wait()
        text = "".join(_WORDS[i % len(_WORDS)] for i in range(req.num_output))
        body = {
            "id": req.request_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": text,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "reasoning": None,
                    },
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                    "token_ids": None,
                    "routed_experts": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": self._usage(req, stream=False),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": self._kv_transfer_params(req),
            "ec_transfer_params": None,
            "metrics": self._per_request_metrics(req),
        }
        return web.json_response(body)

    async def _stream(self, request: web.Request, req: Request, include_usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", REPLICA_HEADER: self.replica}
        )
        await resp.prepare(request)
        created = int(time.time())
        head = (
            f'data: {{"id":"{req.request_id}","object":"chat.completion.chunk","created":{created},'
            f'"model":{json.dumps(self.model_name)},"choices":['
        )
        token_head = head + '{"index":0,"delta":{"content":"'
        token_tail = '"},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
        last_tail = '"},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}]}\n\n'
        sent = 0
        while True:
            await req.notify.wait()
            req.notify.clear()
            if req.error is not None:
                break
            upto = req.num_output
            parts: list[str] = []
            if sent == 0 and upto > 0:
                parts.append(
                    head + '{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
                    '"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}\n\n'
                )
            for i in range(sent, upto):
                tail = last_tail if req.finished and i == upto - 1 else token_tail
                parts.append(token_head + _WORDS[i % len(_WORDS)] + tail)
            sent = upto
            if req.finished:
                if include_usage:
                    usage = json.dumps(self._usage(req, stream=True), separators=(",", ":"))
                    extra = ""
                    metrics = self._per_request_metrics(req)
                    if metrics is not None:  # None fields left out, as vLLM's stream chunks do
                        kept = {k: v for k, v in metrics.items() if v is not None}
                        extra = ',"metrics":' + json.dumps(kept, separators=(",", ":"))
                    parts.append(f'{head}],"usage":{usage},"system_fingerprint":"{FINGERPRINT}"{extra}}}\n\n')
                parts.append("data: [DONE]\n\n")
            if parts:
                await resp.write("".join(parts).encode())
                if req.first_write == 0.0:
                    req.first_write = time.monotonic()  # for the timings bench/sim_ttft.py reads
            if req.finished:
                break
        await resp.write_eof()
        return resp


class EngineDead(RuntimeError):
    """The engine loop raised; the process exits non-zero."""


def serve(args: EngineArgs) -> int:
    """Run one simulated replica until SIGTERM/SIGINT; 1 if start-up fails like vLLM's would."""
    profile = load_profile(args.sim_profile)
    capacity = derive_capacity(args, profile)
    plan = derive_startup(args, profile)
    sys.setswitchinterval(0.001)  # keep the event loop responsive next to tokenizer work
    log.info(
        "simulated vLLM %s: model %s served as %s, profile %s (%s)",
        VERSION,
        args.model,
        ", ".join(args.served_model_names),
        profile.name,
        profile.hardware.gpu,
    )
    server = EngineServer(args, profile, capacity)
    try:
        aio.run(_run(server, plan))
    except CacheServerUnavailable as exc:
        log.error("EngineCore failed to start: TimeoutError: %s", exc)
        return 1
    except EngineDead:
        return 1
    except OSError as exc:
        raise UserError(f"--host {args.host} --port {args.port}: cannot listen: {exc}") from exc
    return 0


async def _until_stopped(server: EngineServer, work: Coroutine[Any, Any, None]) -> bool:
    """Run `work` unless SIGTERM/SIGINT comes first (then cancel it); whether it ran to the end."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(server.stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return False
    task.result()  # start-up errors (the cache server never answered) propagate
    return not server.stop.is_set()


async def _run(server: EngineServer, plan: StartupPlan) -> None:
    # Signals first: a stop during the modelled start-up ends it at once, and exits 0 like any stop.
    stop_on_signals(server.stop)
    runner: web.AppRunner | None = None
    try:
        if not await _until_stopped(server, server.start_up(plan)):
            log.info("shutting down (start-up not finished)")
            return
        # aiohttp waits shutdown_timeout (60 s by default) for in-flight handlers: a stream or a queued
        # request then held the process past systemd's TimeoutStopSec. vLLM's own SIGTERM handler
        # cancels its server and engine, cutting open requests, so the simulator gives them a moment
        # and then cancels them too. A client that hangs up has its request aborted, as vLLM does
        # (aiohttp would otherwise run the handler on: a queued request kept the engine busy for nobody).
        runner = app_runner(server.app(), handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, server.args.host, server.args.port, backlog=BACKLOG)
        await site.start()
        log.info("Starting vLLM API server on http://%s:%d", server.args.host, server.args.port)
        await server.stop.wait()
        log.info("shutting down")
    finally:
        if runner is not None:
            await runner.cleanup()
        await server.shut_down()
    if server.failed is not None:
        raise EngineDead(str(server.failed))
