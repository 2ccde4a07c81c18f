"""Policy evaluation and value iteration against closed forms, simulation and each other."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.dualcontrol.bellman import ArrayBellman
from kernels.dualcontrol.grid import interpolate, make_state_grid
from kernels.dualcontrol.model import ModelParams, inert_value, myopic_policy
from kernels.dualcontrol.solve import SolveSettings, level_shapes, solve

MODEL = ModelParams(alpha=0.3, gamma=0.6, sigma_eps=0.8, delta=0.9, omega=0.5, xbar=1.0, ubar=0.2)


def _inert_gap(
    half_width: float, spacing: float, tolerance: float = 1e-10, interpolation: str = "trilinear"
) -> tuple[np.ndarray, np.ndarray]:
    """Solved minus closed-form inert value at |x - xbar| <= 1, uniform x grid of the given spacing."""
    n = round(2 * half_width / spacing) + 1
    grid = make_state_grid(
        (MODEL.xbar - half_width, MODEL.xbar + half_width, n), (-1.0, 1.0, 3), (0.5, 1.0, 3), MODEL.xbar, 0.0
    )
    settings = SolveSettings("inert", tolerance, quadrature_nodes=16, interpolation=interpolation)  # type: ignore[arg-type]
    solution = solve(MODEL, grid, settings, np)
    assert solution.converged
    x = grid.x.nodes()
    inner = np.abs(x - MODEL.xbar) <= 1.0
    # u = 0 leaves beliefs alone: the value must not depend on mu or Sigma
    np.testing.assert_allclose(solution.value, solution.value[:, :1, :1] * np.ones((1, 3, 3)), rtol=1e-13)
    return x[inner], solution.value[inner, 1, 1] - inert_value(MODEL, x[inner])


def test_residual_interpolation_solves_the_inert_policy_exactly_on_any_cuboid() -> None:
    """Interpolating V - V0 (and adding V0 back) reproduces the quadratic V0 between nodes and beyond the
    cuboid, so the inert fixed point is the closed form up to the iteration tolerance, whatever the spacing and
    however narrow the cuboid (the two errors the trilinear tests below measure are gone)."""
    for half_width, spacing in ((12.0, 0.5), (1.5, 0.5), (3.0, 1.5)):
        _, gap = _inert_gap(half_width, spacing, interpolation="residual")
        assert np.abs(gap).max() < 1e-8


def test_quadratic_interpolation_removes_the_inert_interpolation_floor() -> None:
    """The quadratic correction in x reproduces V0 between nodes, so on a wide cuboid the inert fixed point is
    the closed form up to the truncation error (constant beyond the cuboid), far below the trilinear floor."""
    coef_a = MODEL.inert_coefficients()[0]
    floor = MODEL.delta / (1 - MODEL.delta) * coef_a / 6 * 0.5**2
    _, gap = _inert_gap(12.0, 0.5, interpolation="quadratic")
    assert np.abs(gap).max() < 1e-3 * floor


def test_inert_value_converges_to_the_closed_form() -> None:
    """Linear interpolation of the quadratic V0 overstates it by A (x - x_i)(x_{i+1} - x), about A h^2 / 6 on
    average over the wide predictive spread; the recursion accumulates delta/(1-delta) of that. So with the
    cuboid wide, the gap is that floor, and it falls fourfold when h halves: the iteration tends to V0."""
    coef_a = MODEL.inert_coefficients()[0]
    floor = MODEL.delta / (1 - MODEL.delta) * coef_a / 6
    _, gap_coarse = _inert_gap(12.0, 0.5)
    _, gap_fine = _inert_gap(12.0, 0.25)
    np.testing.assert_allclose(gap_coarse, floor * 0.5**2, rtol=0.03)
    np.testing.assert_allclose(gap_fine, floor * 0.25**2, rtol=0.03)
    assert np.abs(gap_fine).max() < 0.3 * np.abs(gap_coarse).min()


def test_inert_gap_shrinks_as_the_cuboid_grows_at_fixed_spacing() -> None:
    """Paper footnote 7: the truncation (constant beyond the cuboid) error at interior points vanishes as the
    cuboid grows; what remains is the interpolation floor of the previous test."""
    coef_a = MODEL.inert_coefficients()[0]
    floor = MODEL.delta / (1 - MODEL.delta) * coef_a * 0.5**2 / 6
    deviations = [np.abs(_inert_gap(half, 0.5)[1] - floor).max() for half in (1.5, 3.0, 6.0)]
    assert deviations[0] > 5 * deviations[1] > 5 * deviations[2]
    assert deviations[2] < 0.05 * floor  # what is left is the floor's own approximation error


def test_myopic_value_matches_a_monte_carlo_of_the_policy() -> None:
    """Independent of the grid: simulate beta ~ N(mu, Sigma), the myopic rule and Bayes updates directly."""
    grid = make_state_grid((-7.0, 9.0, 25), (-4.0, 4.0, 21), (0.02, 2.0, 12), MODEL.xbar, 1.0)
    solution = solve(MODEL, grid, SolveSettings("myopic", 1e-6, quadrature_nodes=10), np)
    assert solution.converged
    rng = np.random.default_rng(21)
    n, periods = 40_000, 200
    # relative tolerance per state: the grid's error (measured at 2.6% for the low-Sigma state, 0.5% for the
    # others on this grid, and shrinking as it is refined) dominates the Monte Carlo error (0.2%)
    for x0, mu0, s0, rel in ((1.0, 0.5, 0.5, 0.015), (1.5, -0.8, 1.5, 0.015), (0.0, 1.0, 0.25, 0.04)):
        beta = mu0 + np.sqrt(s0) * rng.standard_normal(n)
        x, mu, s, total = np.full(n, x0), np.full(n, mu0), np.full(n, s0), np.zeros(n)
        for t in range(periods):
            u = myopic_policy(MODEL, x, mu, s)
            x_next = MODEL.alpha + beta * u + MODEL.gamma * x + MODEL.sigma_eps * rng.standard_normal(n)
            total += MODEL.delta**t * ((x_next - MODEL.xbar) ** 2 + MODEL.omega * (u - MODEL.ubar) ** 2)
            s_next = 1.0 / (1.0 / s + u * u / MODEL.sigma_eps2)
            mu = s_next * (mu / s + u * (x_next - MODEL.alpha - MODEL.gamma * x) / MODEL.sigma_eps2)
            x, s = x_next, s_next
        value = interpolate(solution.value, grid, grid.node_arrays(np), *(np.array([c]) for c in (x0, mu0, s0)), np)
        assert value[0] == pytest.approx(total.mean(), rel=rel)


def test_myopic_policy_is_the_closed_form_and_minimises_the_one_period_loss() -> None:
    """Paper eq. 11 / docs/dualcontrol.md, written out here (not through ``myopic_policy``), against the solved grid:
    ``u = [omega ubar - mu (alpha + gamma x - xbar)] / (Sigma + mu^2 + omega)``; then a dense scan of the
    one-period expected loss, taken by Gauss-Hermite over the predictive N(alpha + mu u + gamma x,
    u^2 Sigma + sigma_eps^2) (exact for the quadratic loss), finds the same control; and the solved value is
    the fixed point of the policy operator with that control, so the solve used it."""
    grid = make_state_grid((-7.0, 9.0, 9), (-4.0, 4.0, 8), (0.02, 2.0, 5), MODEL.xbar, 1.0)
    tol = 1e-9
    solution = solve(MODEL, grid, SolveSettings("myopic", tol, quadrature_nodes=8), np)
    assert solution.converged
    x, mu, s = np.meshgrid(grid.x.nodes(), grid.mu.nodes(), grid.sigma.nodes(), indexing="ij")
    alpha, gamma, xbar, omega, ubar = MODEL.alpha, MODEL.gamma, MODEL.xbar, MODEL.omega, MODEL.ubar
    closed = (omega * ubar - mu * (alpha + gamma * x - xbar)) / (s + mu**2 + omega)
    assert np.ptp(closed) > 1.0  # a grid where the control varies, not a constant
    np.testing.assert_allclose(solution.policy, closed, rtol=1e-14, atol=1e-15)

    z, w = np.polynomial.hermite_e.hermegauss(5)
    w = w / w.sum()

    def expected_loss(xi: float, mui: float, si: float, u: np.ndarray) -> np.ndarray:
        x_next = (alpha + mui * u + gamma * xi)[:, None] + np.sqrt(u * u * si + MODEL.sigma_eps**2)[:, None] * z
        return ((x_next - xbar) ** 2) @ w + omega * (u - ubar) ** 2

    pick = np.random.default_rng(22).choice(closed.size, 12, replace=False)
    for flat in [0, closed.size - 1, *pick]:
        i = np.unravel_index(flat, grid.shape)
        coarse = np.linspace(-30.0, 30.0, 600_001)  # step 1e-4, wide enough for every state of this grid
        best = coarse[np.argmin(expected_loss(x[i], mu[i], s[i], coarse))]
        fine = np.linspace(best - 2e-4, best + 2e-4, 4001)  # step 1e-7
        scanned = fine[np.argmin(expected_loss(x[i], mu[i], s[i], fine))]
        assert abs(solution.policy[i] - scanned) <= 2e-7, (i, solution.policy[i], scanned)

    # T_u V = V with the closed-form control: |T_u V - V| <= (1 + delta) |V - V_u| <= 2 tol max|V|
    op = ArrayBellman(MODEL, grid, 8, np)
    scale = np.abs(solution.value).max()
    assert np.abs(op.evaluate(solution.value, closed) - solution.value).max() <= 2 * tol * scale
    # ... and not with another control (the check can fail)
    assert np.abs(op.evaluate(solution.value, closed + 0.05) - solution.value).max() > 1e3 * tol * scale


@pytest.fixture(scope="module")
def three_policies():
    grid = make_state_grid((-5.0, 7.0, 12), (-3.0, 3.0, 12), (0.05, 2.0, 8), MODEL.xbar, 1.0)
    solved = {
        policy: solve(MODEL, grid, SolveSettings(policy, tol, quadrature_nodes=8, evaluation_sweeps=10), np)
        for policy, tol in (("inert", 1e-7), ("myopic", 1e-7), ("optimal", 1e-6))
    }
    return grid, solved


def test_optimal_below_myopic_below_inert_at_interior_states(three_policies) -> None:
    _, solved = three_policies
    assert all(s.converged for s in solved.values())
    interior = (slice(2, -2), slice(2, -2), slice(1, -1))
    optimal, myopic, inert = (solved[p].value[interior] for p in ("optimal", "myopic", "inert"))
    scale = np.abs(inert).max()
    assert (optimal <= myopic + 1e-6 * scale).all()
    assert (myopic <= inert + 1e-6 * scale).all()
    # experimentation pays where the sign of beta is uncertain (mu near 0, Sigma large)
    assert (myopic - optimal).max() > 0.01 * scale


def test_optimal_value_is_a_fixed_point_of_the_bellman_operator(three_policies) -> None:
    grid, solved = three_policies
    op = ArrayBellman(MODEL, grid, 8, np)
    bellman_value, _ = op.improve(solved["optimal"].value, solved["optimal"].policy)
    scale = np.abs(bellman_value).max()
    # MacQueen-Porteus: the fixed point lies within tol * max|V| of the returned value
    assert np.abs(bellman_value - solved["optimal"].value).max() <= 2e-6 * scale


def test_acceleration_reaches_the_same_solution_as_plain_value_iteration() -> None:
    grid = make_state_grid((-4.0, 6.0, 9), (-3.0, 3.0, 9), (0.05, 2.0, 8), MODEL.xbar, 1.0)
    tol = 1e-5
    # trilinear (the default): on this 9^3 grid with 6 nodes the residual interpolant's concave kinks leave two
    # near-equal local minima of Q at one state, and runs from different starts settle on different ones (1.4e-4)
    common = {"quadrature_nodes": 6, "interpolation": "trilinear"}
    plain = solve(MODEL, grid, SolveSettings("optimal", tol, **common), np)
    modified = solve(MODEL, grid, SolveSettings("optimal", tol, evaluation_sweeps=10, **common), np)
    layered = solve(
        MODEL,
        grid,
        SolveSettings("optimal", tol, evaluation_sweeps=10, coarse_to_fine=True, coarsest_size=4, **common),
        np,
    )
    assert plain.converged and modified.converged and layered.converged
    assert [level.shape for level in layered.levels] == [(5, 5, 4), (9, 9, 8)]
    assert modified.iterations < plain.iterations / 3
    scale = np.abs(plain.value).max()
    for other in (modified, layered):
        # each is within tol * scale of the fixed point (MacQueen-Porteus)
        assert np.abs(other.value - plain.value).max() <= 2 * tol * scale


def test_sup_norm_criterion_is_stricter_than_macqueen_porteus() -> None:
    grid = make_state_grid((-5.0, 7.0, 13), (-1.0, 1.0, 3), (0.5, 1.0, 3), MODEL.xbar, 1.0)
    mqp = solve(MODEL, grid, SolveSettings("inert", 1e-8, quadrature_nodes=8), np)
    sup = solve(MODEL, grid, SolveSettings("inert", 1e-8, quadrature_nodes=8, criterion="sup_norm"), np)
    assert mqp.converged and sup.converged
    assert sup.iterations > mqp.iterations
    np.testing.assert_allclose(sup.value, mqp.value, rtol=1e-7)


def test_level_shapes_halve_each_axis_down_to_the_coarsest_size() -> None:
    assert level_shapes((256, 256, 256), True, 32) == [(32, 32, 32), (64, 64, 64), (128, 128, 128), (256,) * 3]
    assert level_shapes((100, 60, 33), True, 16) == [(50, 30, 17), (100, 60, 33)]
    assert level_shapes((64, 64, 64), False, 16) == [(64, 64, 64)]


def test_max_iterations_stops_without_convergence() -> None:
    grid = make_state_grid((-5.0, 7.0, 9), (-3.0, 3.0, 9), (0.05, 2.0, 8), MODEL.xbar, 1.0)
    solution = solve(MODEL, grid, SolveSettings("myopic", 1e-12, max_iterations=3, quadrature_nodes=4), np)
    assert not solution.converged and solution.iterations == 3 and len(solution.history) == 3


def test_levels_report_the_seconds_of_their_improvement_steps() -> None:
    """The optimal solve's improvement steps and its evaluation sweeps share each level's seconds (the split the
    benchmark reports); a fixed policy's solve has no improvement step."""
    grid = make_state_grid((-4.0, 6.0, 9), (-3.0, 3.0, 9), (0.05, 2.0, 8), MODEL.xbar, 1.0)
    optimal = solve(MODEL, grid, SolveSettings("optimal", 1e-4, quadrature_nodes=4, evaluation_sweeps=10), np)
    assert optimal.converged and optimal.levels[0].evaluation_sweeps > 0
    assert 0.0 < optimal.levels[0].improvement_seconds < optimal.levels[0].seconds
    myopic = solve(MODEL, grid, SolveSettings("myopic", 1e-6, quadrature_nodes=4), np)
    assert myopic.levels[0].improvement_seconds == 0.0
