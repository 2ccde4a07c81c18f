"""Amplification through a job group, and formulas that explode, against the API in this process: a small body
standing for a huge group is refused before any member is made, in bounded time and allocations; the members
of an accepted group share the base instead of copying it; the members sharing a formula share its parse;
an exponential formula is refused before formulaic expands it."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from api.schemas import JobGroupRequest
from api.sweeps import planned_members
from store.db import session_scope
from store.models import Job, JobGroup
from tests.reliability.embedded_api import EmbeddedApi, embedded_api

pytestmark = pytest.mark.reliability

MIB = 1024 * 1024


def amplification_body(seeds: int, sizes: int, replications: int = 10) -> dict:
    """The attack: a base with a ``sizes``-element cluster_sizes, and a grid of seeds x replications."""
    params = {
        "n_clusters": sizes,
        "cluster_size": 5,
        "n_regressors": 2,
        "replications": 20,
        "cluster_sizes": [5] * sizes,
    }
    grid = {"params.seed": list(range(seeds)), "params.replications": list(range(20, 20 + replications))}
    return {"base": {"kind": "crve_montecarlo", "params": params}, "grid": grid}


def bootstrap_spec(formula: str) -> dict:
    params = {"synthetic": {"n_obs": 100, "n_clusters": 10}, "formula": formula, "cluster": "g", "param": "v0"}
    return {"kind": "crve_bootstrap", "params": params}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, migrated_sqlite: Callable[[Path], None]) -> Iterator[EmbeddedApi]:
    with embedded_api(tmp_path_factory.mktemp("groups"), migrated_sqlite) as running:
        yield running


def _post(api: EmbeddedApi, path: str, body: dict) -> tuple[int, dict, float, int]:
    """(status, JSON answer, seconds, peak bytes allocated) of one POST."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        response = api.client.post(path, json=body, headers=api.headers)
        seconds = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return response.status_code, response.json(), seconds, peak


def test_a_small_body_standing_for_a_huge_group_is_refused_before_expansion(api: EmbeddedApi) -> None:
    body = amplification_body(seeds=1000, sizes=1000)  # 10,000 members of 2 KB each from a 6 KB body
    status, problem, seconds, peak = _post(api, "/v1/job-groups", body)
    assert status == 422, problem
    assert problem["errors"][0]["field"] == "grid" and "8,388,608" in problem["detail"]
    assert seconds < 2 and peak < 2 * MIB, (seconds, peak)
    with session_scope() as session:
        assert session.query(JobGroup).count() == 0 and session.query(Job).count() == 0


def test_the_members_of_a_grid_share_the_base_instead_of_copying_it() -> None:
    request = JobGroupRequest.model_validate(amplification_body(seeds=100, sizes=1000))  # 1,000 members, 2 MB
    tracemalloc.start()
    try:
        planned, _ = planned_members(request, max_members=10_000, max_bytes=8 * MIB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(planned) == 1000
    assert all(spec["params"]["cluster_sizes"] is planned[0][1]["params"]["cluster_sizes"] for _, spec, _ in planned)
    assert peak < 1 * MIB, peak  # a copy of the base per member would be about 20 MB here


def test_the_members_sharing_a_formula_share_its_parse(api: EmbeddedApi) -> None:
    formula = "y ~ " + "*".join(f"v{i}" for i in range(10))  # 1,024 terms: the largest product allowed
    body = {"base": bootstrap_spec(formula), "grid": {"params.seed": list(range(300))}}
    status, group, seconds, _ = _post(api, "/v1/job-groups", body)
    assert status == 202, group
    assert group["member_count"] == 300 and seconds < 15, seconds  # a parse per member: about 30 s here


@pytest.mark.parametrize("factors", [16, 40, 200])
def test_an_exponential_formula_is_refused_in_bounded_time_and_memory(api: EmbeddedApi, factors: int) -> None:
    formula = "y ~ " + "*".join(f"v{i}" for i in range(factors))
    status, problem, seconds, peak = _post(api, "/v1/jobs", bootstrap_spec(formula))
    assert status == 422 and [error["field"] for error in problem["errors"]] == ["params.formula"], problem
    assert "more than 10 factors" in problem["detail"]
    assert seconds < 2 and peak < 4 * MIB, (seconds, peak)


def test_a_large_family_on_a_long_formula_is_checked_in_bounded_time(api: EmbeddedApi) -> None:
    formula = "y ~ " + "+".join(f"v{i}" for i in range(700))  # 3,393 characters, 701 terms
    spec = bootstrap_spec(formula)
    spec["params"] = {**spec["params"], "param": None, "family": [f"v{i} = 0" for i in range(200)]}
    started = time.perf_counter()
    response = api.client.post("/v1/jobs", json=spec, headers=api.headers)
    assert response.status_code == 202, response.text
    assert time.perf_counter() - started < 5  # a pattern compiled per term and restriction: about 13 s here
