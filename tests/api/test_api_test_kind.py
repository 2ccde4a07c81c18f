"""A kind registered in one line (``add_kind_modules``, as ``GPUEST_EXTRA_KIND_MODULES`` does at an API's start)
is served by the API with nothing else changed: submitted through ``POST /v1/jobs`` with its params validated
by its own model, refused over its CPU cap by its own work measure, and its plots listed and drawn."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from api_helpers import assert_problem
from conftest import clear_cached_settings
from fastapi import FastAPI

import api.app
import api.routes.jobs
from core.status import JobStatus
from kernels import registry
from store import jobs as job_store
from store.db import session_scope
from tests.kinds import echo

ECHO_MODULE = "tests.kinds.echo"


@pytest.fixture
def echo_registered() -> Iterator[None]:
    """The echo kind registered, and the API's modules imported again from the registry (as a fresh API
    process imports them with GPUEST_EXTRA_KIND_MODULES set: the create-job body is the union of the kinds'
    params, built at import); both undone after the test."""
    registry.add_kind_modules(ECHO_MODULE)
    _import_the_api_again()
    yield
    registry.remove_kind_modules(ECHO_MODULE)
    _import_the_api_again()


def _import_the_api_again() -> None:
    importlib.reload(api.routes.jobs)
    importlib.reload(api.app)  # its ROUTERS hold the jobs router just made


@pytest.fixture
def app(echo_registered: None, api_env: dict[str, str]) -> FastAPI:
    from api.app import create_app

    return create_app()


def test_the_registered_kind_is_submitted_and_its_params_validated_by_its_model(client, alice) -> None:
    created = client.post("/v1/jobs", json={"kind": echo.KIND, "params": {"size": 2_500}}, headers=alice)
    assert created.status_code == 202, created.text
    assert created.json()["kind"] == echo.KIND and created.json()["status"] == "queued"
    problem = assert_problem(client.post("/v1/jobs", json={"kind": echo.KIND, "params": {"size": 0}},
                                         headers=alice), 422)
    assert [error["field"] for error in problem["errors"]] == ["params.size"]
    assert echo.KIND in client.get("/openapi.json").text


def test_the_registered_kind_is_capped_by_its_work_measure(client, alice, monkeypatch) -> None:
    monkeypatch.setenv("GPUEST_DEVICE", "cpu")
    monkeypatch.setenv("GPUEST_CPU_MAX_WORK", f'{{"{echo.KIND}": 1000}}')
    clear_cached_settings()
    within = client.post("/v1/jobs", json={"kind": echo.KIND, "params": {"size": 1_000}}, headers=alice)
    assert within.status_code == 202, within.text
    problem = assert_problem(client.post("/v1/jobs", json={"kind": echo.KIND, "params": {"size": 1_001}},
                                         headers=alice), 422)
    [error] = problem["errors"]
    assert error["field"] == "params.size" and error["type"] == "cpu_work_cap"
    assert "echo work size = 1e+03 exceeds this server's CPU cap of 1e+03" in error["message"]


def test_the_registered_kind_offers_its_plots(client, alice) -> None:
    result = {"device": "cpu", "timings": {}, "size": 3, "blocks": 1, "sum_of_squares": 5}
    with session_scope() as session:
        job, _ = job_store.create_job(session, owner="alice", kind=echo.KIND, params={"size": 3}, dataset_ids={})
        job_id = job.id
    with session_scope() as session:
        assert job_store.claim(session, job_id, worker="test-worker", device="cpu")
    with session_scope() as session:
        assert job_store.finish(session, job_id, worker="test-worker", status=JobStatus.SUCCEEDED, result=result,
                                timings={"run": 0.01})
    listed = client.get(f"/v1/jobs/{job_id}/plots", headers=alice)
    assert listed.status_code == 200, listed.text
    assert [entry["name"] for entry in listed.json()] == ["sum"]
    svg = client.get(f"/v1/jobs/{job_id}/plots/sum", headers=alice)
    assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"
    assert b"closed form" in svg.content


def test_an_api_process_serves_the_kinds_of_gpuest_extra_kind_modules(tmp_path) -> None:
    """The settings path a deployed API takes: the kinds of GPUEST_EXTRA_KIND_MODULES are in its request model."""
    script = ("from api.routes.jobs import JobRequest; from kernels.registry import registry; "
              "print(sorted(registry())); print(JobRequest)")
    env = {"GPUEST_DATA_DIR": str(tmp_path), "GPUEST_EXTRA_KIND_MODULES": f'["{ECHO_MODULE}"]'}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**_inherited_env(), **env}, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    kinds, request_model = done.stdout.splitlines()[:2]
    assert f"'{echo.KIND}'" in kinds and "crve_bootstrap" in kinds
    assert "EchoJobRequest" in request_model


def _inherited_env() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if not name.startswith("GPUEST_")}
