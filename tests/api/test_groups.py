"""Job groups (sweeps, issue 16) over HTTP: a grid or a list of specs makes its members in one transaction,
each checked like a single job (errors name the member); status, progress and counts follow the members;
cancel reaches them; the results table has one row per member; another owner's group is a 404."""

from __future__ import annotations

import io
import time

import pandas as pd
import pytest
from api_helpers import MONTECARLO, assert_problem, broker_message_count
from conftest import clear_cached_settings
from test_api_jobs import run_through_store

from store import jobs as job_store
from store.db import session_scope
from store.models import Job, JobGroup

BASE = {"kind": "crve_montecarlo", "params": {k: v for k, v in MONTECARLO.items() if k != "n_clusters"}}
GRID = {"params.n_clusters": [10, 20], "params.seed": [1, 2, 3]}


def create(client, headers: dict[str, str], body: dict | None = None) -> dict:
    response = client.post("/v1/job-groups", json=body or {"base": BASE, "grid": GRID}, headers=headers)
    assert response.status_code == 202, response.text
    return response.json()


def members(client, headers, group_id: str) -> list[dict]:
    page = client.get("/v1/jobs", params={"group_id": group_id, "limit": 200}, headers=headers).json()
    return page["items"]


def counts_in_store() -> tuple[int, int]:
    with session_scope() as session:
        return session.query(JobGroup).count(), session.query(Job).count()


@pytest.mark.both_backends
def test_a_grid_makes_one_low_priority_member_per_combination(client, alice, api_env) -> None:
    group = create(client, alice)
    assert group["member_count"] == 6 and group["status"] == "queued" and group["progress"] == 0.0
    assert group["counts"]["queued"] == 6 and group["priority"] == "low"
    assert group["varying"] == ["params.n_clusters", "params.seed"]
    jobs = members(client, alice, group["id"])
    # the first path varies slowest; every member is a complete, validated spec with the defaults recorded
    assert [(job["params"]["n_clusters"], job["params"]["seed"]) for job in jobs] == [
        (10, 1),
        (10, 2),
        (10, 3),
        (20, 1),
        (20, 2),
        (20, 3),
    ]
    assert all(job["priority"] == "low" and job["group_id"] == group["id"] for job in jobs)
    assert all(job["params"]["test"] == "crv1" for job in jobs)
    assert broker_message_count(api_env) == 6
    assert client.get(group["links"]["self"], headers=alice).json()["member_count"] == 6


def test_a_list_of_specs_is_merged_over_the_base(client, alice) -> None:
    body = {
        "base": BASE,
        "specs": [{"params": {"n_clusters": 12}}, {"params": {"n_clusters": 14, "replications": 30}}],
        "priority": "normal",
    }
    group = create(client, alice, body)
    assert group["varying"] == ["params.n_clusters", "params.replications"] and group["priority"] == "normal"
    jobs = members(client, alice, group["id"])
    assert [(job["params"]["n_clusters"], job["params"]["replications"]) for job in jobs] == [(12, 20), (14, 30)]


@pytest.mark.both_backends
@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"base": BASE, "grid": {"n_clusters": [10]}}, "grid.n_clusters", "dotted params path"),
        ({"base": BASE, "grid": {"params.n_clusters": []}}, "grid.params.n_clusters", "at least one value"),
        ({"grid": GRID}, "base", "needs the base spec"),
        ({"base": BASE, "grid": GRID, "specs": [{}]}, "grid", "either grid"),
        (
            {"base": BASE, "grid": {"params.n_clusters": [10, 1]}},
            "members.1.params.n_clusters",
            "member 1 (params.n_clusters=1): Input should be greater than or equal to 2",
        ),
        (
            {"base": BASE, "specs": [{"params": {"n_clusters": 10}}, {"params": {"n_clusters": 10, "nope": 1}}]},
            "specs.1.params.nope",
            "member 1",
        ),
        ({"specs": [{"kind": "no_such_kind", "params": {}}]}, "specs.0.kind", "unknown job kind"),
    ],
)
def test_a_bad_grid_or_member_is_a_422_naming_it_and_nothing_is_stored(client, alice, body, field, words) -> None:
    problem = assert_problem(client.post("/v1/job-groups", json=body, headers=alice), 422)
    assert field in [error["field"] for error in problem["errors"]], problem
    assert words in problem["detail"], problem
    assert counts_in_store() == (0, 0)


def test_a_group_larger_than_the_limit_is_refused(client, alice, monkeypatch) -> None:
    monkeypatch.setenv("GPUEST_MAX_GROUP_JOBS", "5")
    clear_cached_settings()
    problem = assert_problem(client.post("/v1/job-groups", json={"base": BASE, "grid": GRID}, headers=alice), 422)
    assert problem["errors"][0]["field"] == "grid" and "6 members" in problem["detail"]
    assert counts_in_store() == (0, 0)


