"""Loopback endpoints the tests talk to: a port where nothing listens, and a server of fixed pages."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

EXPOSITION_TYPE = "text/plain; version=1.0.0; charset=utf-8"


def free_port() -> int:
    """A loopback TCP port that was free a moment ago: nothing listens there (until someone binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve_pages(pages: Mapping[str, bytes], content_type: str = EXPOSITION_TYPE) -> Iterator[str]:
    """Serve `pages` (path -> body; any other path is a 404) on a loopback port until the block ends;
    yields the base URL, http://127.0.0.1:<port>."""

    class Pages(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)
