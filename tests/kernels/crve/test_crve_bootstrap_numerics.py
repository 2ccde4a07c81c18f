"""The fast-and-wild bootstrap against wildboottest (enumerated draws), statsmodels and a brute-force bootstrap."""

from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm
from wildboottest.wildboottest import WildboottestCL

from kernels.crve.bootstrap import (
    BootstrapData,
    BootstrapOptions,
    p_values_from,
    pair_statistics,
    wild_cluster_bootstrap,
)
from kernels.crve.weights import draw_weights, enumerated_weights


def _clustered_sample(seed: int, n_obs: int, n_clusters: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rs = np.random.default_rng(seed)
    cluster = rs.integers(0, n_clusters, n_obs)
    cluster[:n_clusters] = np.arange(n_clusters)  # every cluster present
    x = np.column_stack([np.ones(n_obs), rs.normal(size=(n_obs, k - 1)) + rs.normal(size=(n_clusters, k - 1))[cluster]])
    y = x @ np.linspace(1.0, -0.5, k) + rs.normal(size=n_obs) + rs.normal(size=n_clusters)[cluster]
    return x, y, cluster


def _wildboottest(x, y, cluster, j, r, impose_null):
    """wildboottest tests beta_j = 0 only; beta_j = r on y is beta_j = 0 on y - r x_j (same t and t*)."""
    restriction = np.zeros(x.shape[1])
    restriction[j] = 1.0
    boot = WildboottestCL(X=x, Y=y - r * x[:, j], cluster=cluster, R=restriction, B=99_999, seed=1, parallel=False)
    boot.get_scores(bootstrap_type="11", impose_null=impose_null)
    boot.get_weights("rademacher")
    assert boot.full_enumeration
    boot.get_numer()
    boot.get_denom()
    boot.get_tboot()
    boot.get_vcov()
    boot.get_tstat()
    return float(np.ravel(boot.t_stat)[0]), np.asarray(boot.t_boot, dtype=float)


@pytest.mark.parametrize("impose_null", [True, False])
@pytest.mark.parametrize("r", [0.0, 0.3])
def test_enumerated_bootstrap_matches_wildboottest(impose_null: bool, r: float) -> None:
    x, y, cluster = _clustered_sample(1, 400, 9, 4)
    t_ref, t_boot_ref = _wildboottest(x, y, cluster, 2, r, impose_null)
    for p_val_type in ("two-tailed", "equal-tailed", ">", "<"):
        options = BootstrapOptions(param=2, r=r, reps=9_999, impose_null=impose_null, p_val_type=p_val_type)
        ours = wild_cluster_bootstrap(np, BootstrapData(x, y, cluster, 9), options)
        assert ours.enumerated and ours.reps_used == 2**9
        assert ours.t_stat == pytest.approx(t_ref, rel=1e-10)
        # The same 2^G draws: the same bootstrap distribution, draw set for draw set.
        np.testing.assert_allclose(np.sort(ours.t_boot), np.sort(t_boot_ref), rtol=1e-9, atol=1e-12)
        # Their p-value conventions on their own draws, ties resolved as ours (|t*| = |t| up to rounding is a
        # tie: wildboottest leaves the WCR draws v = +-1, where t* = +-t exactly, to rounding noise).
        reference = p_values_from(np, t_boot_ref, t_ref)[p_val_type]
        assert abs(ours.p_values[p_val_type] - reference) < 1e-8
        raw = {
            "two-tailed": np.mean(np.abs(t_ref) < np.abs(t_boot_ref)),
            "equal-tailed": 2 * min(np.mean(t_ref < t_boot_ref), np.mean(t_ref > t_boot_ref)),
            ">": np.mean(t_ref < t_boot_ref),
            "<": np.mean(t_ref > t_boot_ref),
        }[p_val_type]
        ties = np.sum(np.isclose(np.abs(t_boot_ref), abs(t_ref), rtol=1e-9, atol=0))
        assert abs(ours.p_values[p_val_type] - raw) <= 2 * ties / ours.reps_used + 1e-12


@pytest.mark.parametrize("ssc", [True, False])
def test_crv1_standard_errors_match_statsmodels(ssc: bool) -> None:
    x, y, cluster = _clustered_sample(2, 500, 23, 5)
    outcome = wild_cluster_bootstrap(np, BootstrapData(x, y, cluster, 23), BootstrapOptions(param=1, reps=99, ssc=ssc))
    fit = sm.OLS(y, x).fit(
        cov_type="cluster", cov_kwds={"groups": cluster, "use_correction": ssc, "df_correction": ssc}
    )
    np.testing.assert_allclose(outcome.coefficients, fit.params, rtol=1e-12)
    np.testing.assert_allclose(outcome.standard_errors, fit.bse, rtol=1e-10)


def test_confidence_interval_bounds_are_where_the_p_value_crosses_the_level() -> None:
    x, y, cluster = _clustered_sample(3, 300, 10, 3)
    outcome = wild_cluster_bootstrap(np, BootstrapData(x, y, cluster, 10), BootstrapOptions(param=1, reps=9_999))
    lower, upper = outcome.conf_int
    assert lower < outcome.estimate < upper
    for bound in (lower, upper):
        delta = 1e-6 * outcome.se
        p_near = []
        for r in (bound - delta, bound + delta):
            t_ref, t_boot_ref = _wildboottest(x, y, cluster, 1, r, True)  # an independent bootstrap at each r
            p_near.append(p_values_from(np, t_boot_ref, t_ref)["two-tailed"])
        inside = p_near[1] if bound == lower else p_near[0]
        outside = p_near[0] if bound == lower else p_near[1]
        assert outside <= 0.05 < inside


def _brute_force_t_boot(x, y, cluster, bootcluster, dummies, j, r, impose_null, factor, v):
    """Each draw as a full regression on the N rows (fixed effects as dummy columns), CRV1 by cluster."""
    design = x if dummies is None else np.column_stack([x, dummies])
    if impose_null:
        others = np.delete(design, j, axis=1)
        target = y - r * design[:, j]
        residual = target - others @ np.linalg.lstsq(others, target, rcond=None)[0]
        centre = r
    else:
        coef = np.linalg.lstsq(design, y, rcond=None)[0]
        residual = y - design @ coef
        centre = coef[j]
    fitted = y - residual
    inverse = np.linalg.pinv(design.T @ design)
    out = []
    for b in range(v.shape[1]):
        y_star = fitted + v[bootcluster, b] * residual
        beta = inverse @ (design.T @ y_star)
        scores = np.zeros((cluster.max() + 1, design.shape[1]))
        np.add.at(scores, cluster, design * (y_star - design @ beta)[:, None])
        variance = factor * (inverse @ scores.T @ scores @ inverse)[j, j]
        out.append((beta[j] - centre) / np.sqrt(variance))
    return np.array(out)


@pytest.mark.parametrize(
    ("weights_type", "impose_null", "boot_level", "fe_kind"),
    [
        ("webb", True, "same", None),
        ("mammen", False, "same", None),
        ("norm", True, "coarser", None),
        ("rademacher", True, "finer", None),
        ("webb", True, "same", "nested"),
        ("rademacher", True, "same", "crossing"),
        ("norm", False, "coarser", "crossing"),
        ("mammen", True, "finer", "crossing"),
    ],
)
def test_fast_algorithm_equals_brute_force_bootstrap(weights_type, impose_null, boot_level, fe_kind) -> None:
    rs = np.random.default_rng(4)
    n_obs, g_count = 240, 12
    x_all, y, cluster = _clustered_sample(5, n_obs, g_count, 4)
    bootcluster, h_count = None, g_count
    if boot_level == "coarser":
        bootcluster, h_count = cluster // 3, 4
    elif boot_level == "finer":
        bootcluster = cluster * 2 + rs.integers(0, 2, n_obs)
        bootcluster[: 2 * g_count] = np.arange(2 * g_count)
        cluster[: 2 * g_count] = np.arange(2 * g_count) // 2
        h_count = 2 * g_count
    fe = dummies = n_fe = None
    x = x_all
    if fe_kind == "nested":
        fe = cluster * 2 + rs.integers(0, 2, n_obs)
        fe[: 2 * g_count] = np.arange(2 * g_count)
        cluster[: 2 * g_count] = np.arange(2 * g_count) // 2
        n_fe = 2 * g_count
    elif fe_kind == "crossing":
        fe = rs.integers(0, 7, n_obs)
        fe[:7] = np.arange(7)
        n_fe = 7
    if fe is not None:
        x = x_all[:, 1:]  # the intercept is absorbed
        y = y + rs.normal(size=n_fe)[fe] * 3.0
        dummies = (fe[:, None] == np.arange(n_fe)).astype(float)
    j, r = 1, 0.2
    options = BootstrapOptions(param=j, r=r, reps=40, weights_type=weights_type, impose_null=impose_null, seed=9)
    data = BootstrapData(x, y, cluster, g_count, bootcluster, None if bootcluster is None else h_count, fe, n_fe)
    ours = wild_cluster_bootstrap(np, data, options)
    v = draw_weights(np, weights_type, 9, h_count, 0, 40)
    brute = _brute_force_t_boot(
        x, y, cluster, cluster if bootcluster is None else bootcluster, dummies, j, r, impose_null, ours.ssc_factor, v
    )
    np.testing.assert_allclose(ours.t_boot, brute, rtol=1e-9, atol=1e-12)  # t* = 0 draws: rounding
    if fe_kind == "nested":
        assert ours.fe_nested and ours.n_params_ssc == x.shape[1]
    if fe_kind == "crossing":
        assert not ours.fe_nested and ours.n_params_ssc == x.shape[1] + n_fe


def test_chunked_draws_equal_one_pass() -> None:
    x, y, cluster = _clustered_sample(6, 300, 15, 3)
    data = BootstrapData(x, y, cluster, 15)
    whole = wild_cluster_bootstrap(np, data, BootstrapOptions(param=1, reps=999, seed=4))
    chunked = wild_cluster_bootstrap(np, data, BootstrapOptions(param=1, reps=999, seed=4, draw_chunk=97))
    # Same draws; only the BLAS blocking (summation order) differs between chunk shapes.
    np.testing.assert_allclose(whole.t_boot, chunked.t_boot, rtol=1e-13)
    assert whole.p_values == chunked.p_values
    np.testing.assert_allclose(whole.conf_int, chunked.conf_int, rtol=1e-10)


def test_weights_have_mean_zero_and_unit_variance() -> None:
    for weights_type in ("rademacher", "webb", "mammen", "norm"):
        v = draw_weights(np, weights_type, 3, 50, 0, 4000)
        assert abs(v.mean()) < 0.01 and abs(v.var() - 1.0) < 0.02
        if weights_type == "mammen":
            assert abs((v**3).mean() - 1.0) < 0.05  # Mammen's third moment is one
    signs = enumerated_weights(np, 4, 0, 16)
    assert len({tuple(column) for column in signs.T}) == 16


def test_bad_input_is_refused_with_a_reason() -> None:
    x, y, cluster = _clustered_sample(7, 100, 5, 3)
    with pytest.raises(ValueError, match="single cluster"):
        wild_cluster_bootstrap(np, BootstrapData(x, y, np.zeros(100, dtype=np.int64), 1), BootstrapOptions(param=1))
    collinear = np.column_stack([x, x[:, 1] * 2.0])
    with pytest.raises(ValueError, match="collinear"):
        wild_cluster_bootstrap(np, BootstrapData(collinear, y, cluster, 5), BootstrapOptions(param=1))
    with pytest.raises(ValueError, match="observations"):
        wild_cluster_bootstrap(np, BootstrapData(x[:5], y[:5], cluster[:5] % 2, 2), BootstrapOptions(param=1))


@pytest.mark.parametrize(("n_obs", "n_groups", "shuffle"), [(6000, 12, True), (6000, 12, False), (900, 150, True)])
def test_pair_statistics_paths_equal_per_group_products(n_obs: int, n_groups: int, shuffle: bool) -> None:
    # (6000, 12): one BLAS product per group over sorted rows; (900, 150): a bincount per entry.
    rs = np.random.default_rng(11)
    x, y = rs.normal(size=(n_obs, 4)), rs.normal(size=n_obs)
    codes = np.sort(rs.integers(0, n_groups - 1, n_obs))  # the last group is empty
    if shuffle:
        codes = rs.permutation(codes)
    xtx, xty = pair_statistics(np, x, y, codes, n_groups)
    for group in range(n_groups):
        rows = codes == group
        np.testing.assert_allclose(xtx[group], x[rows].T @ x[rows], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(xty[group], x[rows].T @ y[rows], rtol=1e-12, atol=1e-12)
