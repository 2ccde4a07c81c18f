"""Each kind's work measure (``JobKind.work``, in its family's ``work.py``), checked against the product its
formula states, computed here by hand from the validated params (defaults included): every dimension that
costs time (iterative loops at their caps, simulations' paths x horizon) and the memory estimate; the caps'
verdicts on either side of their bounds, with the kinds' default caps."""

from __future__ import annotations

import importlib

import pytest

from core.settings import Settings
from kernels.registry import KIND_MODULES, get_kind, registry
from kernels.sccs.work import AUTO_CV_GRID_POINTS
from kernels.work import cap_problem, job_work


def params(kind: str, **values: object) -> object:
    return get_kind(kind).params_model.model_validate(values)


def test_every_registered_kind_is_measured() -> None:
    # A kind without a measure would never be capped: a new kind declares its measure (JobKind.work).
    product = [kind for module in KIND_MODULES for kind in importlib.import_module(module).KINDS]
    assert len(product) >= 7 and {kind.name for kind in product} <= set(registry())
    assert [kind.name for kind in product if kind.work is None] == []


def test_a_kind_not_registered_has_no_work() -> None:
    assert job_work("no_such_kind", object(), {}) is None


def test_montecarlo_counts_observations_and_bootstrap_draws_per_replication() -> None:
    crv1 = params("crve_montecarlo", n_clusters=20, cluster_size=30, n_regressors=2, replications=1000)
    assert job_work("crve_montecarlo", crv1, {}).units == 1000 * (20 * 30)
    wild = params("crve_montecarlo", n_clusters=20, cluster_size=30, n_regressors=2, replications=1000,
                  test="wild_bootstrap", bootstrap_reps=99)
    assert job_work("crve_montecarlo", wild, {}).units == 1000 * (20 * 30 + 20 * 99)
    unbalanced = params("crve_montecarlo", n_clusters=3, cluster_size=1, n_regressors=2, replications=7,
                        cluster_sizes=[5, 10, 20])
    assert job_work("crve_montecarlo", unbalanced, {}).units == 7 * 35


DEFAULT_POINTS = 64**3 + 32**3 + 16**3  # coarse-to-fine levels down to 16 per axis; they hold the error grids


def test_dualcontrol_counts_every_sweep_at_its_caps() -> None:
    default = params("dualcontrol_solve")  # 32 nodes, 8 scan points + 16 golden steps + 20 evaluation sweeps
    improvement = DEFAULT_POINTS * 32 * (8 + 16 + 20) * 2000
    companion = DEFAULT_POINTS * 32 * 2000  # the optimal solve's myopic companion
    assert job_work("dualcontrol_solve", default, {}).units == improvement + companion
    single = params("dualcontrol_solve", policy="myopic", quadrature_nodes=16, max_iterations=50,
                    acceleration={"coarse_to_fine": False}, error_estimate=False)
    assert job_work("dualcontrol_solve", single, {}).units == 64**3 * 16 * 50
    errors = params("dualcontrol_solve", policy="inert", max_iterations=10, acceleration={"coarse_to_fine": False})
    assert job_work("dualcontrol_solve", errors, {}).units == (64**3 + 32**3 + 16**3) * 32 * 10


def test_dualcontrol_counts_the_simulation_paths_by_horizon() -> None:
    grid = {axis: {"size": 16, "min": low, "max": high}
            for axis, low, high in (("x", -9.0, 11.0), ("mu", -4.0, 4.0), ("sigma", 0.02, 2.0))}
    small = params("dualcontrol_solve", grid=grid, report_states=[[1.0, 0.5, 0.5]])
    large = params("dualcontrol_solve", grid=grid, report_states=[[1.0, 0.5, 0.5]],
                   simulation={"paths": 1_000_000, "horizon": 5000})
    simulated = job_work("dualcontrol_solve", large, {}).units - job_work("dualcontrol_solve", small, {}).units
    # the optimal control's one-step minimisation (16 scan points + 30 golden steps of 32 nodes) per path and
    # period, and the closed-form inert variate and myopic control
    assert simulated == 1_000_000 * 5000 * (32 * (16 + 30) + 2)
    field, message, code = cap_problem("dualcontrol_solve", large, {}, {})
    assert (field, code) == ("params.simulation", "cpu_work_cap")
    assert "horizon" in message and "GPU worker" in message


def test_ks_counts_every_outer_iteration_at_its_caps() -> None:
    job = params("ks_solve", n_agents=20_000, periods=600, max_iterations=30, policy_max_iterations=500,
                 den_haan_periods=0)
    policy = 500 * (4 * 100 * 4) * 4  # Euler steps x grid entries x next states
    assert job_work("ks_solve", job, {}).units == 30 * (policy + 20_000 * 600)
    tested = params("ks_solve", n_agents=20_000, periods=600, max_iterations=30, policy_max_iterations=500)
    assert job_work("ks_solve", tested, {}).units == 30 * (policy + 20_000 * 600) + 20_000 * 600
    wide = params("ks_solve", n_agents=1_000, k_grid={"size": 1000}, K_grid={"size": 100},
                  policy_max_iterations=1_000_000)
    work = job_work("ks_solve", wide, {})
    assert work.units >= 100 * 1_000_000 * 16 * 1000 * 100 and work.field == "params.policy_max_iterations"


