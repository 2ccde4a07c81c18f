"""The API's edges (issue 11): non-finite numbers and NUL characters in requests, a database outage, 500s,
operator details in /readyz and /metrics, the 405 Allow header. Every answer is a problem+json document,
never a 500 caused by the input; the NUL and outage cases run on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from api_helpers import assert_problem, montecarlo_spec
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from core.settings import get_settings
from kernels.registry import registry

METRICS_TOKEN = "operator-token-0123456789"


def strict_json(response: Any) -> Any:
    """The body parsed as JSON proper: NaN and Infinity (which Python's parser accepts) are refused."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"the body holds {constant}, which is not JSON: {response.text[:300]}")

    return json.loads(response.text, parse_constant=refuse)


def post_raw(client: TestClient, body: str, headers: dict[str, str]) -> Any:
    return client.post("/v1/jobs", content=body.encode(), headers={**headers, "Content-Type": "application/json"})


# -- NaN, Infinity, 1e400 ---------------------------------------------------------------------------------

MONTECARLO_JSON = json.dumps(montecarlo_spec())


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (MONTECARLO_JSON.replace('"replications": 20', '"replications": NaN'), "params.replications"),
        (MONTECARLO_JSON.replace('"replications": 20', '"replications": Infinity'), "params.replications"),
        (MONTECARLO_JSON.replace('"replications": 20', '"replications": -Infinity'), "params.replications"),
        (MONTECARLO_JSON.replace('"replications": 20', '"replications": 1e400'), "params.replications"),
        (MONTECARLO_JSON.replace('"seed": 7', '"seed": 7, "extra": NaN'), "params.extra"),
        (MONTECARLO_JSON.replace('"crve_montecarlo"', "NaN"), "kind"),
        ('{"kind": "crve_montecarlo", "params": NaN}', "params"),
        ('{"kind": "crve_montecarlo", "params": {}, "other": 1e400}', "other"),
        ("NaN", "body"),
        ("[Infinity]", "body"),
    ],
)
def test_non_finite_numbers_anywhere_in_a_job_spec_are_a_422_naming_the_field(client, alice, body, field) -> None:
    response = post_raw(client, body, alice)
    problem = assert_problem(response, 422)
    strict_json(response)
    assert field in {error["field"] for error in problem["errors"]}, problem