@pytest.mark.both_backends
def test_members_count_towards_the_active_jobs_quota(client, alice, monkeypatch) -> None:
    monkeypatch.setenv("GPUEST_MAX_ACTIVE_JOBS_PER_OWNER", "5")
    clear_cached_settings()
    response = client.post("/v1/job-groups", json={"base": BASE, "grid": GRID}, headers=alice)
    assert_problem(response, 429)
    assert response.headers["retry-after"] and counts_in_store() == (0, 0)


def test_another_owners_group_is_a_404(client, alice, bob) -> None:
    group = create(client, alice)
    for method, path in (("GET", ""), ("POST", "/cancel"), ("GET", "/results")):
        assert_problem(client.request(method, f"/v1/job-groups/{group['id']}{path}", headers=bob), 404)
    assert client.get("/v1/job-groups", headers=bob).json()["total"] == 0
    assert members(client, bob, group["id"]) == []
    assert client.get("/v1/job-groups", headers=alice).json()["items"][0]["id"] == group["id"]


@pytest.mark.both_backends
def test_status_progress_and_results_follow_the_members(client, alice) -> None:
    group = create(client, alice)
    jobs = members(client, alice, group["id"])
    for job in jobs[:4]:
        n, seed = job["params"]["n_clusters"], job["params"]["seed"]
        run_through_store(
            job["id"],
            result={
                "rejection_rate": n / 100 + seed / 1000,
                "converged": True,
                "timings": {"total": 0.5},
                "conf_int": [0.1, 0.2],
            },
        )
    with session_scope() as session:  # one member running at 50 %
        assert job_store.claim(session, jobs[4]["id"], worker="w", device="cpu")
        job_store.record_progress(session, jobs[4]["id"], worker="w", progress=0.5, stage="replications")
    state = client.get(f"/v1/job-groups/{group['id']}", headers=alice).json()
    assert state["status"] == "running"
    assert state["counts"] == {"queued": 1, "running": 1, "succeeded": 4, "failed": 0, "cancelled": 0}
    assert state["progress"] == pytest.approx(4.5 / 6)

    response = client.get(
        f"/v1/job-groups/{group['id']}/results",
        params={"fields": "rejection_rate,timings.total,conf_int.1"},
        headers=alice,
    )
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    table = pd.read_csv(io.StringIO(response.text))
    assert list(table.columns) == [
        "member",
        "job_id",
        "status",
        "params.n_clusters",
        "params.seed",
        "rejection_rate",
        "timings.total",
        "conf_int.1",
    ]
    assert list(table["job_id"]) == [job["id"] for job in jobs]
    assert list(table["status"]) == ["succeeded"] * 4 + ["running", "queued"]
    assert list(table["rejection_rate"][:4]) == pytest.approx([0.101, 0.102, 0.103, 0.201])
    assert table["rejection_rate"][4:].isna().all() and list(table["conf_int.1"][:4]) == [0.2] * 4

    parquet = client.get(f"/v1/job-groups/{group['id']}/results", params={"format": "parquet"}, headers=alice)
    frame = pd.read_parquet(io.BytesIO(parquet.content))
    # default columns: every top-level scalar result field
    assert list(frame.columns) == [
        "member",
        "job_id",
        "status",
        "params.n_clusters",
        "params.seed",
        "rejection_rate",
        "converged",
    ]
    assert frame["params.n_clusters"].tolist() == [10, 10, 10, 20, 20, 20]
    assert frame["converged"].tolist()[:4] == [True] * 4

    problem = assert_problem(
        client.get(f"/v1/job-groups/{group['id']}/results", params={"fields": "rejection_rat"}, headers=alice), 422
    )
    assert problem["errors"][0]["field"] == "fields" and "rejection_rat" in problem["detail"]
    assert_problem(client.get(f"/v1/job-groups/{group['id']}/results", params={"format": "xlsx"}, headers=alice), 422)


@pytest.mark.both_backends
def test_cancel_reaches_queued_and_running_members_and_keeps_finished_ones(client, alice) -> None:
    group = create(client, alice)
    jobs = members(client, alice, group["id"])
    run_through_store(jobs[0]["id"], result={"rejection_rate": 0.05})
    with session_scope() as session:
        assert job_store.claim(session, jobs[1]["id"], worker="w", device="cpu")
    state = client.post(f"/v1/job-groups/{group['id']}/cancel", headers=alice).json()
    assert state["cancel_requested"] is True
    assert state["counts"] == {"queued": 0, "running": 1, "succeeded": 1, "failed": 0, "cancelled": 4}
    assert client.get(f"/v1/jobs/{jobs[1]['id']}", headers=alice).json()["cancel_requested"] is True
    events = client.get(f"/v1/jobs/{jobs[2]['id']}/events", headers=alice).json()["items"]
    assert events[-1]["type"] == "cancelled" and "group was cancelled" in events[-1]["message"]
    with session_scope() as session:  # the running member stops at its checkpoint
        assert job_store.finish(session, jobs[1]["id"], worker="w", status="cancelled")
    assert client.get(f"/v1/job-groups/{group['id']}", headers=alice).json()["status"] == "cancelled"


