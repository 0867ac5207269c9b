"""`kvoffload-lab watch RESULTS_DIR`: a campaign's live page (or, with `--terminal`, a live table).

The page is served by the standard library's threaded HTTP server on loopback by default (an SSH
tunnel reaches it; `--bind` exposes it): `/` is the page (kvoffload/report/watch_page.py), `/state.json`
what kvoffload/report/live.py computes from the results folder, which this command only reads. The
findings of finished cells are computed in a thread of their own, at a lowered priority of this
process, so that a poll never waits for them. `run --watch` starts this command as a process of its
own beside the run (kvoffload/orchestrate/campaign/beside.py): the run never waits for the page.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kvoffload.cli.args import add_command
from kvoffload.errors import UserError

DEFAULT_PORT = 8765
FINDINGS_EVERY_S = 5.0


def register(sub: Any) -> None:
    p = add_command(sub, "watch", watch)
    p.add_argument("results_dir", type=Path, help="the campaign's results folder (results/<campaign>)")
    p.add_argument("--bind", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free)"
    )
    p.add_argument("--terminal", action="store_true", help="a live table in this terminal instead of a page")
    p.add_argument("--parent", type=int, default=None, help=argparse.SUPPRESS)  # run --watch: exit with it


def _check(args: argparse.Namespace) -> None:
    if not args.results_dir.is_dir():
        raise UserError(
            f"{args.results_dir}: no such results folder; give the campaign's folder, e.g. results/<campaign>"
        )
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port}: give a port from 1 to 65535, or 0 for any free one")


def watch(args: argparse.Namespace) -> int:
    """a live page (or terminal table) of a campaign while `run` works, and its final state after

    Serve a page that follows a campaign's results folder: per node the cell running, its phase and for how
    long, replay progress with an ETA, live TTFT and hit rates, what is queued and what failed; the findings
    of finished cells; the campaign's progress and ETA. It reads only what the run writes (status.json, the
    cells' files). Loopback by default: reach it from a laptop through an SSH tunnel (ssh -L
    8765:127.0.0.1:8765 controller).
    """
    from kvoffload.report.live import LiveView

    _check(args)
    if args.parent is not None:
        os.nice(10)  # beside a run: its Ansible comes first on a busy controller
    view = LiveView(args.results_dir.resolve())
    if args.terminal:
        return _terminal(view)
    server = _server(view, args.bind, args.port, args.results_dir.resolve().name)
    host, port = server.server_address[:2]
    print(f"http://{host!s}:{port}/", flush=True)
    stop = threading.Event()
    threading.Thread(target=_findings_loop, args=(view, stop), name="findings", daemon=True).start()
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True)
    serving.start()
    try:
        while not stop.wait(1.0):
            if args.parent is not None and not _alive(args.parent):
                break
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _findings_loop(view: Any, stop: threading.Event) -> None:
    """Findings again whenever the set of DONE cells changed (each try costs a directory listing)."""
    while not stop.is_set():
        view.refresh_findings()
        stop.wait(FINDINGS_EVERY_S)


def _server(view: Any, bind: str, port: int, title: str) -> ThreadingHTTPServer:
    from kvoffload.report.watch_page import page

    body = page(title).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/", "/index.html"):
                self._send(200, "text/html; charset=utf-8", body)
            elif path == "/state.json":
                data = json.dumps(view.state(), default=str).encode()
                self._send(200, "application/json", data)
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")

        def _send(self, code: int, kind: str, data: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass  # one line per poll is not news

    try:
        server = ThreadingHTTPServer((bind, port), Handler)
    except OSError as exc:
        raise UserError(
            f"--bind {bind} --port {port}: cannot serve there ({exc.strerror}); try --port 0"
        ) from exc
    server.daemon_threads = True
    return server


def _table(state: dict[str, Any]) -> Any:
    from rich.table import Table

    from kvoffload.report.live import FINAL_STATES

    def dur(s: float | None) -> str:
        return "?" if s is None else f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"

    p = state.get("progress") or {"done": 0, "failed": 0, "total": 0}
    title = (
        f"{state.get('campaign') or '(no status.json yet)'}: {state.get('state')}"
        f"{' - ' + str(state['phase']) if state.get('phase') else ''} - cells {p['done']} done, "
        f"{p['failed']} failed of {p['total']} - elapsed {dur(state.get('elapsed_s'))}"
        + ("" if state.get("state") in FINAL_STATES else f", ETA {dur(state.get('eta_s'))}")
    )
    table = Table(title=title, title_justify="left")
    for column in ("node", "cell", "phase", "for", "replay", "TTFT p50/p95", "queued", "done", "failed"):
        table.add_column(column)
    for r in state.get("nodes") or []:
        rp, live = r.get("replay"), r.get("live")
        replay = f"{rp['done']}/{rp['expected'] or '?'}, ETA {dur(rp['eta_s'])}" if rp else "-"
        ttft = "-"
        if live and live.get("ttft_p50_s") is not None:
            ttft = f"{live['ttft_p50_s'] * 1000:.0f}/{(live.get('ttft_p95_s') or 0) * 1000:.0f} ms"
        table.add_row(
            r["node"],
            r.get("cell") or "-",
            r.get("phase") or "-",
            dur(r.get("in_phase_s")),
            replay,
            ttft,
            str(len(r["queued"])),
            str(len(r["done"])),
            "\n".join(f"{f['cell']}: {f['why']}"[:80] for f in r["failed"]) or "-",
        )
    return table


def _terminal(view: Any) -> int:
    """A rich live table of the per-node status until the run is over (or Ctrl-C)."""
    from rich.console import Console
    from rich.live import Live

    from kvoffload.report.live import FINAL_STATES

    console = Console()
    try:
        with Live(_table(view.state()), console=console, refresh_per_second=1) as live:
            while True:
                state = view.state()
                live.update(_table(state))
                if state.get("state") in FINAL_STATES:
                    break
                time.sleep(2.0)
    except KeyboardInterrupt:
        return 130
    return 0