def _float_fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path, default) of every float and list-of-float field of a params model, nested sections included."""
    for name, field in model.model_fields.items():
        annotation = field.annotation
        options = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) \
            else (annotation,)
        for option in options:
            if option is float or (typing.get_origin(option) is list and typing.get_args(option) == (float,)):
                yield (*prefix, name), field.get_default(call_default_factory=True)
            elif isinstance(option, type) and issubclass(option, BaseModel):
                yield from _float_fields(option, (*prefix, name))


def _nan_cases() -> list[Any]:
    cases = []
    for kind_name, kind in sorted(registry().items()):
        for path, default in _float_fields(kind.params_model):
            cases.append(pytest.param(kind_name, path, default, id=f"{kind_name}.{'.'.join(path)}"))
    return cases


@pytest.mark.parametrize(("kind_name", "path", "default"), _nan_cases())
def test_every_float_parameter_of_every_kind_refuses_nan_at_submit(client, alice, kind_name, path, default) -> None:
    """ks_solve.initial_alm accepted NaN: a 500 on PostgreSQL, a two-minute failed run on SQLite."""
    params: dict[str, Any] = json.loads(json.dumps(dict(registry()[kind_name].example.params)))
    section = params
    for name in path[:-1]:
        value = section.get(name)
        section[name] = value if isinstance(value, dict) else {}
        section = section[name]
    current = section.get(path[-1], default)
    if isinstance(current, list):
        section[path[-1]] = [float("nan"), *current[1:]] if current else [float("nan")]
        field = "params." + ".".join(path) + ".0"
    else:
        section[path[-1]] = float("nan")
        field = "params." + ".".join(path)
    response = post_raw(client, json.dumps({"kind": kind_name, "params": params}), alice)
    problem = assert_problem(response, 422)
    strict_json(response)
    assert field in {error["field"] for error in problem["errors"]}, problem
    assert client.get("/v1/jobs", headers=alice).json()["total"] == 0  # nothing stored


def test_nan_cases_cover_the_reported_field() -> None:
    assert ("initial_alm",) in {case.values[1] for case in _nan_cases() if case.values[0] == "ks_solve"}


# -- NUL characters (and other text no database can compare) ---------------------------------------------

@pytest.mark.both_backends
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/jobs/%00"),
        ("GET", "/v1/jobs/abc%00def"),
        ("POST", "/v1/jobs/%00/cancel"),
        ("GET", "/v1/jobs/%00/result"),
        ("GET", "/v1/jobs/%00/artifacts"),
        ("GET", "/v1/jobs/%00/artifacts/bootstrap_t"),
        ("GET", "/v1/datasets/%00"),
        ("DELETE", "/v1/datasets/%00"),
    ],
)
def test_a_nul_in_a_path_id_is_a_404(client, alice, method, path) -> None:
    assert_problem(client.request(method, path, headers=alice), 404)


@pytest.mark.both_backends
@pytest.mark.parametrize(
    ("path", "field"),
    [("/v1/jobs?kind=%00", "kind"), ("/v1/jobs?kind=crve%00&status=queued", "kind"),
     ("/v1/jobs?status=%00", "status"), ("/v1/datasets?limit=1%00", "limit")],
)
def test_a_nul_in_a_query_filter_is_a_422_naming_it(client, alice, path, field) -> None:
    problem = assert_problem(client.get(path, headers=alice), 422)
    assert [(error["field"], error["location"]) for error in problem["errors"]] == [(field, "query")]


@pytest.mark.both_backends
@pytest.mark.parametrize("bad_id", ["\u0000", "abc\u0000", "\ud800"])
def test_a_dataset_id_field_no_database_can_hold_is_a_422_naming_it(client, alice, bad_id) -> None:
    params = dict(registry()["sccs_eras"].example.params)
    params["cases_dataset_id"] = bad_id
    # json.dumps writes the escapes (\u0000, \ud800) as a client's encoder does.
    response = post_raw(client, json.dumps({"kind": "sccs_eras", "params": params}), alice)
    problem = assert_problem(response, 422)
    assert "params.cases_dataset_id" in {error["field"] for error in problem["errors"]}


@pytest.mark.both_backends
def test_a_nul_inside_free_text_params_is_stored_as_given_not_a_500(client, alice) -> None:
    """Free text inside params lands in a JSON column, as the escape \\u0000 (which PostgreSQL's json type
    keeps), so it needs no refusal: it is read back as sent."""
    params = {**registry()["crve_bootstrap"].example.params, "formula": "y ~ x1 + x2 + x3 | fe\u0000"}
    response = post_raw(client, json.dumps({"kind": "crve_bootstrap", "params": params}), alice)
    assert response.status_code == 202, response.text
    stored = client.get(response.headers["location"], headers=alice).json()["params"]
    assert stored["formula"] == params["formula"]


# -- database outage ------------------------------------------------------------------------------------

def point_database_at(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("GPUEST_DATABASE_URL", url)
    get_settings.cache_clear()


UNREACHABLE_DATABASE = "postgresql+psycopg://gpuest@127.0.0.1:1/gpuest"  # nothing listens on port 1


def assert_database_unavailable(response: Any) -> None:
    problem = assert_problem(response, 503)
    assert problem["type"].endswith("database-unavailable"), problem
    assert int(response.headers["retry-after"]) > 0
    assert "127.0.0.1" not in response.text and "psycopg" not in response.text.lower()


def every_database_route(client: TestClient, headers: dict[str, str], job_id: str, dataset_id: str) -> list[Any]:
    return [
        client.get("/v1/jobs", headers=headers),
        client.post("/v1/jobs", json=montecarlo_spec(seed=99), headers=headers),
        client.get(f"/v1/jobs/{job_id}", headers=headers),
        client.post(f"/v1/jobs/{job_id}/cancel", headers=headers),
        client.get(f"/v1/jobs/{job_id}/result", headers=headers),
        client.get(f"/v1/jobs/{job_id}/artifacts", headers=headers),
        client.get("/v1/datasets", headers=headers),
        client.get(f"/v1/datasets/{dataset_id}", headers=headers),
        client.delete(f"/v1/datasets/{dataset_id}", headers=headers),
        client.post("/v1/datasets", files={"file": ("d.csv", b"a,b\n1,2\n", "text/csv")}, headers=headers),
        client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}),
    ]


@pytest.mark.both_backends
def test_a_database_outage_answers_503_with_retry_after_on_every_route_then_recovers(
    client, alice, api_env, monkeypatch
) -> None:
    monkeypatch.setenv("GPUEST_METRICS_TOKEN", METRICS_TOKEN)
    get_settings.cache_clear()
    job_id = client.post("/v1/jobs", json=montecarlo_spec(), headers=alice).json()["id"]
    dataset_id = client.post("/v1/datasets", files={"file": ("d.csv", b"a,b\n1,2\n", "text/csv")},
                             headers=alice).json()["id"]
    working_url = get_settings().resolved_database_url()

    point_database_at(monkeypatch, UNREACHABLE_DATABASE)
    unknown = {"Authorization": "Bearer gpe_not-a-key"}
    for response in [*every_database_route(client, alice, job_id, dataset_id),
                     client.get("/v1/jobs", headers=unknown), client.get(f"/v1/jobs/{job_id}", headers=unknown)]:
        assert_database_unavailable(response)
    assert client.get("/healthz").status_code == 200

    point_database_at(monkeypatch, working_url)
    assert_problem(client.get("/v1/jobs", headers=unknown), 401)
    assert client.get(f"/v1/jobs/{job_id}", headers=alice).status_code == 200


@pytest.mark.slow
@pytest.mark.servers
def test_a_stopped_postgres_answers_503_and_401_stays_401_once_it_is_back(api_env, monkeypatch) -> None:
    """A real PostgreSQL of this test's own, stopped and started again (pool connections die with it)."""
    throwaway = pytest.importorskip("tests.reliability.throwaway")
    if throwaway.missing_binaries():
        pytest.skip(throwaway.missing_binaries())
    from api.app import create_app
    from store.db import session_scope
    from store.keys import create_key
    from store.migrate import upgrade_to_head

    server = throwaway.ThrowawayPostgres()
    try:
        point_database_at(monkeypatch, server.create_database("gpuest_outage"))
        upgrade_to_head()
        with session_scope() as session:
            alice = {"Authorization": f"Bearer {create_key(session, 'alice')}"}
        unknown = {"Authorization": "Bearer gpe_not-a-key"}
        with TestClient(create_app(), raise_server_exceptions=False) as client:
            job_id = client.post("/v1/jobs", json=montecarlo_spec(), headers=alice).json()["id"]
            server.stop("fast")
            for response in [client.get(f"/v1/jobs/{job_id}", headers=alice), client.get("/v1/jobs", headers=alice),
                             client.post("/v1/jobs", json=montecarlo_spec(seed=2), headers=alice),
                             client.get("/v1/jobs", headers=unknown), client.get("/v1/datasets", headers=unknown)]:
                assert_database_unavailable(response)
            server.start()
            assert_problem(client.get("/v1/jobs", headers=unknown), 401)
            assert client.get(f"/v1/jobs/{job_id}", headers=alice).json()["status"] == "queued"
    finally:
        from store import db

        db.get_engine().dispose()
        server.close()


