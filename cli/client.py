"""A small typed client for the gpuest REST API (httpx), used by the CLI and usable from scripts.

Every non-2xx answer raises :class:`ApiError` carrying the RFC 9457 problem+json body, so a caller sees
the field and bound that a spec broke rather than a bare status code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypedDict, cast

import httpx

from core.status import TERMINAL_STATUSES

DEFAULT_URL = "http://127.0.0.1:8000"
PARQUET_MEDIA_TYPE = "application/vnd.apache.parquet"
UPLOAD_MEDIA_TYPES = {".csv": "text/csv", ".parquet": PARQUET_MEDIA_TYPE, ".pq": PARQUET_MEDIA_TYPE}


class JobError(TypedDict, total=False):
    type: str
    message: str
    code: str
    correlation_id: str


class Job(TypedDict, total=False):
    """The job object as the API returns it (only the names users rely on are spelled out)."""

    id: str
    kind: str
    status: str
    params: dict[str, Any]
    progress: float
    stage: str | None
    device: str | None
    attempts: int
    error: JobError | None
    timings: dict[str, Any]
    created_at: str
    started_at: str | None
    finished_at: str | None
    artifacts: list[str]


class Dataset(TypedDict, total=False):
    id: str
    name: str
    n_rows: int
    columns: list[dict[str, str]]
    created_at: str


class ApiError(Exception):
    """A non-2xx answer; ``problem`` is the decoded problem+json body (or a stand-in built from the text)."""

    def __init__(
        self, status_code: int, problem: Mapping[str, Any], method: str = "", url: str = "",
        retry_after: float | None = None,
    ) -> None:
        self.status_code = status_code
        self.problem = dict(problem)
        self.method = method
        self.url = url
        self.retry_after = retry_after  # seconds, from a 503's Retry-After header
        super().__init__(self.describe())

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {"title": response.reason_phrase or "error", "detail": response.text[:500] or None}
        return cls(response.status_code, body, response.request.method, str(response.request.url),
                   retry_after=_seconds(response.headers.get("retry-after")))

    @property
    def title(self) -> str:
        return str(self.problem.get("title") or "error")

    @property
    def detail(self) -> str | None:
        detail = self.problem.get("detail")
        return None if detail is None else str(detail)

    def describe(self) -> str:
        """One readable paragraph: status, title, detail and each field error the API named."""
        text = f"HTTP {self.status_code} {self.title}"
        errors = self.problem.get("errors") or []
        # With field errors the detail only strings them together: list them instead.
        if self.detail and self.detail != self.title and not errors:
            text += f": {self.detail}"
        for error in errors:
            if isinstance(error, Mapping):
                location = error.get("field") or error.get("loc") or ""
                if isinstance(location, list | tuple):
                    location = ".".join(str(part) for part in location)
                text += f"\n  - {location}: {error.get('message') or error.get('msg') or error}"
            else:
                text += f"\n  - {error}"
        return text


def _seconds(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # the HTTP-date form: not sent by gpuest
        return None


class GpuestClient:
    """Synchronous client. ``api_key`` is sent as ``Authorization: Bearer <key>`` when given."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Accept": "application/json, application/problem+json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- plumbing ----------------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self._http.request(method, path, **kwargs)
        if response.is_error:
            raise ApiError.from_response(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    # -- service -----------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._json("GET", "/healthz"))

    def ready(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._json("GET", "/readyz"))

    # -- jobs --------------------------------------------------------------------------------------

    def submit(self, kind: str, params: Mapping[str, Any], idempotency_key: str | None = None, *,
               callback_url: str | None = None) -> Job:
        """Create a job (202); the same ``idempotency_key`` returns the same job on a retried POST. With
        ``callback_url``, a signed webhook is POSTed there once the job finishes (README: Webhooks)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body: dict[str, Any] = {"kind": kind, "params": dict(params)}
        if callback_url is not None:
            body["callback_url"] = callback_url
        return cast(Job, self._json("POST", "/v1/jobs", json=body, headers=headers))

    def get_job(self, job_id: str) -> Job:
        return cast(Job, self._json("GET", f"/v1/jobs/{job_id}"))

    def list_jobs(
        self, *, kind: str | None = None, status: str | None = None, limit: int = 50, offset: int = 0
    ) -> dict[str, Any]:
        """One page: the API's list object (``items`` plus the paging fields)."""
        query: dict[str, Any] = {"limit": limit, "offset": offset}
        if kind:
            query["kind"] = kind
        if status:
            query["status"] = status
        return cast(dict[str, Any], self._json("GET", "/v1/jobs", params=query))

    def cancel(self, job_id: str) -> Job:
        return cast(Job, self._json("POST", f"/v1/jobs/{job_id}/cancel"))

    def result(self, job_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._json("GET", f"/v1/jobs/{job_id}/result"))

    def download_artifact(self, job_id: str, name: str, destination: Path) -> Path:
        """Stream one artifact to ``destination`` (written to a side file, then renamed)."""
        partial = destination.with_name(destination.name + ".part")
        with self._http.stream("GET", f"/v1/jobs/{job_id}/artifacts/{name}") as response:
            if response.is_error:
                response.read()
                raise ApiError.from_response(response)
            with partial.open("wb") as handle:
                for chunk in response.iter_bytes():
                    handle.write(chunk)
        partial.replace(destination)
        return destination

    def plots(self, job_id: str) -> list[dict[str, Any]]:
        """The plots a succeeded job offers: name, title, href."""
        return cast(list[dict[str, Any]], self._json("GET", f"/v1/jobs/{job_id}/plots"))

    def download_plot(self, job_id: str, name: str, destination: Path, fmt: str = "svg",
                      options: Mapping[str, float] | None = None) -> Path:
        """Write one plot (``svg`` or ``png``) to ``destination`` (a side file, then renamed); ``options``: the
        plot's options (e.g. ``{"mu": 0.5}``)."""
        response = self._http.get(f"/v1/jobs/{job_id}/plots/{name}", params={**(options or {}), "format": fmt})
        if response.is_error:
            raise ApiError.from_response(response)
        partial = destination.with_name(destination.name + ".part")
        partial.write_bytes(response.content)
        partial.replace(destination)
        return destination

    # -- job groups (sweeps) -------------------------------------------------------------------------

    def submit_group(self, body: Mapping[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        """Create a job group (202) from ``{base, grid}`` or ``{base?, specs}`` (see POST /v1/job-groups)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return cast(dict[str, Any], self._json("POST", "/v1/job-groups", json=dict(body), headers=headers))

    def get_group(self, group_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._json("GET", f"/v1/job-groups/{group_id}"))

    def cancel_group(self, group_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._json("POST", f"/v1/job-groups/{group_id}/cancel"))

    def delete_group(self, group_id: str) -> None:
        """Delete a finished group with its members (409 while a member is queued or running)."""
        self._request("DELETE", f"/v1/job-groups/{group_id}")

    def group_results(self, group_id: str, *, fields: str | None = None, fmt: str = "csv") -> bytes:
        """The group's results table (one row per member) as CSV or Parquet bytes."""
        query = {"format": fmt, **({"fields": fields} if fields else {})}
        return self._request("GET", f"/v1/job-groups/{group_id}/results", params=query).content

    def job_events(self, job_id: str, *, limit: int = 200, offset: int = 0) -> dict[str, Any]:
        """One page of the job's log (oldest first)."""
        return cast(dict[str, Any], self._json("GET", f"/v1/jobs/{job_id}/events",
                                               params={"limit": limit, "offset": offset}))

    def wait(
        self,
        job_id: str,
        on_progress: Callable[[Job], None] | None = None,
        *,
        poll_interval: float = 0.5,
        timeout: float | None = None,
        until: Callable[[Job], bool] | None = None,
        unavailable_grace: float = 300.0,
    ) -> Job:
        """Poll until the job reaches a terminal status (or ``until(job)`` holds); ``on_progress`` sees every
        polled job object. Raises TimeoutError after ``timeout`` seconds. While the service answers 503 (its
        database restarting) it keeps polling after each Retry-After, for up to ``unavailable_grace`` seconds
        in a row: the job itself is safe in the database."""
        done = until or (lambda job: job.get("status") in TERMINAL_STATUSES)
        deadline = None if timeout is None else time.monotonic() + timeout
        unavailable_since: float | None = None
        while True:
            try:
                job = self.get_job(job_id)
            except ApiError as error:
                now = time.monotonic()
                unavailable_since = unavailable_since if unavailable_since is not None else now
                if (error.status_code != 503 or now - unavailable_since > unavailable_grace
                        or (deadline is not None and now >= deadline)):
                    raise
                time.sleep(min(error.retry_after if error.retry_after is not None else poll_interval, 30.0))
                continue
            unavailable_since = None
            if on_progress is not None:
                on_progress(job)
            if done(job):
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} still {job.get('status')} after {timeout} s")
            time.sleep(poll_interval)

    # -- datasets ----------------------------------------------------------------------------------

    def upload_dataset(self, path: Path) -> Dataset:
        """Upload a CSV or Parquet file (multipart field ``file``); the answer carries the dataset ``id``."""
        # Named only for the two formats; anything else goes as octet-stream and the API judges it by its name.
        media_type = UPLOAD_MEDIA_TYPES.get(path.suffix.lower(), "application/octet-stream")
        with path.open("rb") as handle:
            return cast(Dataset, self._json("POST", "/v1/datasets", files={"file": (path.name, handle, media_type)}))

    def list_datasets(self, *, limit: int = 50, offset: int = 0) -> dict[str, Any]:
        return cast(dict[str, Any], self._json("GET", "/v1/datasets", params={"limit": limit, "offset": offset}))

    def get_dataset(self, dataset_id: str) -> Dataset:
        return cast(Dataset, self._json("GET", f"/v1/datasets/{dataset_id}"))

    def delete_dataset(self, dataset_id: str) -> None:
        self._request("DELETE", f"/v1/datasets/{dataset_id}")

    def dataset_from_artifact(self, job_id: str, artifact: str, name: str | None = None) -> Dataset:
        """A succeeded job's table artifact (e.g. ``outcomes`` of ``sccs_eras``) registered as a dataset."""
        body: dict[str, Any] = {"job": job_id, "artifact": artifact, **({"name": name} if name else {})}
        return cast(Dataset, self._json("POST", "/v1/datasets/from-artifact", json=body))


def page_items(page: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rows of a list answer (``{"items": [...], "total", "limit", "offset", "next"}``)."""
    items = page.get("items")
    return items if isinstance(items, list) else []
