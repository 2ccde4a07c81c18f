"""One webhook attempt's HTTP request under a total deadline, connected to addresses checked beforehand.

httpcore's timeouts bound each network operation, so a receiver answering one byte at a time resets them
forever. Here every operation (connect, the TLS handshake, each write and read) gets what is left of one
deadline for the whole attempt, and none starts once it has passed: the attempt ends at the deadline however
the receiver trickles. (CPython bounds a blocking TLS handshake, read or write as a whole by the socket's
timeout.)

The connection goes to the addresses store/webhook_targets.py vetted, never to a second resolution of the name;
the URL keeps its host, so the Host header, TLS SNI and certificate verification still name it.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

# A write is split so that each part gets its own share of the deadline (a receiver reading slowly).
WRITE_CHUNK_BYTES = 16 * 1024


class Deadline:
    """A point in monotonic time; ``bound`` turns an operation's own timeout into what is left of it."""

    def __init__(self, seconds: float) -> None:
        self.expires = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.expires - time.monotonic()

    def bound(self, timeout: float | None, expired: type[httpcore.TimeoutException]) -> float:
        left = self.remaining()
        if left <= 0:
            raise expired("the attempt's deadline has passed")
        return left if timeout is None else min(timeout, left)


class DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, deadline: Deadline) -> None:
        self._inner = inner
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._deadline.bound(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), WRITE_CHUNK_BYTES):
            self._inner.write(
                buffer[start : start + WRITE_CHUNK_BYTES], self._deadline.bound(timeout, httpcore.WriteTimeout)
            )

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        bounded = self._deadline.bound(timeout, httpcore.ConnectTimeout)
        return DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, bounded), self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class PinnedBackend(httpcore.NetworkBackend):
    """Connects to the given addresses in turn (whatever host the request names), under the deadline."""

    def __init__(self, addresses: Sequence[str], deadline: Deadline) -> None:
        self._addresses = list(addresses)
        self._deadline = deadline
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        failure: Exception = httpcore.ConnectError("no address to connect to")
        for address in self._addresses:
            try:
                stream = self._inner.connect_tcp(
                    address, port, self._deadline.bound(timeout, httpcore.ConnectTimeout), local_address, socket_options
                )
            except httpcore.ConnectError as exc:  # refused or unreachable: the next address, if any
                failure = exc
                continue
            return DeadlineStream(stream, self._deadline)
        raise failure

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are not webhook targets")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def ssl_context() -> ssl.SSLContext:
    """Certificates verified against certifi's roots, by the URL's host name."""
    return httpx.create_ssl_context()


@dataclass(frozen=True)
class Response:
    status_code: int


def post(url: str, body: bytes, headers: dict[str, str], addresses: Sequence[str], seconds: float) -> Response:
    """POST ``body`` to ``url`` over a connection to one of ``addresses``, all within ``seconds``: the status
    line and headers are read, the response body never is. Redirects are not followed, no proxy or .netrc is
    used. Raises httpcore's exceptions (a TimeoutException once the deadline has passed)."""
    deadline = Deadline(seconds)
    parsed = httpx.URL(url)  # IDNA and percent-encoding as httpx does them (raises httpx.InvalidURL)
    target = httpcore.URL(scheme=parsed.raw_scheme, host=parsed.raw_host, port=parsed.port, target=parsed.raw_path)
    sent = [("Host", parsed.netloc.decode("ascii")), *headers.items(), ("Content-Length", str(len(body)))]
    timeouts = {"connect": seconds, "read": seconds, "write": seconds, "pool": seconds}
    with (
        httpcore.ConnectionPool(
            ssl_context=ssl_context(),
            max_connections=1,
            retries=0,
            network_backend=PinnedBackend(addresses, deadline),
        ) as pool,
        pool.stream(
            "POST",
            target,
            headers=sent,
            content=body,
            extensions={"timeout": timeouts},
        ) as response,
    ):
        return Response(response.status)
