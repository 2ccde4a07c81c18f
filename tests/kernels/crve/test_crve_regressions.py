"""The regressions researchers run (issue 14): several absorbed fixed effects, multiway clusters, linear and joint
hypotheses, regression weights and the heteroskedastic wild bootstrap.

References: pyfixest (estimates, CRV1/HC1 standard errors, the small-sample factor, singletons) and a brute
force that re-runs each bootstrap draw as a full least-squares fit on the N rows: y* projected off the fixed
effects' dummies by ``numpy.linalg.lstsq`` (weighted: on sqrt(w) times everything), beta* by least squares, the
multiway CRV1 of every draw by inclusion-exclusion. Same draws, so t* (and W*) must agree to rounding, and with
enumeration the p-values exactly.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import numpy as np
import pandas as pd
import pytest

from kernels.crve.bootstrap import BootstrapOptions, wild_cluster_bootstrap
from kernels.crve.fixef import FixedEffect, demean_map
from kernels.crve.formula import design_from_formula
from kernels.crve.hypothesis import parse_restrictions
from kernels.crve.inference import p_values_from
from kernels.crve.jobs import device_data
from kernels.crve.weights import draw_weights, enumerated_weights

pyfixest = pytest.importorskip("pyfixest")


def _panel(seed: int, n_obs: int = 360) -> pd.DataFrame:
    """Firms nested in states (the clusters), years crossing them, a second cluster dimension (region)."""
    rs = np.random.default_rng(seed)
    state = rs.integers(0, 9, n_obs)
    state[:9] = np.arange(9)
    firm = state * 4 + rs.integers(0, 4, n_obs)
    year = rs.integers(0, 7, n_obs)
    region = rs.integers(0, 6, n_obs)
    x1 = rs.normal(size=n_obs) + rs.normal(size=9)[state]
    x2 = rs.normal(size=n_obs) + 0.3 * year
    y = (0.4 * x1 - 0.2 * x2 + rs.normal(size=36)[firm] + rs.normal(size=7)[year] + rs.normal(size=n_obs)
         + rs.normal(size=9)[state] + rs.normal(size=6)[region])  # fmt: skip
    weight = rs.uniform(0.3, 3.0, n_obs)
    return pd.DataFrame({"y": y, "x1": x1, "x2": x2, "firm": firm, "state": state, "year": year,
                         "region": region, "w": weight})  # fmt: skip


def _fit(frame, formula, cluster, options, weights=None, bootcluster=None):
    design = design_from_formula(frame, formula, cluster, bootcluster, weights)
    return wild_cluster_bootstrap(np, device_data(design, np), options), design


def _pyfixest(frame, formula, vcov, weights=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pyfixest.feols(formula, data=frame, vcov=vcov, weights=weights, fixef_tol=1e-13)


# --------------------------------------------------------------------------------------- against pyfixest


@pytest.mark.parametrize(
    ("formula", "cluster", "vcov"),
    [
        ("y ~ x1 + x2 | firm + year", ["state"], {"CRV1": "state"}),  # firm nested in state, year crossing
        ("y ~ x1 + x2 | state + year", ["firm"], {"CRV1": "firm"}),  # both cross the firm clusters
        ("y ~ x1 + x2 | firm + year", ["state", "year"], {"CRV1": "state+year"}),  # two-way
        ("y ~ x1 + x2 | firm + year + region", ["state", "region"], {"CRV1": "state+region"}),
        ("y ~ x1 + x2 | year", ["state", "region"], {"CRV1": "state+region"}),
        ("y ~ x1 + x2 | firm + year", [], "hetero"),
        ("y ~ x1 + x2", [], "hetero"),
        ("y ~ x1 + x2 | firm^year", ["state"], {"CRV1": "state"}),
    ],
)
@pytest.mark.parametrize("weights", [None, "w"])
def test_estimates_and_standard_errors_match_pyfixest(formula, cluster, vcov, weights) -> None:
    frame = _panel(1)
    reference = _pyfixest(frame, formula, vcov, weights)
    for method in ("direct", "map"):
        options = BootstrapOptions(param=0, reps=9, conf_int=False, fixef_method=method, fixef_tol=1e-13)
        ours, design = _fit(frame, formula, cluster, options, weights)
        names = list(reference.coef().index)
        columns = [design.names.index(name) for name in names]
        np.testing.assert_allclose(ours.coefficients[columns], reference.coef().values, rtol=1e-9)
        # pyfixest leaves a multiway covariance that is not positive semi-definite as it is (a NaN standard
        # error); fixest and we zero its negative eigenvalues (Cameron, Gelbach & Miller 2011).
        values, vectors = np.linalg.eigh(reference._vcov)
        assert ours.eigen_fixed == bool(values[0] < 0)
        expected = (vectors * np.maximum(values, 0)) @ vectors.T
        scale = np.sqrt(np.outer(np.diag(expected), np.diag(expected))) + 1e-300
        np.testing.assert_allclose(ours.covariance[np.ix_(columns, columns)] / scale, expected / scale, atol=1e-8)
        assert ours.n_obs == reference._N
        assert ours.df_t == int(reference._df_t)
        if formula.count("|"):
            assert ours.n_singletons == len(frame) - reference._N


def test_singletons_are_dropped_repeatedly_as_pyfixest_does() -> None:
    frame = _panel(2, 200)
    frame.loc[frame.index[:6], "firm"] = 1000 + np.arange(6)  # six singleton firms
    ours, _ = _fit(frame, "y ~ x1 + x2 | firm + year", ["state"], BootstrapOptions(param=0, reps=9, conf_int=False))
    reference = _pyfixest(frame, "y ~ x1 + x2 | firm + year", {"CRV1": "state"})
    assert ours.n_singletons == len(frame) - reference._N >= 6
    np.testing.assert_allclose(ours.standard_errors, reference.se().values, rtol=1e-8)
    kept, _ = _fit(frame, "y ~ x1 + x2 | firm + year", ["state"],
                   BootstrapOptions(param=0, reps=9, conf_int=False, drop_singletons=False))  # fmt: skip
    assert kept.n_obs == len(frame) and kept.n_singletons == 0


def test_map_converges_to_the_direct_projection_at_the_tolerance() -> None:
    frame = _panel(3)
    effects = [FixedEffect(name, frame[name].to_numpy(), int(frame[name].max()) + 1) for name in ("firm", "year")]
    values = frame[["x1", "x2", "y"]].to_numpy()
    loose = demean_map(np, values, effects, None, 1e-4, 10_000)
    tight = demean_map(np, values, effects, None, 1e-13, 10_000)
    assert loose.converged and tight.converged and tight.iterations > loose.iterations > 1
    exact = _partial_out(values, _dummies(frame, ["firm", "year"]), np.ones(len(frame)))
    np.testing.assert_allclose(tight.values, exact, atol=1e-10 * np.abs(values).max())
    assert np.abs(loose.values - exact).max() > 1e-9  # the tolerance is a real stopping rule
    with pytest.raises(ValueError, match="fixef_maxiter"):
        _fit(frame, "y ~ x1 + x2 | firm + year + region", ["state"],
             BootstrapOptions(param=0, reps=9, fixef_method="map", fixef_tol=1e-14, fixef_maxiter=2))  # fmt: skip


# ------------------------------------------------------------------------------------- the brute force


def _dummies(frame: pd.DataFrame, names: list[str]) -> np.ndarray | None:
    if not names:
        return None
    return np.column_stack([pd.get_dummies(frame[name].astype(str)).to_numpy(float) for name in names])


def _partial_out(values: np.ndarray, dummies: np.ndarray | None, sqrt_w: np.ndarray) -> np.ndarray:
    """sqrt(w) times the weighted residual of ``values`` on the dummies (least squares, any rank)."""
    values = values * (sqrt_w[:, None] if values.ndim == 2 else sqrt_w)
    if dummies is None:
        return values
    weighted = dummies * sqrt_w[:, None]
    return values - weighted @ np.linalg.lstsq(weighted, values, rcond=None)[0]


def _multiway_meat(design_t, residual, clusters):
    k = design_t.shape[1]
    meat = np.zeros((k, k))
    for size in range(1, len(clusters) + 1):
        for subset in itertools.combinations(clusters, size):
            codes = np.unique(np.column_stack(subset), axis=0, return_inverse=True)[1].reshape(-1)
            scores = np.zeros((codes.max() + 1, k))
            np.add.at(scores, codes, design_t * residual[:, None])
            meat += (1 if size % 2 else -1) * scores.T @ scores
    return meat


def brute_force_statistics(x, y, dummies, sqrt_w, clusters, boot, matrix, rhs, impose_null, factor, v):
    """Each draw a full weighted least-squares fit with the dummies projected out; t* (q = 1) or W* (q > 1)."""
    x_t, y_t = _partial_out(x, dummies, sqrt_w), _partial_out(y, dummies, sqrt_w)
    inverse = np.linalg.inv(x_t.T @ x_t)
    beta = inverse @ x_t.T @ y_t
    if impose_null:
        middle = matrix @ inverse @ matrix.T
        beta_dgp = beta - inverse @ matrix.T @ np.linalg.solve(middle, matrix @ beta - rhs)
    else:
        beta_dgp = beta
    # Residuals of the restricted fit with the fixed effects, in the original units: y - X beta~ - D alpha~.
    residual = _partial_out(y - x @ beta_dgp, dummies, sqrt_w) / sqrt_w
    fitted = y - residual
    out = []
    for b in range(v.shape[1]):
        y_star = fitted + v[boot, b] * residual
        y_star_t = _partial_out(y_star, dummies, sqrt_w)
        beta_star = inverse @ x_t.T @ y_star_t
        u_star = y_star_t - x_t @ beta_star
        variance = factor * matrix @ inverse @ _multiway_meat(x_t, u_star, clusters) @ inverse @ matrix.T
        gap = matrix @ (beta_star - beta_dgp)
        if matrix.shape[0] == 1:
            out.append(gap[0] / np.sqrt(variance[0, 0]) if variance[0, 0] > 0 else np.nan)
        else:
            positive = np.linalg.eigvalsh(variance)[0] > 0
            out.append(gap @ np.linalg.solve(variance, gap) if positive else np.nan)
    return np.array(out)


CASES = {
    "two FE, one crossing": ("y ~ x1 + x2 | firm + year", ["state"], None, None, ["x1 = 0.3"]),
    "two FE, both crossing": ("y ~ x1 + x2 | state + year", ["firm"], None, None, ["x1 - x2 = 0.5"]),
    "three FE, bootstrap by region": ("y ~ x1 + x2 | firm + year + region", ["state"], "region", None,
                                      ["x1 + 2*x2 = 0"]),
    "two-way clusters": ("y ~ x1 + x2 | firm + year", ["state", "year"], None, None, ["x2 = -0.1"]),
    "two-way, weights": ("y ~ x1 + x2 | year", ["state", "region"], None, "w", ["x1 = 0.4"]),
    "three-way clusters": ("y ~ x1 + x2", ["state", "year", "region"], None, None, ["x1 = 0"]),
    "weights, crossing FE": ("y ~ x1 + x2 | year + firm", ["state"], None, "w", ["x1 + x2 = 0.2"]),
    "joint": ("y ~ x1 + x2 | firm + year", ["state"], None, None, ["x1 = 0.4", "x2 = -0.2"]),
    "joint, two-way, weights": ("y ~ x1 + x2 | year", ["state", "region"], None, "w", ["x1 = 0.4", "x2 = 0"]),
    "heteroskedastic, FE": ("y ~ x1 + x2 | firm + year", [], None, None, ["x1 = 0.4"]),
    "heteroskedastic, weights, joint": ("y ~ x1 + x2 | year", [], None, "w", ["x1 = 0.4", "x2 = -0.2"]),
}  # fmt: skip


@pytest.mark.parametrize("impose_null", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_fast_bootstrap_equals_the_full_regression_per_draw(case: str, impose_null: bool) -> None:
    formula, cluster, bootcluster, weights, hypothesis = CASES[case]
    frame = _panel(4, 240)
    design = design_from_formula(frame, formula, cluster, bootcluster, weights)
    restrictions = parse_restrictions(hypothesis, design.names)
    weights_type = "webb" if impose_null else "mammen"
    options = BootstrapOptions(restrictions=restrictions, reps=30, weights_type=weights_type, seed=5,
                               impose_null=impose_null, conf_int=False, fixef_tol=1e-13,
                               drop_singletons=False)  # the brute force keeps every row  # fmt: skip
    ours = wild_cluster_bootstrap(np, device_data(design, np), options)
    fe_names = formula.partition("|")[2].replace(" ", "").split("+") if "|" in formula else []
    clusters = [frame[name].to_numpy() for name in cluster] or [np.arange(len(frame))]
    if cluster:
        boot_column = bootcluster or min(cluster, key=lambda name: frame[name].nunique())
        boot = pd.factorize(frame[boot_column], sort=True)[0]
    else:
        boot = np.arange(len(frame))
    v = draw_weights(np, weights_type, 5, int(boot.max()) + 1, 0, 30)
    sqrt_w = np.sqrt(frame[weights].to_numpy()) if weights else np.ones(len(frame))
    brute = brute_force_statistics(design.x, design.y, _dummies(frame, [n for n in fe_names if n]), sqrt_w,
                                   clusters, boot, restrictions.matrix, restrictions.rhs, impose_null,
                                   ours.ssc_factor, v)  # fmt: skip
    np.testing.assert_allclose(ours.t_boot, brute, rtol=1e-8, atol=1e-10)
    if len(hypothesis) > 1:
        assert ours.wald_stat > 0 and 0 <= ours.p_values["wald"] <= 1


def test_enumerated_p_values_equal_the_brute_force_exactly() -> None:
    """Two-way clusters (the bootstrap by the 6 regions: 2^6 draws), a linear restriction, crossing FE."""
    frame = _panel(6, 240)
    design = design_from_formula(frame, "y ~ x1 + x2 | firm + year", ["region", "state"])
    restrictions = parse_restrictions(["x1 - 2*x2 = 0.3"], design.names)
    options = BootstrapOptions(restrictions=restrictions, reps=999, fixef_tol=1e-13, conf_int=False,
                               drop_singletons=False)
    ours = wild_cluster_bootstrap(np, device_data(design, np), options)
    assert ours.enumerated and ours.reps_used == 2**6 and ours.bootcluster_name == "region"
    v = enumerated_weights(np, 6, 0, 2**6)
    boot = pd.factorize(frame["region"], sort=True)[0]
    brute = brute_force_statistics(design.x, design.y, _dummies(frame, ["firm", "year"]), np.ones(len(frame)),
                                   [frame["region"].to_numpy(), frame["state"].to_numpy()], boot,
                                   restrictions.matrix, restrictions.rhs, True, ours.ssc_factor, v)  # fmt: skip
    np.testing.assert_allclose(ours.t_boot, brute, rtol=1e-8, atol=1e-10)
    expected = p_values_from(np, brute, ours.t_stat)
    for name, value in expected.items():
        assert ours.p_values[name] == float(value)


def test_a_restriction_on_one_coefficient_is_the_param_test() -> None:
    frame = _panel(7)
    design = design_from_formula(frame, "y ~ x1 + x2 | firm + year", ["state"])
    data = device_data(design, np)
    by_param = wild_cluster_bootstrap(np, data, BootstrapOptions(param=1, r=-0.1, reps=499, seed=2))
    by_text = wild_cluster_bootstrap(
        np, data, BootstrapOptions(restrictions=parse_restrictions(["x2 = -0.1"], design.names), reps=499, seed=2)
    )
    np.testing.assert_array_equal(by_param.t_boot, by_text.t_boot)
    assert by_param.conf_int == by_text.conf_int and by_param.p_values == by_text.p_values
    # 2 x2 = -0.2 is the same hypothesis: the same t and the same draws' t*.
    scaled = wild_cluster_bootstrap(
        np, data, BootstrapOptions(restrictions=parse_restrictions(["2*x2 = -0.2"], design.names), reps=499, seed=2)
    )
    np.testing.assert_allclose(scaled.t_boot, by_param.t_boot, rtol=1e-10)
    assert scaled.t_stat == pytest.approx(by_param.t_stat, rel=1e-12)


def test_confidence_interval_of_a_combination_inverts_the_test() -> None:
    """Multiway, crossing fixed effects: at the bounds of the interval for x1 - x2 the p-value crosses the level."""
    frame = _panel(8)
    design = design_from_formula(frame, "y ~ x1 + x2 | firm + year", ["state", "region"])
    data = device_data(design, np)
    outcome = wild_cluster_bootstrap(
        np, data, BootstrapOptions(restrictions=parse_restrictions(["x1 - x2 = 0"], design.names), reps=999, seed=4)
    )
    lower, upper = outcome.conf_int
    assert lower < outcome.estimate < upper
    for bound, side in ((lower, -1), (upper, 1)):
        p = {}
        for offset in (-1e-7, 1e-7):
            r = bound + offset * outcome.se
            tested = parse_restrictions([f"x1 - x2 = {r!r}"], design.names)
            p[offset] = wild_cluster_bootstrap(
                np, data, BootstrapOptions(restrictions=tested, reps=999, seed=4, conf_int=False)
            ).p_values["two-tailed"]
        inside, outside = (p[1e-7], p[-1e-7]) if side < 0 else (p[-1e-7], p[1e-7])
        assert outside <= 0.05 < inside


def test_the_wald_statistic_has_its_closed_form() -> None:
    frame = _panel(9)
    design = design_from_formula(frame, "y ~ x1 + x2 | firm + year", ["state"])
    data = device_data(design, np)
    single = wild_cluster_bootstrap(
        np, data, BootstrapOptions(restrictions=parse_restrictions(["x1 = 0.3"], design.names), reps=299, seed=8)
    )
    # Two restrictions, the second holding exactly at the estimate: W = g1^2 [V^-1]_11 with g1 = beta1 - 0.3,
    # at least t^2 = g1^2 / V_11.
    pair = wild_cluster_bootstrap(np, data, BootstrapOptions(
        restrictions=parse_restrictions(["x1 = 0.3", f"x2 = {float(single.coefficients[1])!r}"], design.names),
        reps=299, seed=8))  # fmt: skip
    gap = single.coefficients[0] - 0.3
    assert pair.wald_stat == pytest.approx(gap**2 * np.linalg.inv(single.covariance)[0, 0], rel=1e-8)
    assert pair.wald_stat >= single.t_stat**2 * (1 - 1e-12)
    assert pair.p_values_analytic["wald"] > 0 and pair.conf_int is None


def test_a_rank_deficient_restriction_and_negative_weights_are_refused() -> None:
    frame = _panel(10, 120)
    design = design_from_formula(frame, "y ~ x1 + x2", ["state"])
    with pytest.raises(ValueError, match="linearly dependent"):
        parse_restrictions(["x1 + x2 = 0", "2*x1 + 2*x2 = 1"], design.names)
    for bad, says in ((-1.0, "negative"), (np.nan, "NaN")):
        broken = frame.assign(w=frame["w"].where(frame.index != 3, bad))
        with pytest.raises(ValueError, match=rf"^weights: column 'w' has 1 .*{says}"):
            design_from_formula(broken, "y ~ x1 + x2", ["state"], weights="w")


def test_zero_weights_drop_their_rows() -> None:
    frame = _panel(11, 200)
    zero = frame.assign(w=frame["w"].where(frame.index >= 10, 0.0))
    ours, _ = _fit(zero, "y ~ x1 + x2 | year", ["state"], BootstrapOptions(param=0, reps=9, conf_int=False), "w")
    dropped, _ = _fit(zero.iloc[10:], "y ~ x1 + x2 | year", ["state"],
                      BootstrapOptions(param=0, reps=9, conf_int=False), "w")  # fmt: skip
    assert ours.n_obs == 190 and ours.n_singletons == 0
    np.testing.assert_allclose(ours.standard_errors, dropped.standard_errors, rtol=1e-12)


def test_the_job_reports_the_model_it_fitted() -> None:
    from kernels.context import local_context, run_kind
    from kernels.registry import get_kind

    frame = _panel(12)
    frame.loc[frame.index[:2], "firm"] = [900, 901]  # two singleton firms
    params = {"dataset_id": "panel", "formula": "y ~ x1 + x2 | firm + year", "cluster": ["state", "region"],
              "hypothesis": ["x1 = 0.4", "x2 = -0.2"], "weights": "w", "reps": 199, "seed": 3}  # fmt: skip
    result = run_kind(get_kind("crve_bootstrap"), params, local_context("cpu", {"dataset_id": frame}))
    reference = _pyfixest(frame, "y ~ x1 + x2 | firm + year", {"CRV1": "state+region"}, "w")
    assert result["test"] == "wald" and result["vcov_type"] == "CRV1" and result["p_val_type"] == "wald"
    assert result["n_obs"] == reference._N and result["n_singletons"] == 2
    assert [c["name"] for c in result["clusters"]] == ["state", "region"]
    assert result["bootcluster"] == "region"  # 6 regions < 9 states
    assert [(e["name"], e["nested_in_cluster"]) for e in result["fixed_effects"]] == [("firm", True), ("year", False)]
    assert result["restrictions"][1] == {"text": "x2 = -0.2", "coefficients": {"x2": 1.0}, "rhs": -0.2,
                                         "estimate": pytest.approx(reference.coef()["x2"], rel=1e-9)}  # fmt: skip
    se = {row["name"]: row["se"] for row in result["coefficients"]}
    assert se["x1"] == pytest.approx(reference.se()["x1"], rel=1e-8)
    assert result["estimate"] is None and result["wald_stat"] > 0 and 0 <= result["p_value"] <= 1
    assert result["weights"] == "w" and result["demeaning"]["method"] == "direct"
    heteroskedastic = run_kind(get_kind("crve_bootstrap"), {**params, "cluster": None, "hypothesis": "x1 = 0.4"},
                               local_context("cpu", {"dataset_id": frame}))  # fmt: skip
    assert heteroskedastic["vcov_type"] == "HC1" and heteroskedastic["bootcluster"] is None
    assert heteroskedastic["n_boot_clusters"] == heteroskedastic["n_obs"] and heteroskedastic["conf_int"] is not None


# ------------------------------------------------------------------------------------ multiple testing


def test_romano_wolf_and_westfall_young_equal_pyfixest_on_the_same_draws() -> None:
    from pyfixest.estimation.post_estimation.multcomp import _get_rwolf_pval, _get_wyoung_pval
    from scipy import stats

    from kernels.crve.inference import romano_wolf_p_values, westfall_young_p_values

    rs = np.random.default_rng(13)
    for size in (2, 5, 20):
        t_stats = rs.normal(size=size) * 2.5
        t_boot = rs.normal(size=(999, size)) @ np.linalg.cholesky(0.5 * np.eye(size) + 0.5).T  # correlated
        np.testing.assert_array_equal(romano_wolf_p_values(t_stats, t_boot), _get_rwolf_pval(t_stats, t_boot))
        p, p_boot = 2 * stats.t.sf(np.abs(t_stats), 30), 2 * stats.t.sf(np.abs(t_boot), 30)
        np.testing.assert_array_equal(westfall_young_p_values(p, p_boot), _get_wyoung_pval(p, p_boot))


def test_a_family_shares_the_draws_of_its_members_tested_alone() -> None:
    from kernels.context import local_context, run_kind
    from kernels.crve.inference import romano_wolf_p_values
    from kernels.registry import get_kind

    frame = _panel(14)
    family = ["x1 = 0.4", "x2 = 0", "x1 + x2 = 0.2"]
    params = {"dataset_id": "panel", "formula": "y ~ x1 + x2 | firm + year", "cluster": ["state", "region"],
              "family": family, "reps": 399, "seed": 5}  # fmt: skip
    progress = local_context("cpu", {"dataset_id": frame})
    result = run_kind(get_kind("crve_bootstrap"), params, progress)
    assert result["test"] == "family" and result["family_method"] == "romano-wolf"
    design = design_from_formula(frame, "y ~ x1 + x2 | firm + year", ["state", "region"])
    alone = [
        wild_cluster_bootstrap(np, device_data(design, np), BootstrapOptions(
            restrictions=parse_restrictions([text], design.names), reps=399, seed=5, conf_int=False))
        for text in family
    ]  # fmt: skip
    for row, single in zip(result["family"], alone, strict=True):
        assert row["t_stat"] == pytest.approx(single.t_stat, rel=1e-12)
        assert row["p_value"] == single.p_values["two-tailed"]
    expected = romano_wolf_p_values(np.array([s.t_stat for s in alone]), np.column_stack([s.t_boot for s in alone]))
    assert [row["p_value_adjusted"] for row in result["family"]] == pytest.approx(list(expected), abs=1e-15)
    assert result["p_value"] == pytest.approx(expected.min())
    for row in result["family"]:  # stepdown adjustment never lowers a p-value below the single test's (+1)/(B+1)
        assert row["p_value_adjusted"] >= row["p_value"] * 399 / 400 - 1e-12
    wy = run_kind(get_kind("crve_bootstrap"), {**params, "family_method": "westfall-young"},
                  local_context("cpu", {"dataset_id": frame}))  # fmt: skip
    assert wy["family_method"] == "westfall-young" and 0 < wy["p_value"] <= 1


# ----------------------------------------------------------------------------------------------------- CRV3


@pytest.mark.parametrize(
    ("formula", "cluster"),
    [("y ~ x1 + x2", ["state"]), ("y ~ x1 + x2 | firm", ["state"]), ("y ~ x1 + x2", ["firm"]),
     ("y ~ x1 + x2", ["state", "year"])],
)  # fmt: skip
def test_crv3_is_pyfixest_jackknife_with_the_mnw_factor(formula, cluster) -> None:
    frame = _panel(15)
    ours, design = _fit(frame, formula, cluster, BootstrapOptions(param=0, reps=9, conf_int=False, crv3=True))
    reference = _pyfixest(frame, formula, {"CRV3": "+".join(cluster)})
    # pyfixest scales by its CRV1 factor G/(G-1) (N-1)/(N-k) (G the fewest clusters); MNW 2023 and we by
    # (G_d - 1)/G_d per dimension: the same per dimension only for one-way clusters.
    if len(cluster) == 1:
        g, n, k = frame[cluster[0]].nunique(), ours.n_obs, ours.n_params_ssc
        ratio = ((g - 1) / g) / (g / (g - 1) * (n - 1) / (n - k))
        columns = [design.names.index(name) for name in reference.coef().index]
        np.testing.assert_allclose(np.sqrt(np.diag(ours.covariance_crv3))[columns],
                                   reference.se().values * np.sqrt(ratio), rtol=1e-10)  # fmt: skip
    else:  # two-way: against a leave-one-cluster-out refit by least squares per dimension
        x, y = design.x, design.y
        beta = np.linalg.lstsq(x, y, rcond=None)[0]
        total = np.zeros((x.shape[1], x.shape[1]))
        for columns_set, sign in ((["state"], 1), (["year"], 1), (["state", "year"], -1)):
            codes = np.unique(frame[columns_set].to_numpy(), axis=0, return_inverse=True)[1].reshape(-1)
            jack = []
            for g in range(codes.max() + 1):
                keep = codes != g
                jack.append(np.linalg.lstsq(x[keep], y[keep], rcond=None)[0] - beta)
            jack = np.array(jack)
            total += sign * (len(jack) - 1) / len(jack) * jack.T @ jack
        np.testing.assert_allclose(ours.covariance_crv3, total, rtol=1e-8, atol=1e-14)


def test_crv3_refuses_what_it_cannot_do_exactly() -> None:
    frame = _panel(16)
    with pytest.raises(ValueError, match="crosses the clusters"):
        _fit(frame, "y ~ x1 + x2 | year", ["state"], BootstrapOptions(param=0, reps=9, crv3=True))
    lonely = frame.assign(x2=np.where(frame["state"] == 3, frame["x2"], 0.0))  # x2 varies in one state only
    with pytest.raises(ValueError, match="without it X'X is singular"):
        _fit(lonely, "y ~ x1 + x2", ["state"], BootstrapOptions(param=0, reps=9, crv3=True))


# --------------------------------------------------------------------- MNW (2023) jackknife bootstrap variants


@pytest.mark.parametrize("impose_null", [True, False])
@pytest.mark.parametrize("bootstrap_type", ["13", "31", "33"])
def test_jackknife_variants_equal_the_brute_force_with_coarser_bootstrap_clusters(bootstrap_type: str,
                                                                                  impose_null: bool) -> None:
    """Bootstrap clusters coarser than the variance clusters, a nested fixed effect, a linear restriction: each
    draw re-fitted (jackknife residuals by least squares without each bootstrap cluster; CRV3 by least squares
    without each variance cluster)."""
    frame = _panel(18, 240)
    design = design_from_formula(frame, "y ~ x1 + x2", ["firm"], bootcluster="state")
    restrictions = parse_restrictions(["x1 - x2 = 0.5"], design.names)
    options = BootstrapOptions(restrictions=restrictions, reps=25, seed=2, weights_type="webb", conf_int=False,
                               bootstrap_type=bootstrap_type, impose_null=impose_null)  # fmt: skip
    ours = wild_cluster_bootstrap(np, device_data(design, np), options)
    x, y, row, r = design.x, design.y, restrictions.matrix[0], restrictions.rhs[0]
    firm = pd.factorize(frame["firm"], sort=True)[0]
    state = pd.factorize(frame["state"], sort=True)[0]
    v = draw_weights(np, "webb", 2, state.max() + 1, 0, 25)

    def restricted_fit(keep):  # the bootstrap DGP's fit: restricted under WCR
        xk, yk = x[keep], y[keep]
        inverse = np.linalg.inv(xk.T @ xk)
        beta = inverse @ xk.T @ yk
        return beta - inverse @ row * (row @ beta - r) / (row @ inverse @ row) if impose_null else beta

    if bootstrap_type[0] == "3":
        fitted = np.empty(len(y))
        for h in range(state.max() + 1):
            rows_h = state == h
            fitted[rows_h] = x[rows_h] @ restricted_fit(~rows_h)
        residual = y - fitted
    else:
        residual = y - x @ restricted_fit(np.ones(len(y), bool))
    centre = x @ restricted_fit(np.ones(len(y), bool))
    inverse = np.linalg.inv(x.T @ x)
    brute = []
    for b in range(25):
        y_star = centre + v[state, b] * residual
        beta_star = inverse @ x.T @ y_star
        if bootstrap_type[1] == "3":
            jack = [np.linalg.lstsq(x[firm != g], y_star[firm != g], rcond=None)[0] @ row - beta_star @ row
                    for g in range(firm.max() + 1)]  # fmt: skip
            variance = (len(jack) - 1) / len(jack) * np.sum(np.square(jack))
        else:
            scores = np.zeros((firm.max() + 1, 3))
            np.add.at(scores, firm, x * (y_star - x @ beta_star)[:, None])
            variance = ours.ssc_factor * row @ inverse @ scores.T @ scores @ inverse @ row
        brute.append((row @ beta_star - row @ restricted_fit(np.ones(len(y), bool))) / np.sqrt(variance))
    np.testing.assert_allclose(ours.t_boot, brute, rtol=1e-8)


# ------------------------------------------------------------------------------------------------------ IV


def _iv_frame(seed: int, n_obs: int = 400, g_count: int = 12) -> pd.DataFrame:
    rs = np.random.default_rng(seed)
    g = rs.integers(0, g_count, n_obs)
    g[:g_count] = np.arange(g_count)
    z = rs.normal(size=(n_obs, 2)) + rs.normal(size=(g_count, 2))[g]
    w1 = rs.normal(size=n_obs)
    u = rs.normal(size=n_obs) + rs.normal(size=g_count)[g]
    y2 = 0.6 * z[:, 0] + 0.4 * z[:, 1] + 0.3 * w1 + 0.5 * u + rs.normal(size=n_obs)
    y = 1 + 0.5 * y2 + 0.2 * w1 + u + rs.normal(size=g_count)[g]
    return pd.DataFrame({"y": y, "y2": y2, "z1": z[:, 0], "z2": z[:, 1], "w1": w1, "g": g, "fe": g * 3 + (g % 3)})


def _iv_data(seed: int) -> Any:
    """The IV frame as the arrays of kernels.crve.iv (exogenous: the intercept and w1; instruments z1, z2)."""
    from kernels.crve.iv import IvData

    frame = _iv_frame(seed)
    return IvData(y=frame["y"].to_numpy(), exogenous=np.column_stack([np.ones(len(frame)), frame["w1"]]),
                  endogenous=frame["y2"].to_numpy(), instruments=frame[["z1", "z2"]].to_numpy(),
                  cluster=frame["g"].to_numpy(), n_clusters=12)  # fmt: skip


@pytest.mark.parametrize("formula", ["y ~ w1 | y2 ~ z1 + z2", "y ~ w1 | fe | y2 ~ z1 + z2"])
def test_iv_estimates_and_first_stage_f_equal_pyfixest(formula: str) -> None:
    from kernels.context import local_context, run_kind
    from kernels.registry import get_kind

    frame = _iv_frame(19)
    result = run_kind(get_kind("crve_bootstrap"), {"dataset_id": "d", "formula": formula, "cluster": "g",
                                                    "param": "y2", "r": 0.5, "reps": 199},
                      local_context("cpu", {"dataset_id": frame}))  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = pyfixest.feols(formula, data=frame, vcov={"CRV1": "g"})
        reference.IV_Diag()
    ours = {row["name"]: row for row in result["coefficients"]}
    for name, value in reference.coef().items():
        assert ours[name]["estimate"] == pytest.approx(value, rel=1e-10)
        assert ours[name]["se"] == pytest.approx(reference.se()[name], rel=1e-9)
    assert result["iv"]["first_stage_f"] == pytest.approx(reference._f_stat_1st_stage, rel=1e-9)
    assert result["bootstrap_variant"] == "WRE" and result["se"] == pytest.approx(reference.se()["y2"], rel=1e-9)


def test_wre_bootstrap_equals_a_two_stage_fit_per_draw() -> None:
    from kernels.crve.iv import iv_wre_bootstrap

    data, r = _iv_data(20), 0.45
    g, exogenous, instruments, y, y2 = data.cluster, data.exogenous, data.instruments, data.y, data.endogenous
    ours = iv_wre_bootstrap(np, data, r=r, reps=40, weights_type="mammen", seed=8)
    w = np.column_stack([exogenous, instruments])
    gamma = np.linalg.lstsq(exogenous, y - r * y2, rcond=None)[0]
    u1 = y - r * y2 - exogenous @ gamma  # restricted structural residuals
    pi = np.linalg.lstsq(np.column_stack([w, u1]), y2, rcond=None)[0][: w.shape[1]]  # efficient reduced form
    u2 = y2 - w @ pi
    v = draw_weights(np, "mammen", 8, 12, 0, 40)
    projection = w @ np.linalg.solve(w.T @ w, w.T)
    brute = []
    for b in range(40):
        y2_star = w @ pi + v[g, b] * u2
        y_star = r * y2_star + exogenous @ gamma + v[g, b] * u1
        x_star = np.column_stack([exogenous, y2_star])
        x_hat = projection @ x_star
        inverse = np.linalg.inv(x_hat.T @ x_star)
        beta = inverse @ x_hat.T @ y_star
        scores = np.zeros((12, 3))
        np.add.at(scores, g, x_hat * (y_star - x_star @ beta)[:, None])
        variance = ours.ssc_factor * (inverse @ scores.T @ scores @ inverse.T)[2, 2]
        brute.append((beta[2] - r) / np.sqrt(variance))
    np.testing.assert_allclose(ours.t_boot, brute, rtol=1e-9)


def test_iv_bad_input_is_refused_with_the_cause() -> None:
    from pydantic import ValidationError

    from kernels.context import local_context, run_kind
    from kernels.crve.spec import BootstrapParams
    from kernels.registry import get_kind

    base = {"dataset_id": "d", "cluster": "g", "reps": 99}
    with pytest.raises(ValidationError, match="tests its endogenous coefficient"):
        BootstrapParams(**base, formula="y ~ w1 | y2 ~ z1", param="w1")
    with pytest.raises(ValidationError, match="cannot instrument itself"):
        BootstrapParams(**base, formula="y ~ w1 | y2 ~ y2", param="y2")
    with pytest.raises(ValidationError, match="weights"):
        BootstrapParams(**base, formula="y ~ w1 | y2 ~ z1", param="y2", weights="w1")
    frame = _iv_frame(21).assign(z3=lambda f: 2 * f["w1"])  # an instrument collinear with an exogenous regressor
    with pytest.raises(ValueError, match="collinear"):
        run_kind(get_kind("crve_bootstrap"), {**base, "formula": "y ~ w1 | y2 ~ z3", "param": "y2"},
                 local_context("cpu", {"dataset_id": frame}))  # fmt: skip


def test_anderson_rubin_is_the_instruments_wald_test_in_the_reduced_form() -> None:
    import statsmodels.api as sm

    from kernels.crve.iv import anderson_rubin

    data, r = _iv_data(22), 0.3
    g, exogenous, instruments, y, y2 = data.cluster, data.exogenous, data.instruments, data.y, data.endogenous
    ours = anderson_rubin(np, data, r, reps=999, weights_type="rademacher", seed=1)
    # statsmodels: OLS of y - r y2 on [Z, X2] with the cluster-robust covariance, Wald of the instruments = 0.
    fit = sm.OLS(y - r * y2, np.column_stack([exogenous, instruments])).fit(cov_type="cluster",
                                                                          cov_kwds={"groups": g})  # fmt: skip
    gap = fit.params[2:]
    assert ours["statistic"] == pytest.approx(gap @ np.linalg.solve(fit.cov_params()[2:, 2:], gap), rel=1e-9)
    assert 0 <= ours["p_value"] <= 1
    # At the true-ish value the test accepts more than far from it.
    far = anderson_rubin(np, data, 3.0, reps=999, weights_type="rademacher", seed=1)
    assert far["statistic"] > ours["statistic"] and far["p_value"] <= ours["p_value"]
