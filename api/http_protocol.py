"""uvicorn's HTTP/1.1 protocols with one change: a request the parser refuses (a control character in a
header, a malformed request line) is answered with a problem+json 400, not uvicorn's plain-text one.

uvicorn answers such a request itself, before the application sees it, so no handler in ``api.app`` can.
Select these with ``uvicorn api.app:app --http api.http_protocol:ProblemHttpToolsProtocol`` (the default
parser, httptools) or ``--http api.http_protocol:ProblemH11Protocol``. Both override uvicorn's
``send_400_response``, the hook uvicorn calls for exactly this case; ``tests/api/test_http_protocol.py``
runs a real uvicorn to keep that true across uvicorn versions.
"""

from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from api.problems import PROBLEM_MEDIA_TYPE, problem_type

MALFORMED_REQUEST_BODY = json.dumps({
    "type": problem_type("malformed-request"),
    "title": "Bad Request",
    "status": 400,
    "detail": "the request is not valid HTTP/1.1 (for example, a control character in a header)",
}).encode()


def _problem_headers() -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
        (b"content-length", str(len(MALFORMED_REQUEST_BODY)).encode()),
        (b"connection", b"close"),
    ]


class ProblemHttpToolsProtocol(HttpToolsProtocol):
    def send_400_response(self, msg: str) -> None:
        content = [STATUS_LINE[400]]
        for name, value in [*self.server_state.default_headers, *_problem_headers()]:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend([b"\r\n", MALFORMED_REQUEST_BODY])
        self.transport.write(b"".join(content))
        self.transport.close()


class ProblemH11Protocol(H11Protocol):
    def send_400_response(self, msg: str) -> None:
        headers = [(name, value) for name, value in _problem_headers() if name != b"content-length"]
        self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers, reason=b"Bad Request")))
        self.transport.write(self.conn.send(h11.Data(data=MALFORMED_REQUEST_BODY)))
        self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()
