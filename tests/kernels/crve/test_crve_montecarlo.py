"""crve_montecarlo: the CGM data, CRV1 from cluster statistics vs statsmodels, chunking, the job kind."""

from __future__ import annotations

import json

import numpy as np
import pytest
import statsmodels.api as sm
from pydantic import ValidationError

from kernels.context import local_context, run_kind
from kernels.crve import montecarlo as mc
from kernels.crve.bootstrap import BootstrapData, BootstrapOptions, wild_cluster_bootstrap
from kernels.crve.jobs import KINDS
from kernels.crve.spec import MonteCarloParams
from kernels.progress import JobCancelled, LocalProgress


def test_cgm_data_follows_the_design() -> None:
    design = mc.Design(n_clusters=400, cluster_size=25, n_regressors=3, seed=7)
    x, y = mc.cgm_data(np, design, 0, 2)
    assert x.shape == (2, 400, 25, 3) and y.shape == (2, 400, 25)
    assert np.all(x[..., 0] == 1.0)
    slopes = x[..., 1:].reshape(-1, 2)
    # x = e_i + e_g: variance 2, within-cluster correlation 1/2, regressors independent.
    np.testing.assert_allclose(slopes.var(axis=0), 2.0, rtol=0.05)
    x1 = x[0, :, :, 1]
    within = np.corrcoef(x1[:, 0], x1[:, 1])[0, 1]
    assert abs(within - 0.5) < 0.1
    assert abs(np.corrcoef(slopes.T)[0, 1]) < 0.03
    # y - x'1 = u_i + u_g: mean 0, variance 2.
    error = y - x.sum(axis=-1)
    assert abs(error.mean()) < 0.1 and abs(error.var() - 2.0) < 0.15


def test_blocks_are_addressed_by_replication() -> None:
    design = mc.Design(n_clusters=5, cluster_size=3, n_regressors=4, seed=11)
    x_all, y_all = mc.cgm_data(np, design, 0, 6)
    x_tail, y_tail = mc.cgm_data(np, design, 4, 2)
    np.testing.assert_array_equal(x_all[4:], x_tail)
    np.testing.assert_array_equal(y_all[4:], y_tail)


@pytest.mark.parametrize("ssc", [True, False])
def test_crv1_from_cluster_statistics_matches_statsmodels(ssc: bool) -> None:
    design = mc.Design(n_clusters=12, cluster_size=7, n_regressors=4, seed=3)
    x, y = mc.cgm_data(np, design, 0, 3)
    xtx_g, xty_g = mc.cluster_statistics_numpy(np, design, 0, 3)
    block = mc.crv1_block(np, xtx_g, xty_g, design.n_obs, coefficient=2, ssc=ssc)
    groups = np.repeat(np.arange(design.n_clusters), design.cluster_size)
    for r in range(3):
        fit = sm.OLS(y[r].reshape(-1), x[r].reshape(-1, 4)).fit(
            cov_type="cluster", cov_kwds={"groups": groups, "use_correction": ssc, "df_correction": ssc}
        )
        np.testing.assert_allclose(block.estimate[r], fit.params[2], rtol=1e-12)
        np.testing.assert_allclose(block.se[r], fit.bse[2], rtol=1e-10)


def _run(progress: LocalProgress | None = None, **overrides: object) -> dict:
    kind = next(kind for kind in KINDS if kind.name == "crve_montecarlo")
    params = {"n_clusters": 20, "cluster_size": 10, "n_regressors": 3, "replications": 300, "seed": 5}
    params.update(overrides)
    return run_kind(kind, params, local_context("cpu", progress=progress))


def test_job_result_is_chunk_invariant_and_reports_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = _run()
    monkeypatch.setattr("kernels.crve.jobs.NUMPY_BLOCK_ELEMENTS", 1000)  # 1 replication per block
    progress = LocalProgress()
    chunked = _run(progress)
    assert len(progress.reports) > 100 and progress.reports[-1][0] == 1.0
    for key in ("rejection_rate", "rejection_rate_se"):
        assert chunked[key] == whole[key]
    for key in ("mean_estimate", "sd_estimate", "mean_se"):
        assert chunked[key] == pytest.approx(whole[key], rel=1e-12)
    assert set(whole["rejection_rate"]) == {"0.01", "0.05", "0.10"}
    assert whole["device"] == "cpu" and whole["seed"] == 5


def test_rejection_rate_is_near_nominal_with_many_clusters() -> None:
    # CGM 2008: with G = 200 clusters CRV1 with t(G-1) critical values is close to its nominal size.
    result = _run(n_clusters=200, cluster_size=5, replications=1500, seed=1)
    for level in ("0.05", "0.10"):
        rate, se = result["rejection_rate"][level], result["rejection_rate_se"][level]
        assert abs(rate - float(level)) < 4 * max(se, 0.005)
    assert 0.9 < result["se_ratio"] < 1.1
    assert abs(result["mean_estimate"] - 1.0) < 4 * result["sd_estimate"] / np.sqrt(1500)


