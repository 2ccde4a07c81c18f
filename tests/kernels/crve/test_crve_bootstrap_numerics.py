"""The fast-and-wild bootstrap against wildboottest (enumerated draws), statsmodels and a brute-force bootstrap."""

from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm
from wildboottest.wildboottest import WildboottestCL

from kernels.crve.bootstrap import BootstrapData, BootstrapOptions, wild_cluster_bootstrap
from kernels.crve.inference import p_values_from
from kernels.crve.pairs import pair_statistics
from kernels.crve.weights import draw_weights, enumerated_weights


def _clustered_sample(seed: int, n_obs: int, n_clusters: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rs = np.random.default_rng(seed)
    cluster = rs.integers(0, n_clusters, n_obs)
    cluster[:n_clusters] = np.arange(n_clusters)  # every cluster present
    x = np.column_stack([np.ones(n_obs), rs.normal(size=(n_obs, k - 1)) + rs.normal(size=(n_clusters, k - 1))[cluster]])
    y = x @ np.linspace(1.0, -0.5, k) + rs.normal(size=n_obs) + rs.normal(size=n_clusters)[cluster]
    return x, y, cluster


def _wildboottest(x, y, cluster, j, r, impose_null, bootstrap_type="11"):
    """wildboottest tests beta_j = 0 only; beta_j = r on y is beta_j = 0 on y - r x_j (same t and t*)."""
    restriction = np.zeros(x.shape[1])
    restriction[j] = 1.0
    boot = WildboottestCL(X=x, Y=y - r * x[:, j], cluster=cluster, R=restriction, B=99_999, seed=1, parallel=False)
    boot.get_scores(bootstrap_type=bootstrap_type, impose_null=impose_null)
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


@pytest.mark.parametrize("bootstrap_type", ["11", "31"])
@pytest.mark.parametrize("impose_null", [True, False])
def test_jackknife_variants_equal_wildboottest_under_enumeration(bootstrap_type: str, impose_null: bool) -> None:
    """MNW 2023's variants as wildboottest names them (the first digit the DGP's residuals, the second the
    variance), on all 2^9 sign vectors: the same t and the same set of t*. (Its CRV3 t*, types 13 and 33, stops
    under NumPy 2: it assigns an array to one element of its denominators; test_crve_regressions.py checks those
    against a brute force.)"""
    x, y, cluster = _clustered_sample(17, 300, 9, 3)
    t_ref, t_boot_ref = _wildboottest(x, y, cluster, 2, 0.0, impose_null, bootstrap_type)
    options = BootstrapOptions(param=2, reps=9_999, impose_null=impose_null, bootstrap_type=bootstrap_type,
                               conf_int=False)  # fmt: skip
    ours = wild_cluster_bootstrap(np, BootstrapData(x, y, cluster, 9), options)
    assert ours.enumerated and ours.t_stat == pytest.approx(t_ref, rel=1e-10)
    np.testing.assert_allclose(np.sort(ours.t_boot), np.sort(t_boot_ref), rtol=1e-9, atol=1e-12)


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


def _bootstrap_residual(design, y, j, r, impose_null):
    """The residuals the draws perturb and the centre of t*: restricted to beta_j = r (WCR) or not (WCU)."""
    if impose_null:
        others = np.delete(design, j, axis=1)
        target = y - r * design[:, j]
        return target - others @ np.linalg.lstsq(others, target, rcond=None)[0], r
    coef = np.linalg.lstsq(design, y, rcond=None)[0]
    return y - design @ coef, coef[j]


def _brute_force_t_boot(x, y, cluster, bootcluster, dummies, j, r, impose_null, factor, v):
    """Each draw as a full regression on the N rows (fixed effects as dummy columns), CRV1 by cluster."""
    design = x if dummies is None else np.column_stack([x, dummies])
    residual, centre = _bootstrap_residual(design, y, j, r, impose_null)
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
        assert ours.fe_nested and ours.n_params_ssc == x.shape[1] + 1  # fixest: the absorbed constant counts
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


# --- The confidence interval against an independent inversion ------------------------------------------------

_REF_TIE = 1e-10  # reference's tie tolerance: far above the brute force's rounding, far below any real gap


def _brute_force_p_value(x, y, cluster, bootcluster, dummies, j, r, impose_null, v, p_val_type):
    """The bootstrap p-value at the null r with every draw a full OLS on the N rows (fixed effects as dummy
    columns), vectorised over the draws; t and t* from explicit cluster scores. The small-sample factor is
    left out: it scales t and t* alike. Exact ties (under WCR the all-ones draw has t* = t, the all-minus-ones
    t* = -t, at every r) are resolved as exact arithmetic does: not exceeding."""
    design = x if dummies is None else np.column_stack([x, dummies])
    inverse = np.linalg.inv(design.T @ design)
    onehot = (np.arange(cluster.max() + 1)[:, None] == cluster[None, :]).astype(float)
    xa = design @ inverse[:, j]  # (X'X)^-1 row j: the tested coefficient's influence
    beta = inverse @ (design.T @ y)
    t_stat = (beta[j] - r) / np.sqrt(((onehot @ (xa * (y - design @ beta))) ** 2).sum())
    residual, centre = _bootstrap_residual(design, y, j, r, impose_null)
    y_star = (y - residual)[:, None] + v[bootcluster] * residual[:, None]
    beta_star = inverse @ (design.T @ y_star)
    scores = onehot @ (xa[:, None] * (y_star - design @ beta_star))
    t_star = (beta_star[j] - centre) / np.sqrt((scores * scores).sum(axis=0))

    def share_above(boot, stat):
        return float(np.mean(boot > stat + _REF_TIE * np.maximum(np.maximum(np.abs(boot), np.abs(stat)), 1.0)))

    above, below = share_above(t_star, t_stat), share_above(-t_star, -t_stat)
    return {
        "two-tailed": share_above(np.abs(t_star), abs(t_stat)),
        "equal-tailed": 2 * min(above, below),
        ">": above,
        "<": below,
    }[p_val_type]


def _reference_interval(p_at, estimate, se, level, half_width=8.0, points=401, bisections=48):
    """{r : p(r) > level} by a scan of estimate +- half_width se, each end then bisected to the crossing;
    None where the scan's end is still inside (unbounded on that side)."""
    grid = estimate + se * np.linspace(-half_width, half_width, points)
    accepted = np.array([p_at(r) > level for r in grid])
    assert accepted.any(), "empty confidence set on the scan"
    first, last = np.flatnonzero(accepted)[[0, -1]]

    def bisect(inside, outside):
        for _ in range(bisections):
            middle = 0.5 * (inside + outside)
            if p_at(middle) > level:
                inside = middle
            else:
                outside = middle
        return 0.5 * (inside + outside)

    lower = None if first == 0 else bisect(grid[first], grid[first - 1])
    upper = None if last == points - 1 else bisect(grid[last], grid[last + 1])
    return lower, upper


@pytest.mark.parametrize(
    ("weights_type", "impose_null", "p_val_type", "sign_level", "design"),
    [
        ("rademacher", True, "two-tailed", 0.05, "plain"),  # enumerated: 2^8 draws
        ("rademacher", True, "equal-tailed", 0.10, "plain"),
        ("rademacher", False, "two-tailed", 0.05, "plain"),
        ("rademacher", False, "equal-tailed", 0.05, "plain"),
        ("webb", True, ">", 0.05, "plain"),
        ("norm", True, "<", 0.10, "plain"),
        ("mammen", True, "equal-tailed", 0.05, "plain"),
        ("mammen", False, "two-tailed", 0.10, "plain"),
        ("webb", True, "two-tailed", 0.05, "fe_bootcluster"),  # crossing FE, 4 bootstrap clusters
        ("norm", True, "equal-tailed", 0.10, "fe_bootcluster"),
        ("norm", True, ">", 0.6, "plain"),  # one-sided above 1/2: the set lies beyond the estimate
        ("mammen", True, "<", 0.7, "plain"),
        ("rademacher", True, ">", 0.55, "plain"),
        ("webb", True, "equal-tailed", 0.9, "plain"),
        ("webb", True, "two-tailed", 0.5, "plain"),
    ],
)
def test_confidence_interval_equals_an_independent_inversion(
    weights_type: str, impose_null: bool, p_val_type: str, sign_level: float, design: str
) -> None:
    g_count, reps, seed = 8, 9_999 if weights_type == "rademacher" else 199, 5
    x, y, cluster = _clustered_sample(21, 160, g_count, 3)
    bootcluster, h_count, fe, n_fe, dummies = cluster, g_count, None, None, None
    if design == "fe_bootcluster":
        rs = np.random.default_rng(3)
        fe = rs.integers(0, 5, len(y))
        fe[:5] = np.arange(5)
        n_fe, x = 5, x[:, 1:]  # the intercept is absorbed
        y = y + 2.0 * rs.normal(size=n_fe)[fe]
        dummies = (fe[:, None] == np.arange(n_fe)).astype(float)
        bootcluster, h_count = cluster // 2, 4
    options = BootstrapOptions(
        param=1, reps=reps, weights_type=weights_type, impose_null=impose_null, p_val_type=p_val_type,
        sign_level=sign_level, seed=seed,
    )  # fmt: skip
    data = BootstrapData(
        x, y, cluster, g_count, None if design == "plain" else bootcluster, None if design == "plain" else h_count,
        fe, n_fe,
    )  # fmt: skip
    ours = wild_cluster_bootstrap(np, data, options)
    assert ours.enumerated == (weights_type == "rademacher")
    v = (
        enumerated_weights(np, h_count, 0, 2**h_count)
        if ours.enumerated
        else draw_weights(np, weights_type, seed, h_count, 0, reps)
    )

    def p_at(r: float) -> float:
        return _brute_force_p_value(x, y, cluster, bootcluster, dummies, 1, r, impose_null, v, p_val_type)

    assert abs(p_at(0.0) - ours.p_values[p_val_type]) < 1e-12  # the job's p-value (at r = 0) is the reference's
    reference = _reference_interval(p_at, ours.estimate, ours.se, sign_level)
    assert (reference[0] is None) == (p_val_type == "<") and (reference[1] is None) == (p_val_type == ">")
    for mine, theirs in zip(ours.conf_int, reference, strict=True):
        if theirs is None:
            assert mine is None
        else:
            assert abs(mine - theirs) <= 1e-8 * ours.se, (mine, theirs, (mine - theirs) / ours.se)
    if p_val_type in (">", "<") and sign_level > 0.5:
        bound = ours.conf_int[0] if p_val_type == ">" else ours.conf_int[1]
        # Beyond the estimate, on the side the one-sided set lies; the p-value at the estimate is <= the level.
        assert (bound - ours.estimate) * (1 if p_val_type == ">" else -1) > 0.01 * ours.se
        assert p_at(ours.estimate) <= sign_level


def test_empty_confidence_set_is_refused_with_a_reason() -> None:
    # 3 clusters: 2^3 = 8 enumerated draws; under WCR the all-ones and all-minus-ones draws tie with +-t, so
    # p_two(r) <= 6/8 at every r and no null value is accepted at sign_level 0.8.
    x, y, cluster = _clustered_sample(8, 60, 3, 2)
    options = BootstrapOptions(param=1, reps=999, sign_level=0.8)
    with pytest.raises(ValueError, match="sign_level"):
        wild_cluster_bootstrap(np, BootstrapData(x, y, cluster, 3), options)
    options = BootstrapOptions(param=1, reps=999, sign_level=0.7)  # 6/8 > 0.7: a (short) interval
    lower, upper = wild_cluster_bootstrap(np, BootstrapData(x, y, cluster, 3), options).conf_int
    assert lower < upper


# --- The fixed effect's small-sample convention against statsmodels ---------------------------------------------


@pytest.mark.parametrize("nested", [False, True])
def test_fixed_effect_small_sample_convention_against_statsmodels_dummies(nested: bool) -> None:
    rs = np.random.default_rng(12)
    n_obs, g_count = 150, 10
    x_all, y, cluster = _clustered_sample(13, n_obs, g_count, 4)
    if nested:  # 3 levels inside each cluster
        fe = cluster * 3 + rs.integers(0, 3, n_obs)
        fe[: 3 * g_count] = np.arange(3 * g_count)
        cluster[: 3 * g_count] = np.arange(3 * g_count) // 3
        n_fe = 3 * g_count
    else:  # crossing the clusters
        fe = rs.integers(0, 12, n_obs)
        fe[:12] = np.arange(12)
        n_fe = 12
    x = x_all[:, 1:]  # the intercept is absorbed
    y = y + 2.0 * rs.normal(size=n_fe)[fe]
    dummies = (fe[:, None] == np.arange(n_fe)).astype(float)
    ours = wild_cluster_bootstrap(
        np,
        BootstrapData(x, y, cluster, g_count, fe=fe, n_fe=n_fe),
        BootstrapOptions(param=1, reps=9, conf_int=False, drop_singletons=False),  # statsmodels keeps them
    )
    # statsmodels' default cluster correction: G/(G-1) (N-1)/(N-K), K = every column, the dummies included.
    fit = sm.OLS(y, np.column_stack([x, dummies])).fit(cov_type="cluster", cov_kwds={"groups": cluster})
    k_x = x.shape[1]
    np.testing.assert_allclose(ours.coefficients, fit.params[:k_x], rtol=1e-10)
    assert ours.fe_nested == nested
    if nested:  # fixest's fixef.K = "nested": the nested levels are not counted, the constant they absorb is
        assert ours.n_params_ssc == k_x + 1
        expected = fit.bse[:k_x] * np.sqrt((n_obs - k_x - n_fe) / (n_obs - k_x - 1))
        assert not np.allclose(expected, fit.bse[:k_x], rtol=1e-3)  # the conventions differ measurably here
    else:
        assert ours.n_params_ssc == k_x + n_fe
        expected = fit.bse[:k_x]
    np.testing.assert_allclose(ours.standard_errors, expected, rtol=1e-10)
    assert ours.se == pytest.approx(expected[1], rel=1e-10)
    t_expected = fit.params[1] / expected[1]
    assert ours.t_stat == pytest.approx(t_expected, rel=1e-10)


# --- p-values against wildboottest's own, where no draw ties -----------------------------------------------------


def _min_tie_gap(t_stat: float, t_boot: np.ndarray) -> float:
    """The smallest relative distance of any t* (or |t*|) from t (|t|): no exact ties when far above rounding."""
    scale = np.maximum(np.maximum(np.abs(t_boot), abs(t_stat)), 1.0)
    return float(min((np.abs(t_boot - t_stat) / scale).min(), (np.abs(np.abs(t_boot) - abs(t_stat)) / scale).min()))


@pytest.mark.parametrize(("impose_null", "weights_type"), [(False, "rademacher"), (True, "webb"), (False, "norm")])
@pytest.mark.parametrize("r", [0.0, 0.3])
def test_p_values_equal_wildboottest_reported_p_values_without_ties(impose_null, weights_type, r) -> None:
    # WCU with all 2^G sign vectors (wildboottest enumerates them itself) has no exact ties; WCR with draws
    # that are never constant across clusters has none either: those draws are handed to wildboottest.
    g_count, j, seed = 9, 2, 6
    x, y, cluster = _clustered_sample(1, 400, g_count, 4)
    restriction = np.zeros(x.shape[1])
    restriction[j] = 1.0
    reps = 9_999 if weights_type == "rademacher" else 399
    ours_v = draw_weights(np, weights_type, seed, g_count, 0, reps)
    boot = WildboottestCL(X=x, Y=y - r * x[:, j], cluster=cluster, R=restriction, B=reps, seed=1, parallel=False)
    boot.get_scores(bootstrap_type="11", impose_null=impose_null)
    if weights_type == "rademacher":
        boot.get_weights("rademacher")
        assert boot.full_enumeration and boot.v.shape == (g_count, 2**g_count)
    else:  # our draws: wildboottest reshapes the n = G B values to (G, B) row by row
        boot.get_weights(lambda n, rng: ours_v.reshape(n))
        np.testing.assert_array_equal(boot.v, ours_v)
    boot.get_numer()
    boot.get_denom()
    boot.get_tboot()
    boot.get_vcov()
    boot.get_tstat()
    t_ref, t_boot_ref = float(np.ravel(boot.t_stat)[0]), np.ravel(boot.t_boot)
    assert _min_tie_gap(t_ref, t_boot_ref) > 1e-6  # no draw within rounding of a tie: rounding decides nothing
    options = BootstrapOptions(
        param=j, r=r, reps=reps, weights_type=weights_type, impose_null=impose_null, seed=seed, conf_int=False
    )
    ours = wild_cluster_bootstrap(np, BootstrapData(x, y, cluster, g_count), options)
    assert ours.reps_used == t_boot_ref.size
    for p_val_type in ("two-tailed", "equal-tailed", ">", "<"):
        boot.get_pvalue(pval_type=p_val_type)  # wildboottest's own reported p-value
        assert abs(ours.p_values[p_val_type] - float(boot.pvalue)) <= 1e-8, p_val_type
        assert 0.0 < float(boot.pvalue) < 1.0
