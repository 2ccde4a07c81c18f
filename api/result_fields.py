"""The ``fields`` of a group's results table: comma-separated dotted paths into a member's result.

A path is printable ASCII (no comma) of at most ``MAX_FIELD_SEGMENTS`` dot-separated, non-empty segments; a
segment of ASCII digits indexes a list, and a key may hold dots itself (``rejection_rate.0.05`` reads the key
"0.05" of ``rejection_rate``). Anything else is a 422 naming ``fields``, decided on the text alone, before a
result is read: Unicode digits (``str.isdigit`` accepts "²", which ``int`` refuses), control characters and
paths whose lookup would grow with the square of their length."""

from __future__ import annotations

import re
from typing import Any

from api.job_checks import invalid
from api.problems import ProblemError, field_error

MAX_FIELDS = 100
MAX_FIELD_SEGMENTS = 16
# One path: printable ASCII without the comma that separates paths; segments are split at dots below.
FIELD_PATH = re.compile(r"[\x20-\x2b\x2d-\x7e]+")
LIST_INDEX = re.compile(r"[0-9]{1,9}")


def _refused(message: str, type_: str) -> ProblemError:
    return invalid([field_error("fields", message, type_=type_, location="query")])


def parse_fields(text: str) -> list[str]:
    """The paths ``text`` lists (blank items skipped), each checked against the grammar above."""
    paths = [item.strip() for item in text.split(",")]
    paths = [path for path in paths if path]
    if len(paths) > MAX_FIELDS:
        raise _refused(f"{len(paths)} fields; at most {MAX_FIELDS}", "too_many_fields")
    for path in paths:
        if not FIELD_PATH.fullmatch(path):
            raise _refused(
                f"{path.encode('ascii', 'backslashreplace').decode()!r} is not a field path: a dotted path of "
                "printable ASCII characters, e.g. conf_int.0 or timings.total",
                "field_path",
            )
        segments = path.split(".")
        if any(not segment.strip() for segment in segments):
            raise _refused(f"{path!r} has an empty part between dots", "field_path")
        if len(segments) > MAX_FIELD_SEGMENTS:
            raise _refused(f"{path!r} has {len(segments)} parts; at most {MAX_FIELD_SEGMENTS}", "field_path")
    return paths


def lookup(value: Any, path: list[str]) -> tuple[bool, Any]:
    """(found, value) of a path's segments inside a result: an ASCII number indexes a list, and a key may
    hold dots itself."""
    if not path:
        return True, value
    if isinstance(value, list):
        head = path[0]
        if LIST_INDEX.fullmatch(head) and int(head) < len(value):
            return lookup(value[int(head)], path[1:])
        return False, None
    if isinstance(value, dict):
        for length in range(1, len(path) + 1):
            key = ".".join(path[:length])
            if key in value:
                found, item = lookup(value[key], path[length:])
                if found:
                    return True, item
    return False, None
