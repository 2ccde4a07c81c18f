"""Each kind's work measure (``JobKind.work``, in its family's ``work.py``), checked against the product its
formula states, computed here by hand from the validated params (defaults included), and the cap's verdict on
either side of the bound."""

from __future__ import annotations

import importlib

import pytest

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


def test_dualcontrol_counts_one_bellman_sweep() -> None:
    default = params("dualcontrol_solve")  # 64^3 states, 32 nodes, 8 scan points + 16 golden steps
    assert job_work("dualcontrol_solve", default, {}).units == 64**3 * 32 * (8 + 16)
    finer = params("dualcontrol_solve", minimizer={"golden_iterations": 28})
    assert job_work("dualcontrol_solve", finer, {}).units == 64**3 * 32 * (8 + 28)
    myopic = params("dualcontrol_solve", policy="myopic", quadrature_nodes=16)
    assert job_work("dualcontrol_solve", myopic, {}).units == 64**3 * 16


def test_ks_counts_the_panel_of_one_outer_iteration() -> None:
    assert job_work("ks_solve", params("ks_solve", n_agents=20_000, periods=600), {}).units == 20_000 * 600


def test_dataset_kinds_count_the_stored_rows() -> None:
    boot = params("crve_bootstrap", dataset_id="d1", formula="y ~ x", cluster="g", param="x", reps=999)
    assert job_work("crve_bootstrap", boot, {"dataset_id": 12_345}).units == 999 * 12_345
    fit = params("sccs_fit", outcomes_dataset_id="o", covariates_dataset_id="c",
                 bootstrap={"replicates": 50}, cross_validation={"folds": 5})
    assert job_work("sccs_fit", fit, {"covariates_dataset_id": 1000, "outcomes_dataset_id": 9}).units == (
        1000 * (1 + 50 + 5 * AUTO_CV_GRID_POINTS))


def test_sccs_analyses_count_outcome_rows_per_analysis() -> None:
    listed = params("sccs_analyses", outcomes_dataset_id="o", covariates_dataset_id="c", exposures=[1, 2, 3])
    rows = {"outcomes_dataset_id": 5_000, "covariates_dataset_id": 800}
    assert job_work("sccs_analyses", listed, rows).units == 5_000 * 3
    every = params("sccs_analyses", outcomes_dataset_id="o", covariates_dataset_id="c")
    assert job_work("sccs_analyses", every, rows).units == 5_000 * 800


def test_the_cap_refuses_above_its_bound_only_and_says_how_to_raise_it() -> None:
    job = params("ks_solve", n_agents=10_000, periods=1_000)  # 1e7
    assert cap_problem("ks_solve", job, {}, {"ks_solve": 1e7}) is None
    assert cap_problem("ks_solve", job, {}, {"crve_montecarlo": 1.0}) is None  # another kind's cap
    field, message = cap_problem("ks_solve", job, {}, {"ks_solve": 9.99e6})
    assert field == "params.n_agents"
    assert "n_agents x periods = 1e+07 exceeds this server's CPU cap of 9.99e+06" in message
    assert "GPUEST_CPU_MAX_WORK" in message


@pytest.mark.parametrize("cap", [0, -1])
def test_a_cap_of_zero_or_less_is_no_cap(cap: float) -> None:
    assert cap_problem("ks_solve", params("ks_solve"), {}, {"ks_solve": cap}) is None
