"""Receive one multipart file field straight to disk, counting bytes as they arrive.

Starlette's form parser spools a whole upload before the route sees it and knows no size limit, so the
dataset route parses the request stream itself (python-multipart's push parser) and stops reading the
moment the file passes ``max_bytes``.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from fastapi import Request
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from api.problems import ProblemError, field_error

# Room for the multipart framing and small extra fields around the file itself.
MULTIPART_OVERHEAD_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ReceivedFile:
    path: Path
    filename: str
    content_type: str | None
    size: int


def too_large(max_bytes: int) -> ProblemError:
    return ProblemError(413, f"the upload is larger than the limit of {max_bytes} bytes (the max_upload_bytes limit)",
                        slug="upload-too-large", title="Upload too large",
                        extensions={"limit": "max_upload_bytes", "max_upload_bytes": max_bytes})


def _cut_off() -> ProblemError:
    return ProblemError(400, "malformed multipart body: it ends before its closing boundary (the upload was cut off)",
                        slug="malformed-multipart")


def has_control_characters(text: str) -> bool:
    """C0 and C1 control characters (NUL included: PostgreSQL cannot store it) and DEL."""
    return any(ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0 for char in text)


def _missing_file(field_name: str, message: str) -> ProblemError:
    return ProblemError(
        422, f"{field_name}: {message}", slug="validation-error", title="Invalid request",
        errors=[field_error(field_name, message, type_="missing")],
    )


class _FilePartReceiver:
    """python-multipart callbacks that write the ``field_name`` part to ``handle`` and ignore the rest."""

    def __init__(self, field_name: str, handle: BinaryIO, max_bytes: int) -> None:
        self.field_name, self.max_bytes = field_name, max_bytes
        self.handle = handle
        self.header_field, self.header_value = b"", b""
        self.headers: dict[bytes, bytes] = {}
        self.in_target = False
        self.found = False
        self.filename = ""
        self.content_type: str | None = None
        self.size = 0
        self.ended = False  # the closing boundary was seen

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_part_data": self.on_part_data,
            "on_end": self.on_end,
        }

    def on_part_begin(self) -> None:
        self.headers, self.in_target = {}, False

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def on_header_end(self) -> None:
        self.headers[self.header_field.lower()] = self.header_value
        self.header_field, self.header_value = b"", b""

    def on_headers_finished(self) -> None:
        disposition, options = parse_options_header(self.headers.get(b"content-disposition", b""))
        if disposition != b"form-data" or options.get(b"name", b"").decode("utf-8", "replace") != self.field_name:
            return
        if self.found:
            raise ProblemError(422, f"send exactly one '{self.field_name}' part", slug="validation-error",
                               errors=[field_error(self.field_name, "sent more than once", type_="duplicate")])
        self.found = self.in_target = True
        filename = os.path.basename(options.get(b"filename", b"").decode("utf-8", "replace"))
        if has_control_characters(filename):
            message = "the file name must not contain control characters"
            raise ProblemError(422, f"{self.field_name}: {message}", slug="validation-error", title="Invalid request",
                               errors=[field_error(f"{self.field_name}.filename", message, type_="string_pattern")])
        self.filename = filename or "upload"
        part_type = self.headers.get(b"content-type")
        self.content_type = part_type.decode("latin-1") if part_type else None

    def on_end(self) -> None:
        self.ended = True

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if not self.in_target:
            return
        self.size += end - start
        if self.size > self.max_bytes:
            raise too_large(self.max_bytes)
        self.handle.write(data[start:end])


async def receive_file(request: Request, *, field_name: str, directory: Path, max_bytes: int) -> ReceivedFile:
    """Stream the multipart field ``field_name`` into a new file under ``directory``.

    The caller owns (and must delete) the returned file; on any error nothing is left on disk.
    """
    media_type, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if media_type != b"multipart/form-data" or not boundary:
        raise ProblemError(415, f"send the file as multipart/form-data with a '{field_name}' field",
                           slug="unsupported-media-type")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes + MULTIPART_OVERHEAD_BYTES:
        raise too_large(max_bytes)

    directory.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(dir=directory, prefix=".upload-", suffix=".part")
    path = Path(name)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            receiver = _FilePartReceiver(field_name, handle, max_bytes)
            parser = MultipartParser(boundary, receiver.callbacks())  # type: ignore[arg-type]
            body_bytes = 0
            async for chunk in request.stream():
                body_bytes += len(chunk)
                if body_bytes > max_bytes + MULTIPART_OVERHEAD_BYTES:
                    raise too_large(max_bytes)
                parser.write(chunk)
            parser.finalize()
        if not receiver.ended:  # python-multipart's finalize() does not check this itself
            raise _cut_off()
        if not receiver.found:
            raise _missing_file(field_name, "no file part with this name in the multipart body")
        return ReceivedFile(path, receiver.filename, receiver.content_type, receiver.size)
    except MultipartParseError as exc:
        path.unlink(missing_ok=True)
        raise ProblemError(400, f"malformed multipart body: {exc}", slug="malformed-multipart") from exc
    except BaseException:
        path.unlink(missing_ok=True)
        raise
