"""limit/offset paging shared by the list routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request

MAX_PAGE_SIZE = 200

LimitQuery = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description="rows per page")]
OffsetQuery = Annotated[int, Query(ge=0, le=10**9, description="rows to skip")]


def next_page(request: Request, *, limit: int, offset: int, returned: int, total: int) -> str | None:
    """The relative URL of the next page (same filters), or None when this page is the last."""
    if offset + returned >= total or returned == 0:
        return None
    url = request.url.include_query_params(limit=limit, offset=offset + limit)
    return f"{url.path}?{url.query}"
