"""The dashboard: HTML pages under /ui (Jinja2 templates, static files from the package, no CDN) and
Swagger UI's files for /docs.

The pages are a client of the public API: every read and every action is a request to the /v1 routes of this
same application, in process (httpx over ASGI), carrying the signed-in user's API key. So a page shows exactly
what the API answers (owner isolation, validation, quotas, problems) and no rule lives twice.

Session: the API key is kept in an HttpOnly, SameSite=Strict cookie; every form that changes something carries
a CSRF token that must equal the one in a second HttpOnly cookie (double submit; SameSite=Strict already keeps
other sites' requests from carrying the cookies).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import httpx
import pyarrow.parquet as pq
from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from api.problems import ProblemError
from core.settings import get_settings
from core.status import JobStatus
from kernels.registry import registry
from store.artifacts import dataset_path

TEMPLATES = Jinja2Templates(directory=Path(__file__).resolve().parent.parent / "templates")
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
SESSION_COOKIE, CSRF_COOKIE, CSRF_FIELD = "gpuest_session", "gpuest_csrf", "csrf_token"
PREVIEW_ROWS = 10
UPLOAD_PATH = "/ui/datasets"  # streamed on to /v1/datasets, which enforces the upload limits
TERMINAL = {JobStatus.SUCCEEDED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value}

router = APIRouter(include_in_schema=False)


# -- session and the in-process API client ---------------------------------------------------------------


def auth_enabled() -> bool:
    return get_settings().auth_enabled


def api_key(request: Request) -> str | None:
    return request.cookies.get(SESSION_COOKIE) or None


def signed_in(request: Request) -> bool:
    return not auth_enabled() or api_key(request) is not None


@asynccontextmanager
async def api(request: Request, key: str | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """A client of this application's own /v1 routes, as the signed-in user (or with ``key``)."""
    key = key or api_key(request)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    # An exception in a route reaches the page as the API's 500 answer (which the page shows as it shows any
    # refusal), not as an exception that would turn the whole page into a 500.
    transport = httpx.ASGITransport(app=request.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://dashboard", headers=headers, timeout=60
    ) as client:
        yield client


class SignInRequired(Exception):
    """The API answered 401: the session's key is gone or revoked."""


def checked(response: httpx.Response) -> httpx.Response:
    if response.status_code == 401:
        raise SignInRequired
    return response


def csrf_token(request: Request) -> str:
    """The request's CSRF token (the cookie's, or a new one that :func:`render` sets)."""
    token = request.cookies.get(CSRF_COOKIE) or getattr(request.state, "new_csrf_token", None)
    if token is None:
        token = request.state.new_csrf_token = secrets.token_urlsafe(32)
    return token


def check_csrf(request: Request, submitted: str | None) -> None:
    cookie = request.cookies.get(CSRF_COOKIE)
    if not cookie or not submitted or not secrets.compare_digest(cookie, submitted):
        raise ProblemError(
            403,
            "the form's CSRF token does not match this session: reload the page and submit again",
            slug="csrf-token-mismatch",
        )


def secure_cookie(request: Request) -> bool:
    """GPUEST_COOKIE_SECURE: always, never, or (auto) when the request came over HTTPS, as uvicorn sees it."""
    setting = get_settings().cookie_secure
    return setting == "true" or (setting == "auto" and request.url.scheme == "https")


def set_cookie(response: Response, request: Request, name: str, value: str) -> None:
    response.set_cookie(name, value, httponly=True, samesite="strict", secure=secure_cookie(request), path="/")


def clear_cookie(response: Response, request: Request, name: str) -> None:
    response.delete_cookie(name, path="/", httponly=True, samesite="strict", secure=secure_cookie(request))


def render(request: Request, template: str, context: Mapping[str, Any], status_code: int = 200) -> HTMLResponse:
    context = {
        "request": request,
        "auth_enabled": auth_enabled(),
        "signed_in": signed_in(request),
        "csrf_token": csrf_token(request),
        "csrf_field": CSRF_FIELD,
        **context,
    }
    response = TEMPLATES.TemplateResponse(request, template, context, status_code=status_code)
    new_token = getattr(request.state, "new_csrf_token", None)
    if new_token:
        set_cookie(response, request, CSRF_COOKIE, new_token)
    response.headers["Cache-Control"] = "no-store"
    return response


