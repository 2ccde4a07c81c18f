"""Jobs over HTTP: create (202 + Location, Idempotency-Key), validation problems naming the field,
owner isolation, cancel, result, artifacts, pagination and filters."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
from api_helpers import assert_problem, broker_message_count, montecarlo_spec
from fastapi.testclient import TestClient

from kernels.registry import registry
from store import jobs as job_store
from store.artifacts import save_artifact
from store.db import session_scope
from store.models import Job

JOB_FIELDS = {
    "id", "kind", "status", "params", "progress", "eta_seconds", "stage", "device", "attempts", "error", "timings",
    "created_at", "started_at", "finished_at", "artifacts", "links",
}


def submit(client: TestClient, headers: dict[str, str], **overrides: object) -> dict:
    response = client.post("/v1/jobs", json=montecarlo_spec(**overrides), headers=headers)
    assert response.status_code == 202, response.text
    return response.json()


def run_through_store(job_id: str, *, result: dict, artifacts: dict | None = None) -> None:
    """Claim and finish a job with the store calls the worker makes (no worker runs in these tests)."""
    with session_scope() as session:
        assert job_store.claim(session, job_id, worker="test-worker", device="cpu")
    with session_scope() as session:
        assert job_store.finish(session, job_id, worker="test-worker", status="succeeded", result=result,
                                timings={"run": 0.01}, artifacts=artifacts)


# -- create ---------------------------------------------------------------------------------------------

@pytest.mark.both_backends
def test_create_answers_202_with_location_and_rings_the_broker(client, alice, api_env) -> None:
    response = client.post("/v1/jobs", json=montecarlo_spec(), headers=alice)
    assert response.status_code == 202
    job = response.json()
    assert set(job) >= JOB_FIELDS
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["status"] == "queued" and job["progress"] == 0.0 and job["error"] is None
    assert job["kind"] == "crve_montecarlo"
    assert job["params"]["n_clusters"] == 10 and job["params"]["seed"] == 7
    assert job["params"]["test"] == "crv1"  # defaults are recorded with the job
    assert job["created_at"].endswith(("Z", "+00:00"))
    assert broker_message_count(api_env) == 1
    with session_scope() as session:
        row = session.get(Job, job["id"])
        # What the reaper needs to re-send a lost message: the queue it went to and when.
        assert row.queue == api_env["GPUEST_QUEUE"] and row.enqueued_at is not None

    fetched = client.get(response.headers["location"], headers=alice)
    assert fetched.status_code == 200
    assert fetched.json()["id"] == job["id"] and fetched.json()["created_at"] == job["created_at"]


@pytest.mark.both_backends
def test_idempotency_key_returns_the_same_job(client, alice, bob) -> None:
    first = client.post("/v1/jobs", json=montecarlo_spec(), headers={**alice, "Idempotency-Key": "k-1"})
    again = client.post("/v1/jobs", json=montecarlo_spec(), headers={**alice, "Idempotency-Key": "k-1"})
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["location"] == first.headers["location"]
    assert again.headers.get("idempotent-replayed") == "true"
    assert client.get("/v1/jobs", headers=alice).json()["total"] == 1

    other_spec = client.post("/v1/jobs", json=montecarlo_spec(seed=8), headers={**alice, "Idempotency-Key": "k-1"})
    problem = assert_problem(other_spec, 422)
    assert problem["errors"][0]["field"] == "Idempotency-Key"

    # Keys are per owner: bob's "k-1" is a different job.
    bobs = client.post("/v1/jobs", json=montecarlo_spec(), headers={**bob, "Idempotency-Key": "k-1"})
    assert bobs.status_code == 202 and bobs.json()["id"] != first.json()["id"]


BAD_SPECS = [
    pytest.param(montecarlo_spec(n_clusters="10"), "params.n_clusters", "int_type", None, id="wrong-type"),
    pytest.param(montecarlo_spec(seed=1.5), "params.seed", "int_type", None, id="float-for-int"),
    pytest.param({"kind": "crve_montecarlo", "params": {"n_clusters": 10, "cluster_size": 5, "n_regressors": 2}},
                 "params.replications", "missing", None, id="missing-field"),
    pytest.param({**montecarlo_spec(), "kind": "no_such_kind"}, "kind", "unknown_kind", None, id="unknown-kind"),
    pytest.param({"params": montecarlo_spec()["params"]}, "kind", "missing", None, id="missing-kind"),
    pytest.param({"kind": "crve_montecarlo"}, "params", "missing", None, id="missing-params"),
    pytest.param(montecarlo_spec(cluster_size=-3), "params.cluster_size", "greater_than_equal", {"ge": 1},
                 id="negative-size"),
    pytest.param(montecarlo_spec(replications=10**12), "params.replications", "less_than_equal",
                 {"le": 10_000_000}, id="absurd-size"),
    pytest.param(montecarlo_spec(bogus=1), "params.bogus", "extra_forbidden", None, id="extra-param"),
    pytest.param({**montecarlo_spec(), "urgency": 9}, "urgency", "extra_forbidden", None, id="extra-top-level"),
    pytest.param({**montecarlo_spec(), "priority": "urgent"}, "priority", "enum", None, id="bad-priority"),
    pytest.param(montecarlo_spec(critical_values="z"), "params.critical_values", "literal_error", None,
                 id="bad-choice"),
]


@pytest.mark.parametrize(("spec", "field", "error_type", "constraint"), BAD_SPECS)
def test_bad_spec_is_a_422_problem_naming_the_field(client, alice, api_env, spec, field, error_type,
                                                    constraint) -> None:
    problem = assert_problem(client.post("/v1/jobs", json=spec, headers=alice), 422)
    by_field = {error["field"]: error for error in problem["errors"]}
    assert field in by_field, problem
    assert by_field[field]["type"] == error_type
    if constraint is not None:
        assert by_field[field]["constraint"] == constraint
    assert field in problem["detail"]
    assert client.get("/v1/jobs", headers=alice).json()["total"] == 0
    assert broker_message_count(api_env) == 0


def test_unknown_kind_lists_the_known_kinds(client, alice) -> None:
    problem = assert_problem(client.post("/v1/jobs", json={"kind": "nope", "params": {}}, headers=alice), 422)
    message = problem["errors"][0]["message"]
    assert "'nope'" in message
    for name in registry():
        assert name in message


@pytest.mark.parametrize(
    "body",
    [pytest.param(b"{not json", id="malformed-json"), pytest.param(b"[1, 2]", id="a-list"),
     pytest.param(b"", id="empty")],
)
def test_unparseable_bodies_are_422_problems(client, alice, body) -> None:
    response = client.post("/v1/jobs", content=body, headers={**alice, "Content-Type": "application/json"})
    problem = assert_problem(response, 422)
    assert problem["errors"]


def test_cross_field_rule_is_reported_on_params(client, alice) -> None:
    if "crve_bootstrap" not in registry():
        pytest.skip("crve_bootstrap not registered")
    spec = {"kind": "crve_bootstrap", "params": {"formula": "y ~ x1", "cluster": "g", "param": "x1"}}
    problem = assert_problem(client.post("/v1/jobs", json=spec, headers=alice), 422)
    assert problem["errors"][0]["field"] == "params"
    assert "dataset_id" in problem["errors"][0]["message"]


# -- datasets named by a job ---------------------------------------------------------------------------------

def bootstrap_spec(dataset_id: str) -> dict:
    return {"kind": "crve_bootstrap",
            "params": {"dataset_id": dataset_id, "formula": "y ~ x1", "cluster": "g", "param": "x1", "reps": 99}}


def upload_csv(client: TestClient, headers: dict[str, str]) -> str:
    csv = b"y,x1,g\n" + b"".join(f"{i * 0.5},{i},{i % 4}\n".encode() for i in range(40))
    response = client.post("/v1/datasets", files={"file": ("data.csv", csv, "text/csv")}, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()["id"]


@pytest.mark.both_backends
def test_dataset_ids_must_exist_and_belong_to_the_caller(client, alice, bob) -> None:
    if "crve_bootstrap" not in registry():
        pytest.skip("crve_bootstrap not registered")
    alices_dataset = upload_csv(client, alice)
    bobs_dataset = upload_csv(client, bob)

    accepted = client.post("/v1/jobs", json=bootstrap_spec(alices_dataset), headers=alice)
    assert accepted.status_code == 202, accepted.text

    missing = "00000000-0000-0000-0000-000000000000"
    foreign = assert_problem(client.post("/v1/jobs", json=bootstrap_spec(bobs_dataset), headers=alice), 422)
    absent = assert_problem(client.post("/v1/jobs", json=bootstrap_spec(missing), headers=alice), 422)
    assert foreign["errors"][0]["field"] == absent["errors"][0]["field"] == "params.dataset_id"
    # Another owner's id reads exactly like one that does not exist.
    assert foreign["errors"][0]["type"] == absent["errors"][0]["type"]
    assert foreign["detail"].replace(bobs_dataset, "ID") == absent["detail"].replace(missing, "ID")


# -- auth and isolation --------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "headers",
    [pytest.param({}, id="no-header"), pytest.param({"Authorization": "Bearer gpe_wrong"}, id="bad-key"),
     pytest.param({"Authorization": "Basic dXNlcjpwdw=="}, id="not-bearer")],
)
def test_requests_without_a_valid_key_get_401(client, headers) -> None:
    for method, path in [("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/datasets")]:
        response = client.request(method, path, headers=headers, json=montecarlo_spec())
        assert_problem(response, 401)
        assert response.headers["www-authenticate"].startswith("Bearer")


def test_verified_keys_are_cached_briefly_and_unknown_keys_never(client, make_key) -> None:
    from api.deps import OwnerCache

    cache = OwnerCache(ttl_seconds=0.2)
    cache.put("gpe_secret", "carol")
    assert cache.get("gpe_secret") == "carol" and cache.get("gpe_other") is None
    time.sleep(0.25)
    assert cache.get("gpe_secret") is None  # a revoked key stops working once its entry expires

    assert client.get("/v1/jobs", headers={"Authorization": "Bearer gpe_not_yet"}).status_code == 401
    new_key = make_key("dave")
    assert client.get("/v1/jobs", headers={"Authorization": f"Bearer {new_key}"}).status_code == 200


def test_another_owners_job_answers_404_like_a_missing_one(client, alice, bob) -> None:
    job = submit(client, alice)
    missing = "00000000-0000-0000-0000-000000000000"
    for suffix, method in [("", "GET"), ("/result", "GET"), ("/artifacts", "GET"), ("/artifacts/x", "GET"),
                           ("/cancel", "POST")]:
        foreign = assert_problem(client.request(method, f"/v1/jobs/{job['id']}{suffix}", headers=bob), 404)
        absent = assert_problem(client.request(method, f"/v1/jobs/{missing}{suffix}", headers=bob), 404)
        assert foreign["type"] == absent["type"] and foreign["title"] == absent["title"]
    assert client.get("/v1/jobs", headers=bob).json()["total"] == 0
    assert client.get(f"/v1/jobs/{job['id']}", headers=alice).json()["status"] == "queued"  # bob cancelled nothing


def test_auth_disabled_serves_everyone_as_the_local_owner(api_env, monkeypatch) -> None:
    from structlog.testing import capture_logs

    from api.app import create_app
    from core.settings import get_settings

    monkeypatch.setenv("GPUEST_AUTH_ENABLED", "false")
    get_settings.cache_clear()
    with capture_logs() as logs, TestClient(create_app()) as client:
        job = submit(client, {})
    assert any(entry["log_level"] == "warning" and "AUTH IS DISABLED" in entry["event"] for entry in logs)
    with session_scope() as session:
        assert session.get(Job, job["id"]).owner == get_settings().local_owner


# -- cancel, result, artifacts ---------------------------------------------------------------------------------

@pytest.mark.both_backends
def test_cancel_of_a_queued_job_means_it_never_runs(client, alice) -> None:
    job = submit(client, alice)
    response = client.post(f"/v1/jobs/{job['id']}/cancel", headers=alice)
    assert response.status_code == 200
    cancelled = response.json()
    assert cancelled["status"] == "cancelled" and cancelled["finished_at"] is not None
    # The worker's claim (what a delivered message does) refuses it.
    with session_scope() as session:
        assert not job_store.claim(session, job["id"], worker="test-worker", device="cpu")
    assert client.get(f"/v1/jobs/{job['id']}", headers=alice).json()["status"] == "cancelled"
    again = client.post(f"/v1/jobs/{job['id']}/cancel", headers=alice)
    assert again.status_code == 200 and again.json()["status"] == "cancelled"


@pytest.mark.both_backends
def test_cancel_of_a_running_job_flags_it_for_the_worker(client, alice) -> None:
    job = submit(client, alice)
    with session_scope() as session:
        assert job_store.claim(session, job["id"], worker="test-worker", device="cpu")
    response = client.post(f"/v1/jobs/{job['id']}/cancel", headers=alice)
    assert response.status_code == 202
    assert response.json()["status"] == "running" and response.json()["cancel_requested"] is True
    # The worker's next progress checkpoint sees the request.
    with session_scope() as session:
        assert job_store.record_progress(session, job["id"], worker="test-worker", progress=0.5, stage="x")


@pytest.mark.both_backends
def test_result_is_409_until_succeeded_then_the_stored_result(client, alice) -> None:
    job = submit(client, alice)
    problem = assert_problem(client.get(f"/v1/jobs/{job['id']}/result", headers=alice), 409)
    assert "queued" in problem["detail"]

    run_through_store(job["id"], result={"rejection_rate": {"0.05": 0.06}})
    response = client.get(f"/v1/jobs/{job['id']}/result", headers=alice)
    assert response.status_code == 200
    assert response.json() == {"rejection_rate": {"0.05": 0.06}}
    finished = client.get(f"/v1/jobs/{job['id']}", headers=alice).json()
    assert finished["status"] == "succeeded" and finished["progress"] == 1.0 and finished["device"] == "cpu"
    assert finished["started_at"] and finished["finished_at"] and finished["attempts"] == 1
    assert_problem(client.post(f"/v1/jobs/{job['id']}/cancel", headers=alice), 409)


def test_artifacts_list_and_download_without_path_traversal(client, alice) -> None:
    job = submit(client, alice)
    draws = np.arange(12.0).reshape(3, 4)
    reference = save_artifact(job["id"], "draws", draws)
    run_through_store(job["id"], result={}, artifacts={"draws": reference})

    assert client.get(f"/v1/jobs/{job['id']}", headers=alice).json()["artifacts"] == ["draws"]
    listing = client.get(f"/v1/jobs/{job['id']}/artifacts", headers=alice).json()
    assert listing == [{"name": "draws", "file": "draws.npy", "media_type": "application/octet-stream",
                        "bytes": reference["bytes"], "href": f"/v1/jobs/{job['id']}/artifacts/draws"}]
    download = client.get(listing[0]["href"], headers=alice)
    assert download.status_code == 200
    np.testing.assert_array_equal(np.load(io.BytesIO(download.content)), draws)

    # A reference pointing outside the job's folder (as if the row were tampered with) is never served.
    with session_scope() as session:
        session.get(Job, job["id"]).artifacts = {"draws": reference, "evil": {"file": "../../gpuest.sqlite3"}}
    # ("/artifacts/.." itself never reaches the route: clients and servers normalise dot segments.)
    for name in ["evil", "..%2F..%2Fgpuest.sqlite3", "..%5Cgpuest.sqlite3", ".draws", "draws.npy", "a%00b", "nope"]:
        assert_problem(client.get(f"/v1/jobs/{job['id']}/artifacts/{name}", headers=alice), 404)


# -- list, paging, filters -------------------------------------------------------------------------------------

@pytest.mark.both_backends
def test_list_pages_newest_first_with_next_links_and_filters(client, alice, bob) -> None:
    ids = [submit(client, alice, seed=seed)["id"] for seed in range(5)]
    submit(client, bob)
    client.post(f"/v1/jobs/{ids[0]}/cancel", headers=alice)

    seen: list[str] = []
    url: str | None = "/v1/jobs?limit=2"
    while url is not None:
        page = client.get(url, headers=alice).json()
        assert page["total"] == 5 and page["limit"] == 2 and len(page["items"]) <= 2
        seen += [item["id"] for item in page["items"]]
        url = page["next"]
    assert seen == ids[::-1]

    first = client.get("/v1/jobs?limit=2", headers=alice).json()
    assert first["next"] == "/v1/jobs?limit=2&offset=2"
    cancelled = client.get("/v1/jobs", params={"status": "cancelled"}, headers=alice).json()
    assert [item["id"] for item in cancelled["items"]] == [ids[0]] and cancelled["next"] is None
    queued = client.get("/v1/jobs", params={"status": "queued", "kind": "crve_montecarlo", "limit": 3},
                        headers=alice).json()
    assert queued["total"] == 4 and queued["next"].endswith("offset=3") and "status=queued" in queued["next"]
    assert client.get("/v1/jobs", params={"kind": "crve_bootstrap"}, headers=alice).json()["total"] == 0


@pytest.mark.parametrize(
    ("query", "field"),
    [({"status": "sleeping"}, "status"), ({"limit": 0}, "limit"), ({"limit": 10_000}, "limit"),
     ({"offset": -1}, "offset"), ({"limit": "ten"}, "limit")],
)
def test_bad_list_queries_are_422_problems(client, alice, query, field) -> None:
    problem = assert_problem(client.get("/v1/jobs", params=query, headers=alice), 422)
    assert problem["errors"][0]["field"] == field and problem["errors"][0]["location"] == "query"


def test_oversized_json_bodies_are_413_problems_declared_or_streamed(client, alice) -> None:
    from api.body_limit import MAX_JSON_BODY_BYTES

    padding = b"x" * (MAX_JSON_BODY_BYTES + 1)
    declared = client.post("/v1/jobs", content=b'{"kind": "' + padding + b'"}',
                           headers={**alice, "Content-Type": "application/json"})
    assert assert_problem(declared, 413)["max_body_bytes"] == MAX_JSON_BODY_BYTES

    def streamed():
        yield b'{"kind": "'
        for start in range(0, len(padding), 65536):
            yield padding[start:start + 65536]
        yield b'"}'

    chunked = client.post("/v1/jobs", content=streamed(), headers={**alice, "Content-Type": "application/json"})
    assert "content-length" not in {key.lower() for key in chunked.request.headers}
    assert_problem(chunked, 413)
