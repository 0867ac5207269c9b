"""How faithfully does the simulated engine deliver the TTFT it models? 256 concurrent streams.

Starts `kvoffload-lab sim serve` (its own process, tiny profile unless --sim-profile) with
KVOFFLOAD_SIM_TIMINGS=1, so it keeps each request's modelled TTFT (arrival in the engine's handler to the
modelled end of the step that produced the first token) under the request's x-request-id. A closed loop
of N concurrent streams, sent by the replay client itself (`kvoffload.replay.client.stream_chat`, the
code that measures every campaign), sends chat requests of 200-2000 tokens of fresh text (no prefix
sharing) for a while. The error of a request is the TTFT the replay client recorded minus the modelled
TTFT: the request's way in (write, kernel, HTTP parsing in the engine), the engine's lateness and the
way back together. The engine's share (its first write of the stream minus the modelled time) is shown
on its own row. Slots start evenly over a warm-up that is not measured. Target (issue 3): p99 <= 2 ms
at 256 streams on the 2-core dev machine.

    .venv/bin/python bench/sim_ttft.py [--streams 256] [--seconds 20] [--sim-profile tiny]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvoffload import aio  # noqa: E402
from kvoffload.replay.client import stream_chat  # noqa: E402
from kvoffload.replay.netstamp import stamped_client  # noqa: E402

CLI = str(Path(sys.executable).parent / "kvoffload-lab")
WORDS = ("the", "cache", "is", "a", "block", "of", "keys", "and", "values", "for")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _prompt(rng: random.Random) -> list[dict[str, str]]:
    # About 200-2000 tokens: one token per word and one per space; a random tag defeats prefix hits.
    n = rng.randint(100, 1000)
    text = f"{rng.randint(0, 10**9)} " + " ".join(rng.choice(WORDS) for _ in range(n))
    return [{"role": "user", "content": text}]


async def _one(client: httpx.AsyncClient, url: str, rng: random.Random) -> tuple[str, float] | None:
    """One request through the replay client; its id and client-measured TTFT (None if it failed)."""
    body = {
        "model": "bench",
        "messages": _prompt(rng),
        "max_tokens": 32,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    rid = uuid.uuid4().hex
    r = await stream_chat(client, url, body, {"x-request-id": rid}, 600.0)
    return (rid, r.ttft_s) if r.status == "ok" and r.ttft_s is not None else None


async def _run(url: str, streams: int, seconds: float, warmup: float) -> dict[str, float]:
    """Closed loop; slots start evenly over the warm-up, and requests started in it are not kept."""
    out: dict[str, float] = {}
    t0 = time.monotonic()
    deadline = t0 + warmup + seconds
    limits = httpx.Limits(max_connections=streams + 8, max_keepalive_connections=None)
    async with stamped_client(limits=limits, timeout=httpx.Timeout(600.0)) as client:

        async def slot(i: int) -> None:
            rng = random.Random(i)
            await asyncio.sleep(i * warmup / (2 * streams))
            while time.monotonic() < deadline:
                started = time.monotonic()
                r = await _one(client, url, rng)
                if r is not None and started - t0 >= warmup:
                    out[r[0]] = r[1]

        await asyncio.gather(*(slot(i) for i in range(streams)))
    return out


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=5.0, help="ramp-up seconds, not measured")
    ap.add_argument("--sim-profile", default="tiny")
    ns = ap.parse_args()
    port = _free_port()
    cmd = [CLI, "sim", "serve", "bench", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--sim-profile", ns.sim_profile, "--max-num-seqs", "256", "--max-model-len", "8192"]
    env = {**os.environ, "KVOFFLOAD_SIM_TIMINGS": "1"}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                print("engine did not start", file=sys.stderr)
                return 1
            time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        delivered = aio.run(_run(url, ns.streams, ns.seconds, ns.warmup))
        engine = httpx.get(f"http://127.0.0.1:{port}/kvoffload/timings", timeout=30).json()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    kept = [rid for rid in delivered if rid in engine]
    if not kept:
        print("no successful requests", file=sys.stderr)
        return 1
    modelled = [engine[rid]["modelled_ttft_s"] for rid in kept]
    errors_ms = [(delivered[rid] - engine[rid]["modelled_ttft_s"]) * 1e3 for rid in kept]
    server_ms = [engine[rid]["first_write_late_s"] * 1e3 for rid in kept]
    table = Table(
        title=f"sim TTFT fidelity: {ns.streams} streams, {ns.seconds:.0f} s, profile {ns.sim_profile}"
    )
    for col in ("error measured at", "requests", "modelled TTFT p50", "p50", "p99", "max", "mean"):
        table.add_column(col, justify="right")
    rows = (
        ("client (delivered - modelled)", errors_ms),
        ("engine (first write - modelled)", server_ms),
    )
    for label, values in rows:
        table.add_row(
            label,
            str(len(values)),
            f"{_pct(modelled, 0.5) * 1e3:.0f} ms",
            f"{_pct(values, 0.5):.2f} ms",
            f"{_pct(values, 0.99):.2f} ms",
            f"{max(values):.2f} ms",
            f"{statistics.fmean(values):.2f} ms",
        )
    Console().print(table)
    print("target: error p99 <= 2 ms at 256 streams")
    return 0


if __name__ == "__main__":
    sys.exit(main())