def test_dataset_kinds_count_the_stored_rows() -> None:
    boot = params("crve_bootstrap", dataset_id="d1", formula="y ~ x", cluster="g", param="x", reps=999)
    assert job_work("crve_bootstrap", boot, {"dataset_id": 12_345}).units == 999 * 12_345
    fit = params("sccs_fit", outcomes_dataset_id="o", covariates_dataset_id="c",
                 bootstrap={"replicates": 50}, cross_validation={"folds": 5})
    assert job_work("sccs_fit", fit, {"covariates_dataset_id": 1000, "outcomes_dataset_id": 9}).units == (
        1000 * (1 + 50 + 5 * AUTO_CV_GRID_POINTS) * 1000)  # CCD cycles at their cap, max_iterations


def test_sccs_analyses_count_outcome_rows_per_analysis() -> None:
    listed = params("sccs_analyses", outcomes_dataset_id="o", covariates_dataset_id="c", exposures=[1, 2, 3])
    rows = {"outcomes_dataset_id": 5_000, "covariates_dataset_id": 800}
    assert job_work("sccs_analyses", listed, rows).units == 5_000 * 3
    every = params("sccs_analyses", outcomes_dataset_id="o", covariates_dataset_id="c")
    assert job_work("sccs_analyses", every, rows).units == 5_000 * 800


def test_the_cap_refuses_above_its_bound_only_and_says_how_to_raise_it() -> None:
    job = params("ks_solve", n_agents=10_000, periods=1_000, max_iterations=10, policy_max_iterations=100,
                 den_haan_periods=0)
    units = 10 * (100 * 1600 * 4 + 10_000 * 1_000)
    assert cap_problem("ks_solve", job, {}, {"ks_solve": units}) is None
    field, message, code = cap_problem("ks_solve", job, {}, {"ks_solve": units - 1})
    assert (field, code) == ("params.n_agents", "cpu_work_cap")
    assert f"= {units:.3g} exceeds this server's CPU cap of {units - 1:.3g}" in message
    assert "GPUEST_CPU_MAX_WORK" in message and "GPU worker" in message


@pytest.mark.parametrize("cap", [0, -1])
def test_a_cap_of_zero_or_less_is_no_cap(cap: float) -> None:
    assert cap_problem("dualcontrol_solve", params("dualcontrol_solve"), {}, {"dualcontrol_solve": cap}) is None


def test_default_caps_refuse_gpu_sized_jobs_and_pass_the_examples() -> None:
    # no operator caps: each kind's default (JobKind.cpu_max_work) and the memory cap's default
    max_bytes = Settings().cpu_max_job_bytes
    assert max_bytes == 8 * 1024**3
    for name, kind in registry().items():
        example = kind.params_model.model_validate(kind.example.params)
        rows = {field: 10_000 for field in kind.dataset_fields}
        assert cap_problem(name, example, rows, {}, max_bytes) is None, name
    refused = {
        "dualcontrol_solve": {},  # the 64^3 default: most of an hour on a CPU
        "ks_solve": {"n_agents": 1_000, "k_grid": {"size": 1000}, "K_grid": {"size": 100},
                     "policy_max_iterations": 1_000_000},
    }
    for name, values in refused.items():
        problem = cap_problem(name, params(name, **values), {}, {}, max_bytes)
        assert problem is not None and problem.code == "cpu_work_cap", name
    assert cap_problem("ks_solve", params("ks_solve"), {}, {}, max_bytes) is None  # the defaults fit


def test_memory_beyond_the_cap_is_refused_naming_the_dimension() -> None:
    huge = params("ks_solve", n_agents=200_000_000, max_iterations=1)
    work = job_work("ks_solve", huge, {})
    assert work.bytes >= 200_000_000 * 100 and work.bytes_field == "params.n_agents"
    field, message, code = cap_problem("ks_solve", huge, {}, {"ks_solve": 0}, 8 * 1024**3)
    assert (field, code) == ("params.n_agents", "cpu_memory_cap")
    assert "GiB of memory" in message and "GPUEST_CPU_MAX_JOB_BYTES" in message and "GPU worker" in message
    assert cap_problem("ks_solve", huge, {}, {"ks_solve": 0}, 0) is None  # no memory cap
    axes = (("x", 512, -9.0, 11.0), ("mu", 512, -4.0, 4.0), ("sigma", 256, 0.02, 2.0))  # 2^26 points x 26 arrays
    grid = params("dualcontrol_solve", grid={axis: {"size": n, "min": low, "max": high} for axis, n, low, high in axes})
    assert cap_problem("dualcontrol_solve", grid, {}, {"dualcontrol_solve": 0}, 8 * 1024**3).code == "cpu_memory_cap"