@pytest.mark.both_backends
def test_an_idempotency_key_replays_the_group(client, alice) -> None:
    keyed = {**alice, "Idempotency-Key": "sweep-1"}
    first = create(client, keyed)
    replay = client.post("/v1/job-groups", json={"base": BASE, "grid": GRID}, headers=keyed)
    assert replay.status_code == 202 and replay.json()["id"] == first["id"]
    assert replay.headers["idempotent-replayed"] == "true" and counts_in_store() == (1, 6)
    other = client.post("/v1/job-groups", json={"base": BASE, "grid": {"params.n_clusters": [30]}}, headers=keyed)
    assert_problem(other, 422)


@pytest.mark.slow
@pytest.mark.both_backends
def test_a_grid_of_a_thousand_members_is_created_in_one_request(client, alice) -> None:
    started = time.monotonic()
    base = {**BASE, "params": {**BASE["params"], "n_clusters": 10}}
    group = create(client, alice, {"base": base, "grid": {"params.seed": list(range(1000))}})
    assert group["member_count"] == 1000 and counts_in_store() == (1, 1000)
    assert time.monotonic() - started < 60
    invalid = client.post(
        "/v1/job-groups", json={"base": BASE, "grid": {"params.seed": list(range(1000))}}, headers=alice
    )
    problem = assert_problem(invalid, 422)  # every member lacks n_clusters: 20 errors listed, all counted
    assert problem["invalid_members"] == 1000 and len(problem["errors"]) == 20
    assert problem["detail"].startswith(
        "1000 of 1000 members are invalid: members.0.params.n_clusters: member 0 (params.seed=0): Field required"
    )


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ("conf_int.\u00b2", "printable ASCII"),  # str.isdigit() holds for a superscript two; int() refuses it
        ("conf_int.\u0661", "printable ASCII"),  # an Arabic-Indic digit
        ("conf_int.1\x1b[0m", "printable ASCII"),
        ("conf_int..1", "empty part"),
        (".".join(["a"] * 17), "at most 16"),
        (",".join(f"f{i}" for i in range(101)), "at most 100"),
    ],
)
def test_a_malformed_results_field_is_a_422_naming_fields(client, alice, fields, words) -> None:
    group = create(client, alice)
    run_through_store(members(client, alice, group["id"])[0]["id"], result={"conf_int": [0.1, 0.2]})
    response = client.get(f"/v1/job-groups/{group['id']}/results", params={"fields": fields}, headers=alice)
    problem = assert_problem(response, 422)
    assert [error["field"] for error in problem["errors"]] == ["fields"], problem
    assert words in problem["detail"], problem
    assert "\x1b" not in problem["detail"] and "\u00b2" not in problem["detail"]


def test_a_group_whose_members_would_pass_the_byte_bound_is_refused_before_expansion(client, alice, monkeypatch):
    monkeypatch.setenv("GPUEST_MAX_GROUP_PARAMS_BYTES", "10000")
    clear_cached_settings()
    sizes = {**BASE["params"], "n_clusters": 200, "cluster_sizes": [5] * 200}  # about 520 bytes a member
    grid = {"base": {**BASE, "params": sizes}, "grid": {"params.seed": list(range(30))}}
    problem = assert_problem(client.post("/v1/job-groups", json=grid, headers=alice), 422)
    assert [error["field"] for error in problem["errors"]] == ["grid"]
    assert "at most 10,000" in problem["detail"] and problem["errors"][0]["constraint"] == {"le": 10000}
    specs = {"base": {**BASE, "params": sizes}, "specs": [{"params": {"seed": seed}} for seed in range(30)]}
    problem = assert_problem(client.post("/v1/job-groups", json=specs, headers=alice), 422)
    assert [error["field"] for error in problem["errors"]] == ["specs"]
    assert counts_in_store() == (0, 0)
    within = {"base": {**BASE, "params": sizes}, "grid": {"params.seed": list(range(15))}}
    assert create(client, alice, within)["member_count"] == 15


@pytest.mark.parametrize("where", ["base", "grid", "specs"])
def test_a_deeply_nested_group_body_is_a_422_not_a_500(client, alice, where) -> None:
    deep: object = 1
    for _ in range(400):
        deep = [deep]
    body = {
        "base": {"base": {**BASE, "params": {**BASE["params"], "extra": deep}}, "grid": {"params.seed": [1]}},
        "grid": {"base": BASE, "grid": {"params.seed": [1], "params.extra": [deep]}},
        "specs": {"specs": [{**BASE, "params": {**BASE["params"], "extra": deep}}]},
    }[where]
    problem = assert_problem(client.post("/v1/job-groups", json=body, headers=alice), 422)
    assert "more than 32 deep" in problem["detail"] and counts_in_store() == (0, 0)
