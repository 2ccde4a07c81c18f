"""Service endpoints and cross-cutting behaviour: /healthz, /readyz, /metrics, OpenAPI, 500 problems,
and the refusal to start on an un-migrated database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from api_helpers import assert_problem, montecarlo_spec
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from core.settings import get_settings
from kernels.registry import registry, result_models
from store import jobs as job_store
from store.db import session_scope
from store.migrate import SchemaNotMigratedError, alembic_config
from store.models import Job

ROOT = Path(__file__).resolve().parents[2]


def test_healthz(client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


@pytest.mark.both_backends
def test_readyz_when_everything_is_up(client) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ready", "checks": {"database": "ok", "schema": "ok", "broker": "ok"}}


def test_readyz_is_503_naming_the_broker_when_it_points_nowhere(client, alice, monkeypatch) -> None:
    monkeypatch.setenv("GPUEST_BROKER_URL", "redis://127.0.0.1:1/0")  # nothing listens on port 1
    get_settings.cache_clear()
    problem = assert_problem(client.get("/readyz"), 503)
    assert problem["checks"]["broker"] != "ok"
    assert problem["checks"]["database"] == "ok" and problem["checks"]["schema"] == "ok"
    assert "broker" in problem["detail"]

    # A job submitted meanwhile is still accepted and stored queued: the reaper re-sends it later.
    response = client.post("/v1/jobs", json=montecarlo_spec(), headers=alice)
    assert response.status_code == 202
    assert client.get(response.headers["location"], headers=alice).json()["status"] == "queued"


@pytest.mark.both_backends
def test_readyz_is_503_naming_the_database_when_it_is_unreachable(client, monkeypatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://gpuest@127.0.0.1:1/gpuest")
    get_settings.cache_clear()
    problem = assert_problem(client.get("/readyz"), 503)
    assert problem["checks"]["database"] != "ok" and problem["checks"]["broker"] == "ok"
    assert "database" in problem["detail"]


def test_request_ids_are_echoed(client) -> None:
    assert client.get("/healthz", headers={"X-Request-ID": "abc-123"}).headers["x-request-id"] == "abc-123"
    generated = client.get("/healthz").headers["x-request-id"]
    assert len(generated) == 32 and generated != client.get("/healthz").headers["x-request-id"]


@pytest.mark.both_backends
def test_readyz_is_503_naming_the_schema_when_it_falls_behind(client) -> None:
    from alembic import command

    command.downgrade(alembic_config(), "base")
    problem = assert_problem(client.get("/readyz"), 503)
    assert problem["checks"]["schema"] != "ok" and "gpuest db upgrade" in problem["checks"]["schema"]


def test_the_app_refuses_to_start_on_an_unmigrated_database(api_env, tmp_path, monkeypatch) -> None:
    from api.app import create_app

    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'fresh.sqlite3'}")
    get_settings.cache_clear()
    with pytest.raises(SchemaNotMigratedError, match="gpuest db upgrade"), TestClient(create_app()):
        pass


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.both_backends
def test_metrics_report_jobs_queue_depth_run_time_and_http(client, alice, monkeypatch) -> None:
    # Job counts are every owner's: shown with the metrics token only (tests/api/test_api_edges.py).
    monkeypatch.setenv("GPUEST_METRICS_TOKEN", "operator-token-0123456789")
    get_settings.cache_clear()
    ids = [client.post("/v1/jobs", json=montecarlo_spec(seed=seed), headers=alice).json()["id"] for seed in range(5)]
    client.post(f"/v1/jobs/{ids[0]}/cancel", headers=alice)
    for job_id, status, run_seconds in [(ids[1], "succeeded", 3.0), (ids[2], "failed", 45.5)]:
        with session_scope() as session:
            assert job_store.claim(session, job_id, worker="w", device="cpu")
        with session_scope() as session:
            assert job_store.finish(session, job_id, worker="w", status=status, result={})
        with session_scope() as session:  # pin the run time so the buckets are known
            job = session.get(Job, job_id)
            job.finished_at = job.started_at + timedelta(seconds=run_seconds)

    response = client.get("/metrics", headers={"Authorization": "Bearer operator-token-0123456789"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = _samples(response.text)
    kind = (("kind", "crve_montecarlo"),)

    def jobs(status: str, name: str = "crve_montecarlo") -> float:
        return samples[("gpuest_jobs", (("kind", name), ("status", status)))]

    assert (jobs("queued"), jobs("cancelled"), jobs("succeeded"), jobs("running"), jobs("failed")) == (2, 1, 1, 0, 1)
    for name in registry():  # every registered kind is reported, even with no jobs
        assert jobs("queued", name) >= 0
    assert samples[("gpuest_queue_depth", ())] == 2
    buckets = {edge: samples[("gpuest_job_run_seconds_bucket", (*kind, ("le", edge)))]
               for edge in ("2.5", "5.0", "30.0", "60.0", "+Inf")}
    assert buckets == {"2.5": 0, "5.0": 1, "30.0": 1, "60.0": 2, "+Inf": 2}
    assert samples[("gpuest_job_run_seconds_count", kind)] == 2
    assert samples[("gpuest_job_run_seconds_sum", kind)] == pytest.approx(48.5, abs=1e-3)
    created = (("method", "POST"), ("route", "/v1/jobs"), ("status", "202"))
    assert samples[("gpuest_http_requests_total", created)] == 5
    assert samples[("gpuest_http_request_duration_seconds_count", (("method", "POST"), ("route", "/v1/jobs")))] == 5


def test_openapi_documents_every_kinds_params(client) -> None:
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["discriminator"]["propertyName"] == "kind"
    assert set(body["discriminator"]["mapping"]) == set(registry())
    components = schema["components"]["schemas"]
    for name, kind in registry().items():
        request_model = components[body["discriminator"]["mapping"][name].rsplit("/", 1)[1]]
        assert request_model["properties"]["kind"]["const"] == name
        params_ref = request_model["properties"]["params"]["$ref"].rsplit("/", 1)[1]
        assert set(components[params_ref]["properties"]) == set(kind.params_model.model_fields)
    problem = schema["paths"]["/v1/jobs"]["post"]["responses"]["4XX"]["content"]
    assert "application/problem+json" in problem
    assert client.get("/docs").status_code == 200


def test_openapi_types_the_result_as_any_kinds_result_model(client) -> None:
    schema = client.get("/openapi.json").json()
    components = schema["components"]["schemas"]
    result = schema["paths"]["/v1/jobs/{job_id}/result"]["get"]["responses"]["200"]["content"]["application/json"]
    options = result["schema"].get("anyOf", [result["schema"]])
    documented = {components[option["$ref"].rsplit("/", 1)[1]]["title"]: option for option in options}
    expected = {model.model_json_schema()["title"]: model for model in result_models()}
    assert set(documented) == set(expected) and len(options) == len(expected)
    for title, model in expected.items():
        component = components[documented[title]["$ref"].rsplit("/", 1)[1]]
        assert set(component["properties"]) == set(model.model_fields)
        assert {"device", "timings"} <= set(component["properties"])  # stamped on every result


def test_every_kinds_example_is_valid_and_is_the_documented_one(client) -> None:
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    components = schema["components"]["schemas"]
    for name, kind in registry().items():
        # As a client sends it: JSON, through the strict params model.
        kind.params_model.model_validate_json(json.dumps(dict(kind.example.params)))
        request_model = components[body["discriminator"]["mapping"][name].rsplit("/", 1)[1]]
        assert request_model["examples"] == [{"kind": name, "params": json.loads(json.dumps(kind.example.params))}]


@pytest.mark.slow
def test_importing_the_app_touches_neither_the_worker_nor_the_broker(api_env, tmp_path) -> None:
    # A fresh interpreter: this one has imported everything already.
    probe = (
        "import sys, api.app, core.queue; "
        "print(int(core.queue._celery_app is not None), sorted(name for name in ('celery', 'kombu', 'worker') "
        "if name in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**os.environ, **api_env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "0 []", done.stdout


def test_unexpected_errors_are_500_problems_without_a_traceback(app) -> None:
    def explode() -> None:
        raise RuntimeError("secret internal detail")

    app.add_api_route("/boom", explode)
    with TestClient(app, raise_server_exceptions=False) as client:
        problem = assert_problem(client.get("/boom"), 500)
    assert "secret internal detail" not in str(problem) and "RuntimeError" not in str(problem)


def test_unknown_routes_and_methods_are_problems(client, alice) -> None:
    assert_problem(client.get("/v1/nothing-here", headers=alice), 404)
    assert_problem(client.put("/v1/jobs", headers=alice), 405)