# -- 500s -------------------------------------------------------------------------------------------------

def test_a_500_closes_the_connection_says_so_and_names_only_the_request_id(app) -> None:
    def explode() -> None:
        raise RuntimeError("SELECT secret FROM internals at db-host:5432")

    app.add_api_route("/boom", explode)
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/boom", headers={"X-Request-ID": "req-42"})
    problem = assert_problem(response, 500)
    assert response.headers["connection"] == "close"
    assert problem["request_id"] == "req-42" and response.headers["x-request-id"] == "req-42"
    assert "secret" not in response.text and "db-host" not in response.text and "RuntimeError" not in response.text


@pytest.mark.both_backends
def test_a_database_error_that_is_not_an_outage_is_a_plain_500(app) -> None:
    from sqlalchemy.exc import ProgrammingError

    def bad_query() -> None:
        raise ProgrammingError("SELECT nope", {}, Exception("syntax error at db-host"))

    app.add_api_route("/bad-query", bad_query)
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/bad-query")
    assert_problem(response, 500)
    assert response.headers["connection"] == "close" and "SELECT" not in response.text


# -- operator details: /readyz and /metrics ---------------------------------------------------------------

@pytest.mark.both_backends
def test_readyz_names_no_database_host_or_port_without_the_metrics_token(client, monkeypatch) -> None:
    monkeypatch.setenv("GPUEST_METRICS_TOKEN", METRICS_TOKEN)
    point_database_at(monkeypatch, "postgresql+psycopg://gpuest@127.0.0.1:1/gpuest")
    response = client.get("/readyz")
    problem = assert_problem(response, 503)
    assert problem["checks"]["database"] == "unreachable"
    assert int(response.headers["Retry-After"]) > 0  # a probe, like every route, is told when to come back
    assert "127.0.0.1" not in response.text and "port" not in response.text.lower()

    for wrong in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": METRICS_TOKEN}):
        assert "127.0.0.1" not in client.get("/readyz", headers=wrong).text
    detailed = assert_problem(client.get("/readyz", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}), 503)
    assert "127.0.0.1" in detailed["checks"]["database"]  # the operator sees the driver's reason


