"""Krusell-Smith numerics on NumPy: interpolation, grids, transitions, the Euler step, panel and ALM."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import rng
from kernels.ks import alm as alm_mod
from kernels.ks.grids import Grids, K_coordinate, k_coordinate
from kernels.ks.interp import catmull_rom_weights, interpolate
from kernels.ks.model import (
    Calibration,
    aggregate_transition,
    conditional_employment,
    implied_unemployment,
    interest_rate,
    labour_income_factor,
    validate_calibration,
    wage,
)
from kernels.ks.policy import (
    EulerProblem,
    PolicySettings,
    device_prices,
    euler_consumption,
    euler_residuals,
    euler_update,
    initial_policy,
    next_aggregate_capital,
    solve_policy,
)
from kernels.ks.simulate import aggregate_path, initial_employment, simulate_panel
from kernels.ks.solve import SolveSettings, solve

# ALM of a reference solve at the standard KS-sim settings (100 x 4 grid, N = 10,000, T = 1,100, bilinear,
# seed 1: `GPUEST_DEVICE=cpu python bench/ks_bench.py solve --interpolation bilinear`, bench/RESULTS.md):
# ln K' = 0.14422 + 0.96036 ln K (bad), 0.15479 + 0.95888 ln K (good); the H100 gives the same to 1e-13.
REFERENCE_ALM = np.array([0.144219, 0.960361, 0.154786, 0.958879])


# ---------------------------------------------------------------- interpolation and grids


def test_catmull_rom_weights_match_algorithm_a2() -> None:
    a = np.linspace(0.0, 1.0, 11)
    w = np.stack(catmull_rom_weights(np, a))
    np.testing.assert_allclose(w.sum(axis=0), 1.0, rtol=0, atol=1e-15)
    # Catmull-Rom as a cubic Hermite spline with central-difference slopes, written independently
    h00, h10, h01, h11 = 2 * a**3 - 3 * a**2 + 1, a**3 - 2 * a**2 + a, -2 * a**3 + 3 * a**2, a**3 - a**2
    expected = np.stack([-0.5 * h10, h00 - 0.5 * h11, h01 + 0.5 * h10, 0.5 * h11])
    np.testing.assert_allclose(w, expected, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(np.stack(catmull_rom_weights(np, np.array([0.0]))).ravel(), [0, 1, 0, 0])


def _table_from(function, grids: Grids) -> np.ndarray:
    s = np.arange(grids.k_size)[:, None].astype(float)
    t = np.arange(grids.K_size)[None, :].astype(float)
    return np.broadcast_to(function(s, t), (grids.k_size, grids.K_size)).reshape(1, grids.k_size, grids.K_size)


def _points_at_coordinates(grids: Grids, s: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k, K) whose grid coordinates are (s, t): the inverse of the grid maps."""
    k = grids.k_min + (grids.k_max - grids.k_min) * (s / (grids.k_size - 1)) ** grids.spacing_power
    capital = grids.K_min + (grids.K_max - grids.K_min) * t / (grids.K_size - 1)
    return k, capital


def test_catmull_rom_exact_on_quadratics_in_the_interior() -> None:
    grids = Grids(k_size=30, K_size=8)

    def quadratic(s: np.ndarray, t: np.ndarray) -> np.ndarray:
        return 1.0 + 2.0 * s - 3.0 * t + 0.25 * s**2 + 0.5 * s * t - 0.75 * t**2

    table = _table_from(quadratic, grids)
    gen = np.random.default_rng(5)
    # interior: the 4 x 4 stencil stays inside the grid (cells 1 .. size - 3)
    s = gen.uniform(1.0, grids.k_size - 2.0, 500)
    t = gen.uniform(1.0, grids.K_size - 2.0, 500)
    k, capital = _points_at_coordinates(grids, s, t)
    got = interpolate(np, table, np.zeros(500, dtype=np.int64), k, capital, grids, "catmull_rom")
    np.testing.assert_allclose(got, quadratic(s, t), rtol=1e-11, atol=1e-9)