def to_signin() -> RedirectResponse:
    return RedirectResponse("/ui/signin", status_code=303)


def not_found(request: Request, what: str) -> HTMLResponse:
    return render(request, "error.html", {"title": "Not found", "message": f"No {what} here for you."}, 404)


# -- sign in and out ---------------------------------------------------------------------------------------


@router.get("/ui")
async def home() -> RedirectResponse:
    return RedirectResponse("/ui/jobs", status_code=303)


@router.get("/ui/signin")
async def signin_page(request: Request) -> Response:
    if not auth_enabled():
        return RedirectResponse("/ui/jobs", status_code=303)
    return render(request, "signin.html", {"error": None})


@router.post("/ui/signin")
async def signin(
    request: Request,
    key: Annotated[str, Form(alias="api_key", max_length=200)] = "",
    csrf: Annotated[str | None, Form(alias=CSRF_FIELD)] = None,
) -> Response:
    check_csrf(request, csrf)
    async with api(request, key.strip() or "-") as client:
        answer = await client.get("/v1/jobs", params={"limit": 1})
    if answer.status_code != 200:
        return render(request, "signin.html", {"error": "That API key is not valid (unknown or revoked)."}, 401)
    response = RedirectResponse("/ui/jobs", status_code=303)
    set_cookie(response, request, SESSION_COOKIE, key.strip())
    # A new session gets a new CSRF token: one planted or read before sign-in is worth nothing after it.
    set_cookie(response, request, CSRF_COOKIE, secrets.token_urlsafe(32))
    return response


@router.post("/ui/signout")
async def signout(request: Request, csrf: Annotated[str | None, Form(alias=CSRF_FIELD)] = None) -> Response:
    check_csrf(request, csrf)
    response = RedirectResponse("/ui/signin" if auth_enabled() else "/ui/jobs", status_code=303)
    clear_cookie(response, request, SESSION_COOKIE)
    clear_cookie(response, request, CSRF_COOKIE)
    return response


# -- jobs --------------------------------------------------------------------------------------------------


def job_filters(kind: str | None, status: str | None) -> dict[str, str]:
    return {name: value for name, value in (("kind", kind), ("status", status)) if value}


@router.get("/ui/jobs")
async def jobs_page(
    request: Request,
    kind: Annotated[str | None, Query(max_length=64)] = None,
    status: Annotated[str | None, Query(max_length=16)] = None,
) -> Response:
    if not signed_in(request):
        return to_signin()
    try:
        async with api(request) as client:
            page = checked(await client.get("/v1/jobs", params={**job_filters(kind, status), "limit": 100}))
    except SignInRequired:
        return to_signin()
    return render(
        request,
        "jobs.html",
        {
            "jobs": page.json().get("items", []) if page.status_code == 200 else [],
            "kinds": sorted(registry()),
            "statuses": [status.value for status in JobStatus],
            "kind": kind or "",
            "status": status or "",
            "terminal": sorted(TERMINAL),
        },
    )


@router.get("/ui/jobs.json")
async def jobs_json(
    request: Request,
    kind: Annotated[str | None, Query(max_length=64)] = None,
    status: Annotated[str | None, Query(max_length=16)] = None,
) -> Response:
    """The jobs list's live data (polled by the page)."""
    async with api(request) as client:
        answer = await client.get("/v1/jobs", params={**job_filters(kind, status), "limit": 100})
    return Response(answer.content, status_code=answer.status_code, media_type=answer.headers.get("content-type"))


@router.get("/ui/jobs/{job_id}.json")
async def job_json(request: Request, job_id: str) -> Response:
    async with api(request) as client:
        answer = await client.get(f"/v1/jobs/{job_id}")
    return Response(answer.content, status_code=answer.status_code, media_type=answer.headers.get("content-type"))


