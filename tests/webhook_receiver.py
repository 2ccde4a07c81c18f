"""A real HTTP receiver for the webhook tests: http.server on 127.0.0.1 in a thread, answering each POST with
the next scripted reply and recording the path, headers and raw body it got."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TRICKLE_BYTES = 600


def trickle(stream: Any, seconds_per_byte: float) -> None:
    message = b"HTTP/1.1 200 OK\r\nX-Tarpit: " + b"a" * TRICKLE_BYTES
    try:
        for index in range(len(message)):
            stream.write(message[index : index + 1])
            stream.flush()
            time.sleep(seconds_per_byte)
    except OSError:  # the client hung up
        return


class BannerServer:
    """A TCP service that is not HTTP (it sends an SSH-like banner and closes), on 127.0.0.1."""

    def __init__(self, banner: bytes = b"SSH-2.0-OpenSSH_9.6\r\n") -> None:
        self.banner = banner
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.socket.getsockname()[1]}/hook"

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            with connection:
                connection.sendall(self.banner)

    def close(self) -> None:
        self.socket.close()


class Receiver:
    """A local HTTP endpoint that answers each POST with the next scripted reply (``default`` once they are
    used up) and records what it got: an int is a status code, ("redirect", code) answers with a Location,
    ("sleep", seconds) answers 200 late, ("trickle", seconds) sends a status line and a header one byte every
    that many seconds, a tarpit, until the client hangs up (or TRICKLE_BYTES are sent)."""

    def __init__(self, replies: list[Any], default: Any = 200, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.replies = list(replies)
        self.default = default
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                reply = receiver.replies.pop(0) if receiver.replies else receiver.default
                if isinstance(reply, tuple) and reply[0] == "trickle":
                    trickle(self.wfile, reply[1])
                    return
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
        if tls is not None:  # https: the handshake on accept, with the server's certificate
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.server.server_address[1]}/hooks/gpuest?token=abc"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# Names the webhook tests resolve, answered without the network (store.webhook_targets.lookup is replaced by
# the root conftest): public documentation-style addresses for the receivers' names, private ones for attacks.
FAKE_DNS: dict[str, list[str]] = {
    "localhost": ["127.0.0.1", "::1"],
    "example.com": ["93.184.215.14"],
    "receiver.internal": ["93.184.215.20"],
    "other.internal": ["93.184.215.21"],
    "metadata.google.internal": ["169.254.169.254"],
    "intranet.example": ["10.20.30.40"],
    "mixed.example": ["93.184.215.22", "192.168.1.10"],
    "v6private.example": ["fd12:3456::1"],
}


class FakeResolver:
    """A replacement for ``store.webhook_targets.lookup``: answers from a table a test may change (a name
    resolving elsewhere later: DNS rebinding) and counts the lookups of each name."""

    def __init__(self) -> None:
        self.table = {name: list(addresses) for name, addresses in FAKE_DNS.items()}
        self.lookups: dict[str, int] = {}

    def __call__(self, host: str, port: int) -> list[str]:
        name = host.lower().rstrip(".")
        self.lookups[name] = self.lookups.get(name, 0) + 1
        if name not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(self.table[name])
