"""A local stand-in for Sentry's ingest: records the envelopes the SDK posts
(gzip-compressed ``POST /api/<project>/envelope/``), so a test counts the
check-ins real processes send without a Sentry account."""

from __future__ import annotations

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def envelope_items(body: bytes) -> list[tuple[dict[str, Any], bytes]]:
    """The (item header, payload) pairs of one envelope."""
    _header, _, rest = body.partition(b"\n")
    items = []
    while rest.strip():
        line, _, rest = rest.partition(b"\n")
        item = json.loads(line)
        length = item.get("length")
        if length is None:
            payload, _, rest = rest.partition(b"\n")
        else:
            payload, rest = rest[:length], rest[length + 1 :]
        items.append((item, payload))
    return items


class SentryRecorder:
    def __init__(self) -> None:
        self.check_ins: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                with recorder._lock:
                    recorder.paths.append(self.path)
                    for item, payload in envelope_items(body):
                        if item.get("type") == "check_in":
                            recorder.check_ins.append(json.loads(payload))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def dsn(self) -> str:
        return f"http://public@127.0.0.1:{self.server.server_port}/42"

    def recorded(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.check_ins)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
