"""A real HTTP receiver for the webhook tests: http.server on 127.0.0.1 in a thread, answering each POST with
the next scripted reply and recording the path, headers and raw body it got."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """A local HTTP endpoint that answers each POST with the next scripted reply and records what it got:
    an int is a status code, ("redirect", code) answers with a Location, ("sleep", seconds) answers 200 late."""

    def __init__(self, replies: list[Any]) -> None:
        self.replies = list(replies)
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                reply = receiver.replies.pop(0) if receiver.replies else 200
                if isinstance(reply, tuple) and reply[0] == "sleep":
                    time.sleep(reply[1])
                    reply = 200
                if isinstance(reply, tuple) and reply[0] == "redirect":
                    self.send_response(reply[1])
                    self.send_header("Location", "/elsewhere")
                else:
                    self.send_response(reply)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/gpuest?token=abc"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