def test_catmull_rom_is_not_exact_on_cubics_but_third_order() -> None:
    # The issue asks for exactness on cubics; Catmull-Rom has quadratic precision only. Counter-example:
    # x^3 on nodes -1, 0, 1, 2 evaluated at 0.25 gives 0.109375, not 0.015625.
    w = catmull_rom_weights(np, np.array(0.25))
    value = sum(wi * node**3 for wi, node in zip(w, (-1.0, 0.0, 1.0, 2.0), strict=True))
    assert value == pytest.approx(0.109375, abs=1e-15)
    # Third order: the interior error on a smooth function falls ~8x per halving of the spacing.
    errors = []
    for size in (20, 40, 80):
        grids = Grids(k_size=size, K_size=size, spacing_power=1.0, k_min=0.0, k_max=1.0, K_min=1.0, K_max=2.0)
        table = np.sin(3.0 * grids.k)[:, None] * np.cos(2.0 * grids.K)[None, :]
        x = np.linspace(0.1, 0.9, 301)
        capital = np.full_like(x, 1.37)
        got = interpolate(np, table[None], np.zeros(x.size, dtype=np.int64), x, capital, grids, "catmull_rom")
        errors.append(np.max(np.abs(got - np.sin(3.0 * x) * np.cos(2.0 * capital))))
    ratios = np.array(errors[:-1]) / np.array(errors[1:])
    assert np.all(ratios > 6.0), (errors, ratios)