def _metric_names(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}


def test_metrics_show_job_counts_only_with_the_token_or_expose_details(client, alice, monkeypatch) -> None:
    client.post("/v1/jobs", json=montecarlo_spec(), headers=alice)
    public = client.get("/metrics")
    assert public.status_code == 200
    assert "gpuest_http_requests" in _metric_names(public.text)
    assert {"gpuest_jobs", "gpuest_queue_depth", "gpuest_job_run_seconds"}.isdisjoint(_metric_names(public.text))

    monkeypatch.setenv("GPUEST_METRICS_TOKEN", METRICS_TOKEN)
    get_settings.cache_clear()
    assert "gpuest_jobs" not in _metric_names(client.get("/metrics", headers=alice).text)  # a user's key is not it
    assert "gpuest_jobs" in _metric_names(client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
                                                     ).text)
    monkeypatch.delenv("GPUEST_METRICS_TOKEN")
    monkeypatch.setenv("GPUEST_EXPOSE_DETAILS", "true")
    get_settings.cache_clear()
    assert "gpuest_jobs" in _metric_names(client.get("/metrics").text)


def test_with_auth_off_there_is_one_owner_and_nothing_to_hide(client, monkeypatch) -> None:
    monkeypatch.setenv("GPUEST_AUTH_ENABLED", "false")
    get_settings.cache_clear()
    assert "gpuest_jobs" in _metric_names(client.get("/metrics").text)


# -- 405 ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("PUT", "/v1/jobs", {"GET", "POST"}), ("DELETE", "/v1/jobs", {"GET", "POST"}),
     ("PUT", "/v1/jobs/some-id", {"GET", "DELETE"}), ("PUT", "/v1/datasets", {"GET", "POST"}),
     ("POST", "/v1/datasets/some-id", {"GET", "DELETE"}), ("GET", "/v1/jobs/some-id/cancel", {"POST"})],
)
def test_405_allow_lists_every_method_of_the_path(client, alice, method, path, allowed) -> None:
    response = client.request(method, path, headers=alice)
    assert_problem(response, 405)
    listed = {name.strip() for name in response.headers["allow"].split(",")}
    assert allowed <= listed and method not in listed and listed - allowed <= {"HEAD"}


# -- control characters in headers that reach the app ----------------------------------------------------

@pytest.mark.parametrize("value", ["a\x01b", "key\x1b[31m", "a\x7f"])
def test_a_control_character_in_the_idempotency_key_is_a_422_naming_the_header(client, alice, value) -> None:
    """httptools refuses these before the app (see test_http_protocol.py); h11 passes them on."""
    response = client.post("/v1/jobs", json=montecarlo_spec(), headers={**alice, "Idempotency-Key": value})
    problem = assert_problem(response, 422)
    assert [(error["field"], error["location"]) for error in problem["errors"]] == [("Idempotency-Key", "header")]
    strict_json(response)


def test_a_control_character_in_the_request_id_is_not_echoed(client) -> None:
    response = client.get("/healthz", headers={"X-Request-ID": "abc\x01def"})
    assert response.status_code == 200 and "\x01" not in response.headers["x-request-id"]


# -- a failed job's error: code, message and correlation id, nothing else ---------------------------------

def test_a_failed_jobs_error_shows_its_code_message_and_correlation_id(client, alice) -> None:
    from store import jobs as job_store
    from store.db import session_scope

    job_id = client.post("/v1/jobs", json=montecarlo_spec(), headers=alice).json()["id"]
    error = {"type": "ValueError", "code": "kernel_error", "message": "policy step did not converge",
             "correlation_id": "c0ffee"}
    with session_scope() as session:
        assert job_store.claim(session, job_id, worker="w", device="cpu")
    with session_scope() as session:
        assert job_store.finish(session, job_id, worker="w", status="failed", error=error)
    assert client.get(f"/v1/jobs/{job_id}", headers=alice).json()["error"] == error
    problem = assert_problem(client.get(f"/v1/jobs/{job_id}/result", headers=alice), 409)
    assert problem["error"] == error and "kernel_error: policy step did not converge" in problem["detail"]