def test_rejection_rate_is_oversized_with_few_clusters_and_normal_critical_values() -> None:
    # CGM 2008 Table: with G = 5 the CRV1 test with N(0,1) critical values over-rejects heavily.
    result = _run(n_clusters=5, cluster_size=30, replications=1000, seed=2, critical_values="normal")
    assert result["rejection_rate"]["0.05"] > 0.10


def test_cancel_mid_run_stops_at_a_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kernels.crve.jobs.NUMPY_BLOCK_ELEMENTS", 1000)

    class CancelAfterThree(LocalProgress):
        def __call__(self, fraction: float, stage: str | None = None) -> None:
            if len(self.reports) == 3:
                self.cancel()
            super().__call__(fraction, stage)

    cancelling = CancelAfterThree()
    with pytest.raises(JobCancelled):
        _run(cancelling)
    assert len(cancelling.reports) == 4 and cancelling.reports[-1][0] < 0.05


@pytest.mark.parametrize(
    ("field", "value"),
    [("n_clusters", 1), ("replications", 0), ("replications", 10**9), ("n_regressors", 1), ("cluster_size", "3")],
)
def test_params_are_bounded(field: str, value: object) -> None:
    params = {"n_clusters": 20, "cluster_size": 10, "n_regressors": 3, "replications": 300}
    params[field] = value
    with pytest.raises(ValidationError, match=field):
        MonteCarloParams.model_validate(params)


_VALID = {"n_clusters": 20, "cluster_size": 10, "n_regressors": 3, "replications": 300}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"test_coefficient": 3}, "test_coefficient"),  # n_regressors = 3: slopes 1 and 2
        ({"n_regressors": 32, "test_coefficient": 31, "n_clusters": 2, "cluster_size": 16}, "n_regressors"),
        ({"n_clusters": 2, "cluster_size": 1, "n_regressors": 2}, "n_regressors"),  # 2 observations, 2 parameters
        ({"n_clusters": 100_000, "cluster_size": 100_000}, "cluster_size"),  # accepted before, OOM at run time
        ({"n_clusters": 1_000, "cluster_size": 10_001}, "cluster_size"),  # 10,001,000 observations
        ({"test": "wild_bootstrap", "n_clusters": 1_000, "bootstrap_reps": 50_001}, "bootstrap_reps"),
        ({"test": "wild_bootstrap", "n_clusters": 100_000, "cluster_size": 2}, "bootstrap_reps"),  # default B 999
    ],
)
def test_cross_field_bounds_name_the_field(change: dict, field: str) -> None:
    params = {**_VALID, **change}
    with pytest.raises(ValidationError) as caught:
        MonteCarloParams.model_validate(params)
    errors = caught.value.errors()
    assert [error["loc"] for error in errors] == [(field,)]
    assert errors[0]["type"] == "value_error"


@pytest.mark.parametrize(
    "change",
    [
        {"test_coefficient": 2},
        {"n_clusters": 2, "cluster_size": 2, "n_regressors": 3, "test_coefficient": 2},  # 4 observations > 3
        {"n_clusters": 1_000, "cluster_size": 10_000},  # exactly 10,000,000 observations
        {"test": "wild_bootstrap", "n_clusters": 1_000, "bootstrap_reps": 50_000},  # exactly 50,000,000
        {"n_clusters": 100_000, "cluster_size": 2},  # CRV1: B is not used
    ],
)
def test_cross_field_bounds_accept_their_limits(change: dict) -> None:
    params = MonteCarloParams.model_validate({**_VALID, **change})
    assert params.n_clusters * params.cluster_size > params.n_regressors > params.test_coefficient


def test_smallest_identified_design_runs() -> None:
    result = _run(n_clusters=2, cluster_size=2, n_regressors=3, test_coefficient=2, replications=5)
    assert result["n_obs"] == 4 and result["replications"] == 5


@pytest.mark.parametrize(
    ("n_clusters", "reps", "weights_type"), [(12, 99, "rademacher"), (7, 999, "rademacher"), (9, 49, "webb")]
)
def test_batched_wcr_replications_equal_the_single_dataset_bootstrap(
    n_clusters: int, reps: int, weights_type: str
) -> None:
    design = mc.Design(n_clusters=n_clusters, cluster_size=6, n_regressors=3, seed=8)
    first, count = 3, 4
    xtx_g, xty_g = mc.cluster_statistics_numpy(np, design, first, count)
    block = mc.wcr_bootstrap_block(np, xtx_g, xty_g, design.n_obs, 2, True, weights_type, reps, 8, first)
    x, y = mc.cgm_data(np, design, first, count)
    cluster = np.repeat(np.arange(n_clusters), design.cluster_size)
    for i in range(count):
        options = BootstrapOptions(
            param=2, r=1.0, reps=reps, weights_type=weights_type, seed=8, conf_int=False,
            draw_base=(first + i) * reps * n_clusters,
        )  # fmt: skip
        data = BootstrapData(x[i].reshape(-1, 3), y[i].reshape(-1), cluster, n_clusters)
        single = wild_cluster_bootstrap(np, data, options)
        assert block.t_stat[i] == pytest.approx(single.t_stat, rel=1e-10)
        assert block.p_bootstrap[i] == single.p_values["two-tailed"]


