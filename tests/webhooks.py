"""A loopback webhook receiver for the tests of the grid's ``notify:`` alerts."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """A loopback webhook: records each JSON body (and, in ``times``, when it came);
    ``delay`` seconds before it answers."""

    def __init__(self, delay: float = 0.0) -> None:
        bodies, self.delay = [], delay
        self.times: list[float] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(outer.delay)
                outer.times.append(time.time())
                bodies.append(json.loads(data))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.bodies = bodies
        class Server(ThreadingHTTPServer):
            def handle_error(self, request: object, client_address: object) -> None:
                pass  # a client that timed out and left (the slow-receiver test) is expected

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/T0KEN-secret"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
