"""crve_bootstrap as a job: formula parsing, data sources, result names, refusals with readable reasons."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf
from pydantic import ValidationError

from kernels.context import local_context, run_kind
from kernels.crve.bootstrap import BootstrapData, BootstrapOptions, wild_cluster_bootstrap
from kernels.crve.jobs import KINDS
from kernels.crve.spec import BootstrapParams, SyntheticDataset
from kernels.crve.synthetic import synthetic_columns
from kernels.progress import LocalProgress
from kernels.registry import JobKind

RESULT_NAMES = {"estimate", "se", "t_stat", "p_value", "p_value_analytic", "conf_int", "reps_used", "enumerated"}


def _frame(seed: int = 1, n_obs: int = 600, n_clusters: int = 20) -> pd.DataFrame:
    columns = synthetic_columns(np, n_obs, n_clusters, 3, seed, n_fe=6)
    frame = pd.DataFrame(columns)
    frame["region"] = np.where(frame["cluster"] % 2 == 0, "north", "south")
    frame["state"] = frame["cluster"] // 4  # 5 coarser bootstrap clusters
    return frame


def _kind(name: str) -> JobKind:
    return next(kind for kind in KINDS if kind.name == name)


def _run(frame: pd.DataFrame | None, progress: LocalProgress | None = None, **params: object) -> dict:
    base: dict[str, object] = {"formula": "y ~ x1 + x2", "cluster": "cluster", "param": "x1", "reps": 999}
    if frame is not None:
        base["dataset_id"] = "d1"
    base.update(params)
    data = {} if frame is None else {"dataset_id": frame}
    return run_kind(_kind("crve_bootstrap"), base, local_context("cpu", data, progress))


def test_result_has_the_documented_names_and_matches_statsmodels() -> None:
    frame = _frame()
    progress = LocalProgress()
    result = _run(frame, progress, formula="y ~ x1 + x2 + C(region)")
    assert set(result) >= RESULT_NAMES
    assert [row["name"] for row in result["coefficients"]] == ["Intercept", "x1", "x2", "C(region)[T.south]"]
    fit = smf.ols("y ~ x1 + x2 + C(region)", frame).fit(cov_type="cluster", cov_kwds={"groups": frame["cluster"]})
    assert result["estimate"] == pytest.approx(fit.params["x1"], rel=1e-12)
    assert result["se"] == pytest.approx(fit.bse["x1"], rel=1e-10)
    assert result["conf_int"][0] < result["estimate"] < result["conf_int"][1]
    assert result["reps_used"] == 999 and not result["enumerated"] and result["bootstrap_type"] == "WCR"
    assert progress.reports[-1] == (1.0, "done") and "bootstrap_t" in progress.artifacts
    assert progress.artifacts["bootstrap_t"].shape == (999,)
    json.dumps(result, allow_nan=False)


def test_no_intercept_and_absorbed_fixed_effect() -> None:
    frame = _frame()
    without = _run(frame, formula="y ~ x1 + x2 - 1")
    assert [row["name"] for row in without["coefficients"]] == ["x1", "x2"]
    absorbed = _run(frame, formula="y ~ x1 + x2 | fe")
    dummies = smf.ols("y ~ x1 + x2 + C(fe) - 1", frame).fit()
    assert absorbed["estimate"] == pytest.approx(dummies.params["x1"], rel=1e-10)
    assert absorbed["fixed_effect"] == {"name": "fe", "levels": 6, "nested_in_cluster": False}
    assert absorbed["n_params_ssc"] == 2 + 6


@pytest.mark.parametrize("formula", ["y ~ x1 + C(region3) + x2 | fe", "y ~ x1 + C(region3) + x2 - 1 | fe"])
def test_categorical_regressor_with_absorbed_fixed_effect_equals_explicit_dummies(formula: str) -> None:
    # C(region3) drops its reference level (formulaic's contrasts with an intercept, the Intercept then
    # absorbed), as pyfixest does; every level would be collinear with the fixed effect.
    frame = _frame()
    frame["region3"] = np.array(["a", "b", "c"])[frame["cluster"] % 3]  # crosses the fixed effect fe
    result = _run(frame, formula=formula, conf_int=False)
    names = [row["name"] for row in result["coefficients"]]
    assert names == ["x1", "C(region3)[T.b]", "C(region3)[T.c]", "x2"]
    # Brute force: OLS on explicit region and fixed-effect dummies, CRV1 with every column counted (the fixed
    # effect crosses the clusters: n_params_ssc = 3 + 1 + 6 columns).
    n_obs, n_fe = len(frame), 6
    design = np.column_stack(
        [frame["x1"], frame["region3"] == "b", frame["region3"] == "c", frame["x2"]]
        + [frame["fe"] == level for level in range(n_fe)]
    ).astype(float)
    inverse = np.linalg.inv(design.T @ design)
    beta = inverse @ design.T @ frame["y"].to_numpy()
    residual = frame["y"].to_numpy() - design @ beta
    codes = frame["cluster"].to_numpy()
    scores = np.stack([design[codes == g].T @ residual[codes == g] for g in range(20)])
    k = design.shape[1]
    factor = 20 / 19 * (n_obs - 1) / (n_obs - k)
    se = np.sqrt(factor * np.diag(inverse @ scores.T @ scores @ inverse))
    assert result["n_params_ssc"] == k == 10
    for index, row in enumerate(result["coefficients"]):
        assert row["estimate"] == pytest.approx(beta[index], rel=1e-10, abs=1e-12)
        assert row["se"] == pytest.approx(se[index], rel=1e-10)
    assert result["estimate"] == pytest.approx(beta[0], rel=1e-10) and result["se"] == pytest.approx(se[0], rel=1e-10)


def test_bootcluster_enumeration_and_wcu() -> None:
    frame = _frame()
    result = _run(frame, bootcluster="state", reps=9999)
    assert result["n_boot_clusters"] == 5 and result["enumerated"] and result["reps_used"] == 32
    wcu = _run(frame, impose_null=False, weights_type="webb", p_val_type="equal-tailed")
    assert wcu["bootstrap_type"] == "WCU" and wcu["p_value"] == wcu["p_values"]["equal-tailed"]


def test_nonzero_null_equals_shifted_outcome() -> None:
    # H0: beta_x1 = r on y is H0: beta_x1 = 0 on y - r x1: same t, same bootstrap distribution.
    frame = _frame()
    shifted = frame.assign(y=frame["y"] - 0.25 * frame["x1"])
    at_r = _run(frame, r=0.25, conf_int=False)
    at_zero = _run(shifted, conf_int=False)
    assert at_r["t_stat"] == pytest.approx(at_zero["t_stat"], rel=1e-10)
    assert at_r["p_values"] == pytest.approx(at_zero["p_values"], abs=1e-12)


def test_synthetic_dataset_is_the_generator() -> None:
    result = _run(None, synthetic={"n_obs": 500, "n_clusters": 10, "n_regressors": 2, "seed": 3})
    columns = synthetic_columns(np, 500, 10, 2, 3)
    x = np.column_stack([np.ones(500), columns["x1"], columns["x2"]])
    direct = wild_cluster_bootstrap(
        np, BootstrapData(x, columns["y"], columns["cluster"], 10), BootstrapOptions(param=1, reps=999, seed=20190101)
    )
    assert result["p_value"] == direct.p_values["two-tailed"]
    assert result["conf_int"] == pytest.approx(list(direct.conf_int), rel=1e-12)


def test_examples_run_the_paths_they_stand_for() -> None:
    # The examples are what the cross-backend test runs on the GPU: the bootstrap's must absorb a fixed effect
    # crossing the clusters and draw weights (no enumeration), the Monte Carlo's must run the WCR bootstrap.
    boot = _kind("crve_bootstrap")
    result = run_kind(boot, boot.example.params, local_context("cpu", boot.example.frames()))
    assert result["fixed_effect"] == {"name": "fe", "levels": 8, "nested_in_cluster": False}
    assert not result["enumerated"] and result["reps_used"] == 9999 and None not in result["conf_int"]
    montecarlo = _kind("crve_montecarlo")
    result = run_kind(montecarlo, montecarlo.example.params, local_context("cpu"))
    assert result["test"] == "wild_bootstrap" and result["bootstrap_reps"] == 199 and result["replications"] == 500
    json.dumps(result, allow_nan=False)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"formula": "y ~ x1 + nope"}, "nope"),
        ({"cluster": "missing_cluster"}, "missing_cluster"),
        ({"bootcluster": "missing_boot"}, "missing_boot"),
        ({"param": "x3"}, "param"),
        ({"formula": "y ~ x1 + x2 + x2copy"}, "collinear"),
        ({"cluster": "one"}, "single cluster"),
        ({"formula": "y ~ x1 + x2 + withnan"}, "withnan"),
        ({"formula": "y ~ x1 + x2 + withinf"}, "withinf"),
        ({"formula": "y x1"}, "formula"),
    ],
)
def test_bad_input_fails_with_a_readable_reason(params: dict, message: str) -> None:
    frame = _frame()
    frame["x2copy"] = 3.0 * frame["x2"]
    frame["one"] = 1
    frame["withnan"] = frame["x1"].where(frame.index != 5)
    frame["withinf"] = frame["x1"].where(frame.index != 7, np.inf)
    with pytest.raises(ValueError, match=message):
        _run(frame, **params)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"reps": 0}, "reps"),
        ({"reps": 10**7}, "reps"),
        ({"weights_type": "gauss"}, "weights_type"),
        ({"p_val_type": "two"}, "p_val_type"),
        ({"sign_level": 1.5}, "sign_level"),
        ({"synthetic": {"n_obs": 100, "n_clusters": 5}}, "dataset_id"),
        ({"dataset_id": None}, "dataset_id"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_params_are_validated(change: dict, field: str) -> None:
    params = {"dataset_id": "d", "formula": "y ~ x", "cluster": "g", "param": "x"}
    params.update(change)
    with pytest.raises(ValidationError, match=field):
        BootstrapParams.model_validate(params)


@pytest.mark.parametrize(
    ("synthetic", "loc"),
    [
        ({"n_obs": 100, "n_clusters": 101}, ("n_clusters",)),
        ({"n_obs": 100, "n_clusters": 10, "n_fe": 101}, ("n_fe",)),
        ({"n_obs": 20_000_000, "n_clusters": 10, "n_regressors": 9}, ("n_regressors",)),  # 220,000,000 values
        ({"n_obs": 10_000_000, "n_clusters": 10, "n_regressors": 19}, ("n_regressors",)),  # 210,000,000
    ],
)
def test_synthetic_cross_field_bounds_name_the_field(synthetic: dict, loc: tuple) -> None:
    with pytest.raises(ValidationError) as caught:
        SyntheticDataset.model_validate(synthetic)
    assert [error["loc"] for error in caught.value.errors()] == [loc]
    # Inside a job spec the location is the nested field, as the API's 422 names it.
    spec = {"synthetic": synthetic, "formula": "y ~ x1", "cluster": "cluster", "param": "x1"}
    with pytest.raises(ValidationError) as caught:
        BootstrapParams.model_validate(spec)
    assert [error["loc"] for error in caught.value.errors()] == [("synthetic", *loc)]


@pytest.mark.parametrize(
    "synthetic",
    [
        {"n_obs": 100, "n_clusters": 100, "n_fe": 100},
        {"n_obs": 20_000_000, "n_clusters": 1000, "n_regressors": 8},  # exactly 200,000,000 values
    ],
)
def test_synthetic_bounds_accept_their_limits(synthetic: dict) -> None:
    assert SyntheticDataset.model_validate(synthetic).n_obs == synthetic["n_obs"]