def test_catmull_rom_error_on_cubics_is_exactly_the_third_order_term() -> None:
    """Quadratics are reproduced, so on a cubic only the s^3 term errs, and by exactly a(1 - a)(1 - 2a) per unit
    coefficient at fraction a of a cell (derived by hand from the weights: -w0 + w2 + 8 w3 - a^3 on the nodes
    -1, 0, 1, 2), the same in every interior cell. So Catmull-Rom is not exact on cubics (the issue's wish):
    the error vanishes only at nodes and cell midpoints and peaks at sqrt(3)/18 h^3; it is third order."""

    def cubic_error(a: np.ndarray) -> np.ndarray:
        return a * (1.0 - a) * (1.0 - 2.0 * a)

    # (1) in the grid coordinates of the paper's mapping (polynomial k grid, uniform K grid), tensor form:
    # alpha s^3 + beta t^3 plus terms of degree <= 2 in each coordinate (reproduced exactly)
    grids = Grids(k_size=30, K_size=9)
    alpha, beta = 0.02, -0.3

    def cubic(s: np.ndarray, t: np.ndarray) -> np.ndarray:
        return alpha * s**3 + beta * t**3 + 0.5 * s**2 * t - 0.25 * s * t**2 + 0.01 * s**2 * t**2 + 2.0 * s - t + 3.0

    table = _table_from(cubic, grids)
    gen = np.random.default_rng(15)
    s = gen.uniform(1.0, grids.k_size - 2.0, 400)
    t = gen.uniform(1.0, grids.K_size - 2.0, 400)
    k, capital = _points_at_coordinates(grids, s, t)
    got = interpolate(np, table, np.zeros(400, dtype=np.int64), k, capital, grids, "catmull_rom")
    error = got - cubic(s, t)
    np.testing.assert_allclose(error, alpha * cubic_error(s % 1.0) + beta * cubic_error(t % 1.0), rtol=0, atol=1e-8)
    assert np.abs(error).max() > 0.02  # far from exact: (|alpha| + |beta|) sqrt(3)/18 = 0.031 at worst

    # (2) physical k on a uniform grid: the error of k^3 is h^3 a (1 - a)(1 - 2a), so it falls exactly 8-fold
    # per halving of h; the worst point of a cell, a = 1/2 - sqrt(3)/6, gives sqrt(3)/18 h^3
    worst = 0.5 - np.sqrt(3.0) / 6.0
    maxima = []
    for cells in (20, 40, 80):
        grids = Grids(k_size=cells + 1, K_size=4, spacing_power=1.0, k_min=0.0, k_max=1.0, K_min=1.0, K_max=2.0)
        h = 1.0 / cells
        table = np.broadcast_to((grids.k**3)[:, None], (cells + 1, 4))[None]
        a = np.concatenate([gen.uniform(0.0, 1.0, 200), [worst]])
        x = (np.concatenate([gen.integers(1, cells - 1, 200), [cells // 2]]) + a) * h
        got = interpolate(np, table, np.zeros(x.size, dtype=np.int64), x, np.full(x.size, 1.5), grids, "catmull_rom")
        np.testing.assert_allclose(got - x**3, h**3 * cubic_error(a), rtol=0, atol=1e-13)
        maxima.append(np.abs(got - x**3).max())
        assert maxima[-1] == pytest.approx(np.sqrt(3.0) / 18.0 * h**3, rel=1e-6)
    np.testing.assert_allclose(np.array(maxima[:-1]) / np.array(maxima[1:]), 8.0, rtol=1e-5)


def test_bilinear_exact_on_bilinear_functions_in_physical_coordinates() -> None:
    grids = Grids(k_size=50, K_size=6)

    def bilinear(k: np.ndarray, capital: np.ndarray) -> np.ndarray:
        return 3.0 + 0.5 * k - 0.2 * capital + 0.01 * k * capital

    table = bilinear(grids.k[:, None], grids.K[None, :])[None]
    gen = np.random.default_rng(6)
    k = gen.uniform(grids.k_min, grids.k_max, 1000) * gen.uniform(0, 1, 1000) ** 6  # many points at small k
    capital = gen.uniform(grids.K_min, grids.K_max, 1000)
    got = interpolate(np, table, np.zeros(1000, dtype=np.int64), k, capital, grids, "bilinear")
    np.testing.assert_allclose(got, bilinear(k, capital), rtol=1e-12, atol=1e-10)


def test_grid_mapping_puts_nodes_on_integers() -> None:
    grids = Grids(k_size=100, K_size=4)
    np.testing.assert_allclose(k_coordinate(np, grids, grids.k), np.arange(100), rtol=0, atol=1e-9)
    np.testing.assert_allclose(K_coordinate(np, grids, grids.K), np.arange(4), rtol=0, atol=1e-12)
    # MMV's construction of the same grid (linspace(0, 0.5)^7 normalised)
    x = np.linspace(0, 0.5, 100)
    np.testing.assert_allclose(grids.k, 1000.0 * x**7 / x[-1] ** 7, rtol=1e-12, atol=1e-12)
    # clamped outside the grid, monotone inside
    assert k_coordinate(np, grids, np.array(2000.0)) == 99.0
    assert K_coordinate(np, grids, np.array(10.0)) == 0.0
    assert np.all(np.diff(k_coordinate(np, grids, np.linspace(0, 1000, 5000))) > 0)


def test_plane_selection_per_point() -> None:
    grids = Grids(k_size=100, K_size=4)
    table = np.stack([np.full((100, 4), float(p)) for p in range(4)])
    plane = np.array([3, 0, 2, 1, 3])
    for method in ("bilinear", "catmull_rom"):
        got = interpolate(np, table, plane, np.full(5, 37.0), 40.0, grids, method)
        np.testing.assert_allclose(got, plane, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- the economy


def test_transition_matrices_are_consistent() -> None:
    cal = Calibration()
    validate_calibration(cal)
    np.testing.assert_allclose(cal.transition_matrix.sum(axis=1), 1.0, atol=1e-9)
    np.testing.assert_allclose(aggregate_transition(cal), [[0.875, 0.125], [0.125, 0.875]], atol=1e-9)
    emp = conditional_employment(cal)
    assert np.all((emp >= 0) & (emp <= 1))
    # each (a, a') pair maps u_a to u_{a'} (to the 6 printed decimals of the published matrix)
    np.testing.assert_allclose(implied_unemployment(cal), np.array([[0.10, 0.04], [0.10, 0.04]]), atol=5e-6)
    # durations: unemployment spells last 2.5 quarters in bad times (p_uu = 0.6) and 1.5 in good (1/3)
    assert 1.0 - emp[1, 1, 0] == pytest.approx(0.291667 / 0.875, abs=1e-12)
    assert 1.0 - emp[0, 0, 0] == pytest.approx(0.6, abs=1e-12)


def test_ocr_error_matrix_is_rejected() -> None:
    rows = [list(r) for r in Calibration().transition]
    rows[3][3] = 0.859604  # the value printed in the paper's Table B.1 (an OCR error)
    with pytest.raises(ValueError, match="sum to one"):
        validate_calibration(Calibration(transition=tuple(tuple(r) for r in rows)))


def test_prices_and_budget() -> None:
    cal = Calibration()
    assert cal.labour[0] == pytest.approx(1.0)
    # the tax balances the budget: employed pay tau w l_bar (1 - u) = mu u w received by the unemployed
    for a in range(2):
        u = cal.unemployment[a]
        paid = cal.tax[a] * cal.l_bar * (1.0 - u)
        assert paid == pytest.approx(cal.mu * u, rel=1e-14)
        assert labour_income_factor(cal, a, 1) == pytest.approx((1 - cal.tax[a]) * cal.l_bar)
    capital = 40.0
    r, w = interest_rate(np, cal, capital, 1), wage(np, cal, capital, 1)
    output = cal.productivity[1] * capital**cal.alpha * cal.labour[1] ** (1 - cal.alpha)
    assert r * capital + w * cal.labour[1] == pytest.approx(output, rel=1e-14)  # Euler's theorem


# ---------------------------------------------------------------- policy step


def _scalar_bilinear(grids: Grids, table: np.ndarray, k: float, capital: float) -> float:
    """Independent bilinear reference: np.interp along k at the two bracketing K nodes, then along K."""
    j = min(int(np.searchsorted(grids.K, capital, side="right")) - 1, grids.K_size - 2)
    j = max(j, 0)
    low = np.interp(k, grids.k, table[:, j])
    high = np.interp(k, grids.k, table[:, j + 1])
    w = (capital - grids.K[j]) / (grids.K[j + 1] - grids.K[j])
    return float((1 - w) * low + w * high)


def test_euler_consumption_matches_a_scalar_reference() -> None:
    cal, grids = Calibration(), Grids()
    problem = EulerProblem(np, cal, grids, "bilinear")
    gen = np.random.default_rng(7)
    policy = initial_policy(np, grids) * (1.0 + 0.02 * gen.uniform(size=(2, 2, 100, 4)))
    alm = np.array([0.1, 0.97, 0.12, 0.967])
    capital_next, r_next, w_next = device_prices(np, problem, alm)
    table = policy.reshape(4, 100, 4)
    c_euler = euler_consumption(np, problem, table, policy, capital_next, r_next, w_next)
    p = cal.transition_matrix
    for a, eps, i, j in [(0, 0, 10, 0), (0, 1, 55, 2), (1, 0, 70, 3), (1, 1, 99, 1), (1, 1, 0, 0)]:
        k_choice = policy[a, eps, i, j]
        capital_n = float(np.clip(np.exp(alm[2 * a] + alm[2 * a + 1] * np.log(grids.K[j])), 30, 50))
        expectation = 0.0
        for a_n in range(2):
            r = cal.alpha * cal.productivity[a_n] * (capital_n / cal.labour[a_n]) ** (cal.alpha - 1)
            w = (1 - cal.alpha) * cal.productivity[a_n] * (capital_n / cal.labour[a_n]) ** cal.alpha
            for e_n in range(2):
                k2 = _scalar_bilinear(grids, table[2 * a_n + e_n], k_choice, capital_n)
                y = (1 - cal.tax[a_n]) * cal.l_bar * w if e_n else cal.mu * w
                c_next = max(r * k_choice + y + (1 - cal.delta) * k_choice - k2, 1e-10)
                expectation += p[2 * a + eps, 2 * a_n + e_n] * (1 - cal.delta + r) / c_next
        assert c_euler[a, eps, i, j] == pytest.approx(1.0 / (cal.beta * expectation), rel=1e-12)
    assert next_aggregate_capital(cal, grids, alm, np.array([40.0])).shape == (2, 1)


def test_policy_fixed_point_and_small_euler_residuals() -> None:
    cal, grids = Calibration(), Grids()
    problem = EulerProblem(np, cal, grids, "bilinear")
    settings = PolicySettings(tolerance=1e-9)
    solved = solve_policy(np, problem, REFERENCE_ALM, initial_policy(np, grids), settings)
    assert solved.converged
    # a further undamped step moves the policy by (change / damping) at most
    _, change = euler_update(np, problem, solved.policy, device_prices(np, problem, REFERENCE_ALM), 1.0)
    assert change < 1e-8
    # borrowing constraint respected, policy increasing in k, the unemployed poor hit the constraint
    assert solved.policy.min() >= 0.0
    assert np.all(np.diff(solved.policy, axis=2) >= -1e-12)
    assert solved.policy[0, 0, 0, 0] == 0.0
    # Euler residuals off the grid (mid-cells, where the interpolation error shows): small, unit-free
    k_mid = 0.5 * (grids.k[40:79] + grids.k[41:80])  # k in about [2, 250], the ergodic range
    residuals = euler_residuals(np, problem, solved.policy, REFERENCE_ALM, k_mid)
    finite = residuals[np.isfinite(residuals)]
    assert finite.size > 0.9 * residuals.size
    assert np.max(np.abs(finite)) < 5e-3
    assert np.mean(np.abs(finite)) < 5e-4
    # and on the grid they vanish up to the tolerance
    on_grid = euler_residuals(np, problem, solved.policy, REFERENCE_ALM, grids.k[20:90])
    assert np.nanmax(np.abs(on_grid)) < 1e-8


def test_convergence_checked_every_n_steps_changes_when_it_stops_not_the_arithmetic() -> None:
    """check_every = 10 (the default, also on the GPU: one read-back per 10 steps) stops at the first multiple
    of 10 at or after the step where check_every = 1 stops, and its policy is exactly that of running that many
    steps unconditionally: the cadence moves the stopping step only."""
    cal, grids = Calibration(), Grids()
    problem = EulerProblem(np, cal, grids, "bilinear")
    start = initial_policy(np, grids)
    tol = 3e-4
    every = solve_policy(np, problem, REFERENCE_ALM, start, PolicySettings(tolerance=tol, check_every=1))
    tenth = solve_policy(np, problem, REFERENCE_ALM, start, PolicySettings(tolerance=tol, check_every=10))
    assert every.converged and tenth.converged
    assert every.iterations % 10 != 0  # else this case would not tell the two cadences apart (802 steps)
    assert tenth.iterations == 10 * -(-every.iterations // 10)
    assert tenth.max_change <= every.max_change <= tol
    forced = solve_policy(np, problem, REFERENCE_ALM, start,
                          PolicySettings(tolerance=0.0, max_iterations=tenth.iterations, check_every=1))
    assert not forced.converged and forced.iterations == tenth.iterations
    np.testing.assert_array_equal(tenth.policy, forced.policy)
    # the extra steps only move the policy towards its fixed point, by less than the tolerance
    assert np.max(np.abs(tenth.policy - every.policy)) < 10 * tol
    with pytest.raises(ValueError, match="check_every"):
        PolicySettings(check_every=0)


# ---------------------------------------------------------------- panel simulation


def test_employment_follows_the_aggregate_state() -> None:
    cal, grids = Calibration(), Grids()
    n, periods, seed = 40_000, 60, 11
    a_path = aggregate_path(cal, seed, periods + 1)
    assert set(np.unique(a_path)) == {0, 1}
    employed = initial_employment(np, cal, seed, n, int(a_path[0]))
    k = np.full(n, 40.0)
    policy = initial_policy(np, grids)
    rates = []
    for t in range(periods):
        # one period per call, each on its own Philox stream (within a call the period indexes the draws)
        result = simulate_panel(np, cal, grids, "bilinear", policy, k, employed, a_path[t:t + 2], seed, 100 + t)
        employed, k = result.employed, result.k
        rates.append(1.0 - employed.mean())
    target = cal.unemployment[a_path[1:periods + 1]]
    sd = np.sqrt(target * (1 - target) / n)
    assert np.all(np.abs(np.array(rates) - target) < 5 * sd + 2e-5)


def test_identity_policy_keeps_mean_capital_and_draws_are_reproducible() -> None:
    cal, grids = Calibration(), Grids()
    n, seed = 5_000, 3
    table = np.broadcast_to(grids.k[None, None, :, None], (2, 2, 100, 4)).copy()  # k' = k, exact for bilinear
    k0 = rng.uniform(np, seed, 99, np.arange(n, dtype=np.uint64)) * 80.0
    e0 = initial_employment(np, cal, seed, n, 0)
    a_path = aggregate_path(cal, seed, 31)
    first = simulate_panel(np, cal, grids, "bilinear", table, k0, e0, a_path, seed)
    np.testing.assert_allclose(first.capital_path, np.clip(k0.mean(), 30, 50), rtol=1e-13)
    np.testing.assert_allclose(first.k, k0, rtol=1e-13)
    again = simulate_panel(np, cal, grids, "bilinear", table, k0, e0, a_path, seed)
    np.testing.assert_array_equal(first.employed, again.employed)
    other = simulate_panel(np, cal, grids, "bilinear", table, k0, e0, a_path, seed + 1)
    assert not np.array_equal(first.employed, other.employed)


# ---------------------------------------------------------------- ALM regression and accuracy


def test_alm_regression_matches_lstsq() -> None:
    gen = np.random.default_rng(8)
    periods = 400
    a_path = gen.integers(0, 2, periods + 1)
    log_k = np.empty(periods)
    log_k[0] = np.log(40.0)
    for t in range(periods - 1):
        b0, b1 = (0.14, 0.96) if a_path[t] == 0 else (0.155, 0.959)
        log_k[t + 1] = b0 + b1 * log_k[t] + 0.01 * gen.normal()
    bad, good = alm_mod.regress_alm(np.exp(log_k), a_path, burn_in=50)
    for state, fit in ((0, bad), (1, good)):
        rows = [t for t in range(50, periods - 1) if a_path[t] == state]
        x = np.column_stack([np.ones(len(rows)), log_k[rows]])
        y = log_k[[t + 1 for t in rows]]
        beta, ssr, _, _ = np.linalg.lstsq(x, y, rcond=None)
        assert fit.n_obs == len(rows)
        np.testing.assert_allclose([fit.intercept, fit.slope], beta, rtol=1e-9)
        assert fit.se == pytest.approx(np.sqrt(ssr[0] / (len(rows) - 2)), rel=1e-9)
        assert fit.r2 == pytest.approx(1 - ssr[0] / np.sum((y - y.mean()) ** 2), rel=1e-12)


def test_den_haan_errors_vanish_on_an_exact_alm_path() -> None:
    alm = np.array([0.144, 0.9604, 0.155, 0.9589])
    a_path = aggregate_path(Calibration(), 4, 300)
    path = alm_mod.alm_path(alm, a_path, 39.0, 300)
    max_gap, mean_gap, _ = alm_mod.den_haan_errors(path, a_path, alm)
    assert max_gap < 1e-10 and mean_gap < 1e-10
    shifted = path * 1.01
    max_gap, _, _ = alm_mod.den_haan_errors(shifted, a_path, alm)
    assert max_gap > 0.5


# ---------------------------------------------------------------- a small full solve


@pytest.mark.parametrize(("den_haan_periods", "periods", "message"),
                         [(1, 300, "den_haan_periods must be 0"), (9, 300, "den_haan_periods must be 0"),
                          (None, 8, "burn_in must leave at least 10 periods")])
def test_solve_refuses_a_den_haan_test_shorter_than_ten_periods_before_solving(
    den_haan_periods: int | None, periods: int, message: str
) -> None:
    # the params model refuses these at submission (test_ks_job); the kernel asserts them before any work
    settings = SolveSettings(n_agents=1_000, periods=periods, burn_in=0, den_haan_periods=den_haan_periods)
    calls: list[tuple[float, str]] = []
    with pytest.raises(AssertionError, match=message):
        solve(np, Calibration(), Grids(), settings, report=lambda f, s: calls.append((f, s)))
    assert calls == []  # refused up front, not after the outer loop


def test_small_solve_is_self_consistent_near_the_reference() -> None:
    # Warm start at the reference ALM (a cold start from ln K' = ln K takes ~35 outer iterations and minutes
    # on NumPy: bench/ks_bench.py runs it). A smaller panel on other shocks moves the fixed point by its
    # sampling error only, and the solve must get there and stay self-consistent.
    settings = SolveSettings(n_agents=3_000, periods=500, burn_in=100, tolerance=3e-4, interpolation="bilinear",
                             seed=2, policy=PolicySettings(tolerance=1e-6), den_haan_periods=400,
                             initial_alm=tuple(REFERENCE_ALM))
    solution = solve(np, Calibration(), Grids(), settings)
    assert solution.converged and solution.last_change < 3e-4
    assert solution.iterations > 1
    assert min(r.r2 for r in solution.regressions) > 0.9995  # 0.9999 needs the full N = 10,000, T = 1,100
    # compare the forecasts, not the (strongly correlated) intercept and slope: ln K' at K = 36 .. 44
    log_k = np.log(np.linspace(36.0, 44.0, 5))
    for state in range(2):
        got = solution.alm[2 * state] + solution.alm[2 * state + 1] * log_k
        ref = REFERENCE_ALM[2 * state] + REFERENCE_ALM[2 * state + 1] * log_k
        np.testing.assert_allclose(got, ref, atol=2e-3)
    fixed = solution.alm[[0, 2]] / (1 - solution.alm[[1, 3]])
    assert 3.5 < fixed[0] < fixed[1] < 3.9  # steady states: good above bad, K near 40
    assert solution.den_haan_max is not None and solution.den_haan_max < 2.0
