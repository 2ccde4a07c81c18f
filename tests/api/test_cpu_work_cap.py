"""The CPU caps: where the API knows jobs run on CPU (GPUEST_DEVICE=cpu, or the embedded stack with no GPU), a
job or sweep member whose work passes its kind's GPUEST_CPU_MAX_WORK entry (else the kind's default cap), or
whose memory estimate passes GPUEST_CPU_MAX_JOB_BYTES, is refused at submission with a 422 naming the field to
shrink, the estimate, the cap, the GPU alternative and how to raise it."""

from __future__ import annotations

import pytest
from api_helpers import assert_problem, montecarlo_spec
from conftest import clear_cached_settings

from api.work_cap import jobs_run_on_cpu
from core.settings import Settings
from kernels import backend
from kernels.registry import get_kind

CAP = 20 * 10 * 5  # MONTECARLO: 10 clusters of 5 observations; 20 replications fit, 21 do not


@pytest.fixture
def capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUEST_DEVICE", "cpu")
    monkeypatch.setenv("GPUEST_CPU_MAX_WORK", f'{{"crve_montecarlo": {CAP}, "ks_solve": 1e7}}')
    clear_cached_settings()


def test_a_job_over_its_kinds_cap_is_refused_naming_the_field_and_the_remedy(client, alice, capped) -> None:
    assert client.post("/v1/jobs", json=montecarlo_spec(replications=20), headers=alice).status_code == 202
    problem = assert_problem(client.post("/v1/jobs", json=montecarlo_spec(replications=21), headers=alice), 422)
    [error] = problem["errors"]
    assert error["field"] == "params.replications" and error["type"] == "cpu_work_cap"
    assert "replications x (observations + clusters x bootstrap_reps) = 1.05e+03" in error["message"]
    assert "CPU cap of 1e+03" in error["message"] and "GPUEST_CPU_MAX_WORK" in error["message"]
    assert client.get("/v1/jobs", headers=alice).json()["total"] == 1


def test_a_kinds_default_cap_refuses_gpu_sized_defaults_and_an_operator_lifts_it(client, alice, capped,
                                                                                   monkeypatch) -> None:
    # no GPUEST_CPU_MAX_WORK entry for dualcontrol_solve: its default cap; the 64^3 default runs most of an
    # hour on a CPU
    problem = assert_problem(client.post("/v1/jobs", json={"kind": "dualcontrol_solve", "params": {}},
                                         headers=alice), 422)
    [error] = problem["errors"]
    assert error["field"] == "params.grid" and error["type"] == "cpu_work_cap"
    assert "= 8.61e+11 exceeds this server's CPU cap of 2e+11" in error["message"]
    assert "GPU worker" in error["message"]
    monkeypatch.setenv("GPUEST_CPU_MAX_WORK", '{"dualcontrol_solve": 0}')
    clear_cached_settings()
    response = client.post("/v1/jobs", json={"kind": "dualcontrol_solve", "params": {}}, headers=alice)
    assert response.status_code == 202, response.text


def test_dimensions_beyond_the_old_measure_are_capped(client, alice, capped) -> None:
    # inside a one-sweep measure, but a million paths of 5,000 periods, or a million Euler steps on a
    # 1,000 x 100 grid, run for hours on a CPU
    axes = {axis: {"size": 16, "min": low, "max": high}
            for axis, low, high in (("x", -9.0, 11.0), ("mu", -4.0, 4.0), ("sigma", 0.02, 2.0))}
    simulation = {"grid": axes, "report_states": [[1.0, 0.5, 0.5]], "simulation": {"paths": 1_000_000,
                                                                                 "horizon": 5000}}
    wide = {"n_agents": 1_000, "k_grid": {"size": 1000}, "K_grid": {"size": 100}, "policy_max_iterations": 10**6}
    for kind, params, field in (("dualcontrol_solve", simulation, "params.simulation"),
                                ("ks_solve", wide, "params.policy_max_iterations")):
        problem = assert_problem(client.post("/v1/jobs", json={"kind": kind, "params": params}, headers=alice), 422)
        assert [(e["field"], e["type"]) for e in problem["errors"]] == [(field, "cpu_work_cap")], kind


def test_a_job_beyond_the_memory_cap_is_refused_naming_the_dimension(client, alice, capped) -> None:
    response = client.post("/v1/jobs", json={"kind": "ks_solve", "params": {"n_agents": 200_000_000}}, headers=alice)
    [error] = assert_problem(response, 422)["errors"]
    assert error["field"] == "params.n_agents" and error["type"] == "cpu_memory_cap"
    assert "GiB of memory" in error["message"] and "8 GiB" in error["message"]
    assert "GPU worker" in error["message"] and "GPUEST_CPU_MAX_JOB_BYTES" in error["message"]
    assert client.get("/v1/jobs", headers=alice).json()["total"] == 0


def test_a_sweep_member_over_the_cap_is_named(client, alice, capped) -> None:
    response = client.post("/v1/job-groups", headers=alice, json={
        "base": montecarlo_spec(), "grid": {"params.replications": [10, 40]}})
    problem = assert_problem(response, 422)
    assert [error["field"] for error in problem["errors"]] == ["members.1.params.replications"]


def test_no_cap_where_jobs_go_to_gpu_workers(client, alice, capped, monkeypatch) -> None:
    monkeypatch.setenv("GPUEST_DEVICE", "gpu")
    clear_cached_settings()
    assert client.post("/v1/jobs", json=montecarlo_spec(replications=10_000), headers=alice).status_code == 202
    for kind, params in (("dualcontrol_solve", {}), ("ks_solve", {"n_agents": 200_000_000})):
        response = client.post("/v1/jobs", json={"kind": kind, "params": params}, headers=alice)
        assert response.status_code == 202, response.text


def test_where_the_api_knows_jobs_run_on_cpu(monkeypatch) -> None:
    montecarlo, eras = get_kind("crve_montecarlo"), get_kind("sccs_eras")
    monkeypatch.setenv("GPUEST_DEVICE", "gpu")
    assert jobs_run_on_cpu(eras, Settings()) and not jobs_run_on_cpu(montecarlo, Settings())  # host-only kind
    monkeypatch.setenv("GPUEST_DEVICE", "cpu")
    assert jobs_run_on_cpu(montecarlo, Settings(broker_url="redis://x"))
    monkeypatch.setenv("GPUEST_DEVICE", "auto")
    assert not jobs_run_on_cpu(montecarlo, Settings(broker_url="redis://x"))  # servers: only the worker knows
    embedded = Settings(broker_url=None)
    assert jobs_run_on_cpu(montecarlo, embedded) == (not backend.gpu_available())
