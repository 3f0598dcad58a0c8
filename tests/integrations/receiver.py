"""A local HTTP endpoint that records the JSON bodies posted to it (the
notification tests' stand-in for a webhook relay); ``fail_first`` answers
503 to that many posts first."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JsonReceiver:
    def __init__(self, fail_first: int = 0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.refused = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    if receiver.refused < fail_first:
                        receiver.refused += 1
                        status = 503
                    else:
                        receiver.bodies.append(json.loads(body))
                        status = 204
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/hook"

    def received(self, event: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [b for b in self.bodies if event is None or b["event"] == event]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