def test_wild_bootstrap_monte_carlo_job_is_closer_to_nominal_than_crv1() -> None:
    # CGM 2008 / MacKinnon & Webb: with G = 8 clusters CRV1 t(G-1) over-rejects, WCR is close to nominal.
    common = {"n_clusters": 8, "cluster_size": 15, "replications": 400, "seed": 3}
    wcr = _run(test="wild_bootstrap", bootstrap_reps=199, **common)
    crv1 = _run(**common)
    assert wcr["bootstrap_reps"] == 199 and wcr["critical_values"] is None
    assert abs(wcr["rejection_rate"]["0.10"] - 0.10) < 4 * wcr["rejection_rate_se"]["0.10"]
    assert crv1["rejection_rate"]["0.10"] > wcr["rejection_rate"]["0.10"]


def test_single_replication_result_is_valid_json() -> None:
    result = _run(replications=1)
    assert result["sd_estimate"] is None and result["se_ratio"] is None
    json.dumps(result, allow_nan=False)


def test_unbalanced_design_generates_each_cluster_at_its_size() -> None:
    """The padded NumPy generator against a loop over clusters that draws each observation at its address."""
    from kernels import rng

    sizes = (1, 7, 3, 12, 5)
    design = mc.Design(n_clusters=5, cluster_size=6, n_regressors=3, seed=21, sizes=sizes)
    assert design.n_obs == 28 and list(design.offsets) == [0, 1, 8, 11, 23, 28]
    xtx, xty = mc.cluster_statistics_numpy(np, design, 4, 2)
    for r_index, r in enumerate((4, 5)):
        for g, size in enumerate(sizes):
            e_g = rng.normal(np, 21, mc.STREAM_X_CLUSTER, (r * 5 + g) * 2 + np.arange(2))
            u_g = rng.normal(np, 21, mc.STREAM_U_CLUSTER, np.array([r * 5 + g]))[0]
            obs = r * 28 + design.offsets[g] + np.arange(size)
            slopes = rng.normal(np, 21, mc.STREAM_X_INDIVIDUAL, obs[:, None] * 2 + np.arange(2)) + e_g
            y = 1.0 + slopes.sum(axis=1) + rng.normal(np, 21, mc.STREAM_U_INDIVIDUAL, obs) + u_g
            x = np.column_stack([np.ones(size), slopes])
            np.testing.assert_allclose(xtx[r_index, g], x.T @ x, rtol=1e-13)
            np.testing.assert_allclose(xty[r_index, g], x.T @ y, rtol=1e-13)
    balanced = mc.Design(n_clusters=5, cluster_size=6, n_regressors=3, seed=21)
    same = mc.Design(n_clusters=5, cluster_size=6, n_regressors=3, seed=21, sizes=(6,) * 5)
    np.testing.assert_array_equal(mc.cluster_statistics_numpy(np, balanced, 0, 3)[0],
                                  mc.cluster_statistics_numpy(np, same, 0, 3)[0])  # fmt: skip


def test_unbalanced_monte_carlo_job() -> None:
    from kernels.context import RunContext, run_kind
    from kernels.progress import LocalProgress
    from kernels.registry import get_kind

    params = {"n_clusters": 20, "cluster_size": 15, "n_regressors": 3, "replications": 300,
              "cluster_size_dispersion": 1.0, "seed": 4}  # fmt: skip
    result = run_kind(get_kind("crve_montecarlo"), params, RunContext(np, LocalProgress()))
    sizes = mc.lognormal_sizes(20, 15, 1.0, 4)
    assert result["n_obs"] == sum(sizes) and result["cluster_sizes"]["max"] == max(sizes)
    assert result["cluster_sizes"]["cv"] > 0.5  # lognormal with s = 1: CV about 1.3
    assert 0 <= result["rejection_rate"]["0.05"] <= 1


def test_unbalanced_params_are_checked() -> None:
    from pydantic import ValidationError

    from kernels.crve.spec import MonteCarloParams

    base = {"n_clusters": 3, "cluster_size": 5, "n_regressors": 2, "replications": 10}
    with pytest.raises(ValidationError, match="has 2 sizes for n_clusters=3"):
        MonteCarloParams(**base, cluster_sizes=[1, 2])
    with pytest.raises(ValidationError, match="not both"):
        MonteCarloParams(**base, cluster_sizes=[1, 2, 3], cluster_size_dispersion=0.5)
    with pytest.raises(ValidationError, match="every size is 1 to"):
        MonteCarloParams(**base, cluster_sizes=[0, 2, 3])
    assert MonteCarloParams(**base, cluster_sizes=[1, 2, 30]).design_sizes == (1, 2, 30)
