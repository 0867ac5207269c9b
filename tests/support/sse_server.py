"""A small OpenAI-compatible streaming server with injected, known timing, for tests and benchmarks.

`POST /v1/chat/completions` streams `--tokens` chunks (or `max_tokens` when smaller is asked), the
first `--ttft` seconds after the whole request is in and the rest every `--itl` seconds, then a usage
chunk and `[DONE]`. It remembers each request (headers, body) and the delay it really achieved before
writing the first token (`GET /requests`, `GET /timings`), so a client's TTFT error can be computed
without trusting the server's sleep accuracy. `x-fail: <status>` makes a request fail with that status
(`--fail-user S`: every request of users whose id contains S); `--replica NAME` adds
`x-kvoffload-replica`. Run: `python tests/support/sse_server.py --port 0` (prints `PORT <n>` when ready).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from aiohttp import web


def make_app(
    ttft: float, itl: float, tokens: int, replica: str | None, fail_user: str | None = None
) -> web.Application:
    requests: list[dict[str, Any]] = []
    timings: dict[str, float] = {}

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        # The clock starts once the whole request is in, as a real server's can (it needs the prompt);
        # aiohttp runs the handler as soon as the headers are in.
        t0 = time.perf_counter()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        requests.append({"headers": dict(request.headers), "body": body, "peer": list(peer or ())})
        fail = request.headers.get("x-fail")
        if fail_user and fail_user in request.headers.get("x-user-id", ""):
            fail = "500"
        if fail:
            return web.json_response(
                {
                    "error": {
                        "message": "injected failure",
                        "type": "BadRequestError",
                        "param": None,
                        "code": int(fail),
                    }
                },
                status=int(fail),
            )
        n = min(tokens, int(body.get("max_tokens") or tokens))
        resp = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8"})
        if replica:
            resp.headers["x-kvoffload-replica"] = replica
        await resp.prepare(request)
        base = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "model": body.get("model")}
        role = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        await resp.write(f"data: {json.dumps(role)}\n\n".encode())
        for i in range(n):
            target = t0 + ttft + i * itl
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            chunk = {
                **base,
                "choices": [{"index": 0, "delta": {"content": f" tok{i}"}, "finish_reason": None}],
            }
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if i == 0:
                rid = request.headers.get("x-request-id")
                if rid:
                    timings[rid] = time.perf_counter() - t0
        prompt = sum(len(str(m.get("content") or "")) // 4 for m in body.get("messages", []))
        usage = {
            **base,
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": n,
                "total_tokens": prompt + n,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        }
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    async def get_requests(_request: web.Request) -> web.Response:
        return web.json_response(requests)

    async def get_timings(_request: web.Request) -> web.Response:
        return web.json_response(timings)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/requests", get_requests)
    app.router.add_get("/timings", get_timings)
    return app


async def serve(args: argparse.Namespace) -> None:
    runner = web.AppRunner(
        make_app(args.ttft, args.itl, args.tokens, args.replica, args.fail_user), access_log=None
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port, backlog=2048)
    await site.start()
    port = runner.addresses[0][1]
    print(f"PORT {port}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft", type=float, default=0.05)
    p.add_argument("--itl", type=float, default=0.01)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--replica")
    p.add_argument("--fail-user", help="answer 500 to requests whose x-user-id contains this")
    args = p.parse_args()
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