def result_rows(result: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The result's scalar fields (and short lists of numbers), for the page's table."""
    rows = []
    for name, value in result.items():
        if name in ("timings", "kind", "device"):
            continue
        if isinstance(value, bool | int | float | str) or value is None:
            rows.append((name, f"{value:.6g}" if isinstance(value, float) else str(value)))
        elif isinstance(value, list) and len(value) <= 8 and all(isinstance(v, int | float) for v in value):
            rows.append((name, ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in value)))
        elif isinstance(value, dict) and len(value) <= 8 and all(isinstance(v, int | float) for v in value.values()):
            rows.append((name, ", ".join(f"{k}: {v:.6g}" for k, v in value.items())))
    return rows


@router.get("/ui/jobs/{job_id}")
async def job_page(request: Request, job_id: str) -> Response:
    if not signed_in(request):
        return to_signin()
    try:
        async with api(request) as client:
            answer = checked(await client.get(f"/v1/jobs/{job_id}"))
            if answer.status_code != 200:
                return not_found(request, "such job")
            job = answer.json()
            result, plots, artifacts = None, [], []
            if job["status"] == JobStatus.SUCCEEDED.value:
                result = (await client.get(f"/v1/jobs/{job_id}/result")).json()
                artifacts = (await client.get(f"/v1/jobs/{job_id}/artifacts")).json()
                for entry in (await client.get(f"/v1/jobs/{job_id}/plots")).json():
                    plots.append(await drawn_plot(client, entry, request.query_params))
    except SignInRequired:
        return to_signin()
    return render(
        request,
        "job.html",
        {
            "job": job,
            "params": json.dumps(job["params"], indent=2),
            "result": result,
            "result_rows": result_rows(result or {}),
            "stage_timings": (result or {}).get("timings") or {},
            "plots": plots,
            "artifacts": artifacts,
            "terminal": job["status"] in TERMINAL,
        },
    )


async def drawn_plot(client: httpx.AsyncClient, entry: Mapping[str, Any],
                     query: Mapping[str, str]) -> dict[str, Any] | None:
    """One plot of the job page, drawn with the options the page's query chose for it (``<plot>.<option>``);
    an option the API refuses is shown beside the plot drawn without it, and a plot the API cannot draw has no
    ``svg`` (the page says it is unavailable)."""
    prefix = f"{entry['name']}."
    chosen = {key.removeprefix(prefix): value for key, value in query.items() if key.startswith(prefix) and value}
    svg = await client.get(entry["href"], params=chosen)
    error = None
    if svg.status_code == 422 and chosen and problem_slug(svg) == "invalid-plot-option":
        error = svg.json().get("detail")
        svg = await client.get(entry["href"])
    if svg.status_code != 200:
        return {**entry, "svg": None, "chosen": chosen, "error": error}
    return {**entry, "svg": inline_svg(svg.text), "chosen": chosen, "error": error}


def problem_slug(response: httpx.Response) -> str:
    """The last part of a problem answer's ``type`` ("" for an answer that is not a problem)."""
    try:
        return str(response.json().get("type", "")).rsplit("/", 1)[-1]
    except (ValueError, AttributeError):
        return ""


def inline_svg(document: str) -> str:
    """The <svg> element of a matplotlib SVG document (without its XML prolog and DOCTYPE), to inline."""
    return document[document.find("<svg") :]


@router.get("/ui/jobs/{job_id}/artifacts/{name}")
async def artifact_download(request: Request, job_id: str, name: str) -> Response:
    async with api(request) as client:
        answer = await client.get(f"/v1/jobs/{job_id}/artifacts/{name}")
    if answer.status_code != 200:
        return not_found(request, "such artifact")
    headers = {key: answer.headers[key] for key in ("content-disposition",) if key in answer.headers}
    return Response(answer.content, media_type=answer.headers.get("content-type"), headers=headers)


@router.post("/ui/jobs/{job_id}/cancel")
async def cancel(request: Request, job_id: str, csrf: Annotated[str | None, Form(alias=CSRF_FIELD)] = None) -> Response:
    check_csrf(request, csrf)
    async with api(request) as client:
        answer = await client.post(f"/v1/jobs/{job_id}/cancel")
    if answer.status_code == 404:
        return not_found(request, "such job")
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


# -- submit ------------------------------------------------------------------------------------------------


def resolve(schema: Mapping[str, Any], node: Mapping[str, Any]) -> Mapping[str, Any]:
    """``node`` with a local $ref followed and a nullable anyOf reduced to its one non-null member."""
    if "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    options = [option for option in node.get("anyOf", []) if option.get("type") != "null"]
    if len(options) == 1:
        return {**node, **resolve(schema, options[0]), "nullable": True}
    return node


def form_fields(kind_name: str) -> list[dict[str, Any]]:
    """One input per top-level parameter of the kind, from its JSON Schema, prefilled with its example."""
    kind = registry()[kind_name]
    schema = kind.params_model.model_json_schema()
    required = set(schema.get("required", []))
    example = dict(kind.example.params)
    fields = []
    for name, raw in schema.get("properties", {}).items():
        node = resolve(schema, raw)
        widget = {"integer": "number", "number": "number", "string": "text", "boolean": "checkbox"}.get(
            str(node.get("type")), "json"
        )
        if "enum" in node or "const" in node:
            widget = "select"
        if name in kind.dataset_fields:
            widget = "dataset"
        value = example.get(name, node.get("default"))
        fields.append(
            {
                "name": name,
                "widget": widget,
                "required": name in required,
                "description": node.get("description", ""),
                "choices": list(node.get("enum", [node.get("const")] if "const" in node else [])),
                "step": "1" if node.get("type") == "integer" else "any",
                "value": ""
                if value is None or widget == "dataset"
                else (json.dumps(value) if widget == "json" else value),
            }
        )
    return fields


def params_from_form(form: Mapping[str, Any], fields: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    """The params a submitted form stands for, and the fields whose text is not JSON."""
    params: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for field in fields:
        name, text = field["name"], form.get(field["name"])
        if field["widget"] == "checkbox":
            params[name] = text is not None
            continue
        if text is None or str(text).strip() == "":
            continue  # left empty: the kind's default (or the API's "field required")
        text = str(text).strip()
        if field["widget"] in ("json", "number"):
            try:
                params[name] = json.loads(text)
            except ValueError:
                errors[name] = "not a number" if field["widget"] == "number" else "not valid JSON"
        else:
            params[name] = text
    return params, errors


def field_errors_of(problem: Mapping[str, Any]) -> dict[str, str]:
    """A 422 problem's errors by top-level params field (``params.k_grid.min`` -> ``k_grid``)."""
    errors: dict[str, str] = {}
    for error in problem.get("errors") or []:
        parts = str(error.get("field", "")).split(".")
        name = parts[1] if parts[0] == "params" and len(parts) > 1 else "_form"
        suffix = f" ({'.'.join(parts[2:])})" if len(parts) > 2 else ""
        errors.setdefault(name, f"{error.get('message', 'invalid')}{suffix}")
    if not errors:
        errors["_form"] = str(problem.get("detail", "the service refused the job"))
    return errors


async def submit_context(
    request: Request,
    kind: str,
    fields: list[dict[str, Any]],
    errors: Mapping[str, str],
    values: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    async with api(request) as client:
        datasets = checked(await client.get("/v1/datasets", params={"limit": 200})).json().get("items", [])
    if values is not None:
        fields = [
            {
                **field,
                "value": values.get(field["name"], "") if field["widget"] != "checkbox" else field["name"] in values,
            }
            for field in fields
        ]
    return {
        "kinds": sorted(registry()),
        "kind": kind,
        "fields": fields,
        "errors": errors,
        "datasets": datasets,
        "summary": registry()[kind].summary,
    }


@router.get("/ui/submit")
async def submit_page(request: Request, kind: Annotated[str | None, Query(max_length=64)] = None) -> Response:
    if not signed_in(request):
        return to_signin()
    kind = kind if kind in registry() else sorted(registry())[0]
    try:
        return render(request, "submit.html", await submit_context(request, kind, form_fields(kind), {}))
    except SignInRequired:
        return to_signin()


@router.post("/ui/submit")
async def submit(request: Request) -> Response:
    form = await request.form()
    check_csrf(request, str(form.get(CSRF_FIELD) or ""))
    kind = str(form.get("kind", ""))
    if kind not in registry():
        return not_found(request, "such job kind")
    fields = form_fields(kind)
    params, errors = params_from_form(form, fields)
    values = {key: value for key, value in form.items() if key not in ("kind", CSRF_FIELD)}
    try:
        if not errors:
            async with api(request) as client:
                answer = checked(await client.post("/v1/jobs", json={"kind": kind, "params": params}))
            if answer.status_code == 202:
                return RedirectResponse(f"/ui/jobs/{answer.json()['id']}", status_code=303)
            errors = field_errors_of(answer.json())
        return render(request, "submit.html", await submit_context(request, kind, fields, errors, values), 422)
    except SignInRequired:
        return to_signin()


# -- datasets ----------------------------------------------------------------------------------------------

# The alerts /ui/datasets shows, by the code in its ``error`` query (a link's text is never shown as the alert).
DATASET_ERRORS: dict[str, str] = {
    "dataset-in-use": "That dataset is used by a queued or running job: delete it once the job has finished.",
    "delete-failed": "That dataset could not be deleted; try again.",
}


def preview(dataset_id: str) -> tuple[list[str], list[list[str]]]:
    """The stored table's first rows, as text."""
    path = dataset_path(dataset_id)
    if not path.is_file():
        return [], []
    batch = next(pq.ParquetFile(path).iter_batches(batch_size=PREVIEW_ROWS), None)
    if batch is None:
        return [], []
    columns = batch.schema.names
    rows = batch.to_pylist()
    return columns, [
        [("" if row[c] is None else f"{row[c]:.6g}" if isinstance(row[c], float) else str(row[c])) for c in columns]
        for row in rows
    ]


@router.get("/ui/datasets")
async def datasets_page(request: Request) -> Response:
    if not signed_in(request):
        return to_signin()
    try:
        async with api(request) as client:
            items = checked(await client.get("/v1/datasets", params={"limit": 200})).json().get("items", [])
    except SignInRequired:
        return to_signin()
    for item in items:  # only ids the API just listed for this owner are read
        item["preview_columns"], item["preview_rows"] = preview(item["id"])
    error = DATASET_ERRORS.get(request.query_params.get("error", ""))
    return render(request, "datasets.html", {"datasets": items, "error": error})


@router.post(UPLOAD_PATH)
async def upload(
    request: Request, csrf: Annotated[str | None, Query(alias=CSRF_FIELD, max_length=100)] = None
) -> Response:
    """The upload form's body, streamed on to POST /v1/datasets as it arrives (the token is in the query:
    the body is the file)."""
    check_csrf(request, csrf)
    async with api(request) as client:
        answer = await client.post(
            "/v1/datasets", content=request.stream(), headers={"Content-Type": request.headers.get("content-type", "")}
        )
    if request.headers.get("accept", "").startswith("application/json"):  # the page's script: the API's answer
        return Response(answer.content, status_code=answer.status_code, media_type=answer.headers.get("content-type"))
    if answer.status_code != 201:
        return render(
            request, "datasets.html", {"datasets": [], "error": answer.json().get("detail")}, answer.status_code
        )
    return RedirectResponse("/ui/datasets", status_code=303)


@router.post("/ui/datasets/{dataset_id}/delete")
async def delete_dataset(
    request: Request, dataset_id: str, csrf: Annotated[str | None, Form(alias=CSRF_FIELD)] = None
) -> Response:
    check_csrf(request, csrf)
    async with api(request) as client:
        answer = await client.delete(f"/v1/datasets/{dataset_id}")
    if answer.status_code not in (204, 404):
        code = "dataset-in-use" if answer.status_code == 409 else "delete-failed"
        return RedirectResponse(f"/ui/datasets?error={code}", status_code=303)
    return RedirectResponse("/ui/datasets", status_code=303)


# -- Swagger UI from the package -----------------------------------------------------------------------------


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI 5 (it reads OpenAPI 3.1) from fastapi-offline's files, started by /static/docs.js."""
    return TEMPLATES.TemplateResponse(request, "docs.html", {})


def swagger_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).resolve().parent / "static"
