"""Expected cost-to-go and the grid-wide minimiser, against independent computations."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.interpolate import RegularGridInterpolator

from kernels import cuda
from kernels.dualcontrol import bellman
from kernels.dualcontrol.bellman import ArrayBellman, MinimiserSettings
from kernels.dualcontrol.grid import make_state_grid
from kernels.dualcontrol.minimize import INVERSE_GOLDEN_RATIO, golden_section_minimise
from kernels.dualcontrol.model import ModelParams, inert_bounds, inert_value, myopic_policy, one_period_loss
from kernels.dualcontrol.quadrature import normal_quadrature
from kernels.dualcontrol.solve import SolveSettings, solve

MODEL = ModelParams(alpha=0.3, gamma=0.6, sigma_eps=0.8, delta=0.9, omega=0.5, xbar=1.0, ubar=0.2)


def _wide_operator(nodes: int = 8, interpolation: str = "trilinear") -> ArrayBellman:
    grid = make_state_grid((-40.0, 40.0, 15), (-20.0, 20.0, 13), (0.01, 2.0, 7), MODEL.xbar, 2.0)
    return ArrayBellman(MODEL, grid, nodes, np, interpolation=interpolation)


def test_expectations_of_functions_the_interpolant_reproduces_exactly() -> None:
    """V linear in x, in mu, in Sigma, and V = x mu (multilinear, so interpolation is exact inside the cuboid).

    Posterior identities checked: E x' = alpha + mu u + gamma x; E mu' = mu (beliefs are a martingale);
    Sigma' = 1/(1/Sigma + u^2/sigma^2); E[x' mu'] = E x' mu + u Sigma (Cov(x', beta) = u Sigma).
    """
    op = _wide_operator()
    x, mu, s = (p.reshape(op.grid.shape) for p in op.points)
    rng = np.random.default_rng(11)
    u = rng.uniform(-1.0, 1.0, op.grid.shape)
    inside = (np.abs(x) <= 10.0) & (np.abs(mu) <= 5.0) & (s >= 0.5)
    loss = one_period_loss(MODEL, x, mu, s, u)
    mean = MODEL.alpha + mu * u + MODEL.gamma * x
    sigma_next = 1.0 / (1.0 / s + u * u / MODEL.sigma_eps2)
    cases = {
        "x": (x, mean),
        "mu": (mu, mu),
        "Sigma": (s, sigma_next),
        "x mu": (x * mu, mean * mu + u * s),
    }
    for name, (values, expectation) in cases.items():
        q = op.q_values(np.ascontiguousarray(values), u)
        np.testing.assert_allclose(q[inside], (loss + MODEL.delta * expectation)[inside], rtol=1e-11, err_msg=name)


def test_residual_interpolation_reproduces_the_inert_quadratic_everywhere() -> None:
    """With ``interpolation="residual"`` the interpolant of ``V0(x) + f`` (f multilinear) is exact inside the
    cuboid, and beyond it in x the quadratic continues (only the residual is held constant): the expectation
    is then the closed form E V0(x') = A (mean^2 + sd^2) + B mean + C even where x' leaves the grid."""
    grid = make_state_grid((-4.0, 6.0, 9), (-3.0, 3.0, 8), (0.05, 2.0, 5), MODEL.xbar, 1.5)
    residual = ArrayBellman(MODEL, grid, 24, np, interpolation="residual")
    plain = ArrayBellman(MODEL, grid, 24, np, interpolation="trilinear")
    x, mu, s = (p.reshape(grid.shape) for p in residual.points)
    coef_a, coef_b, coef_c = MODEL.inert_coefficients()
    u = np.random.default_rng(14).uniform(-2.0, 2.0, grid.shape)
    mean = MODEL.alpha + mu * u + MODEL.gamma * x
    variance = u * u * s + MODEL.sigma_eps2
    expected_v0 = coef_a * (mean * mean + variance) + coef_b * mean + coef_c
    loss = one_period_loss(MODEL, x, mu, s, u)
    values = np.ascontiguousarray(inert_value(MODEL, x) + 0.0 * mu)
    np.testing.assert_allclose(residual.q_values(values, u), loss + MODEL.delta * expected_v0, rtol=1e-12)
    # plain trilinear overstates the quadratic between nodes and flattens it beyond the cuboid
    assert np.abs(plain.q_values(values, u) - (loss + MODEL.delta * expected_v0)).max() > 0.1
    # a multilinear residual on top is carried exactly where the next states stay inside (a wide cuboid)
    wide = _wide_operator(interpolation="residual")
    x, mu, s = (p.reshape(wide.grid.shape) for p in wide.points)
    u = np.random.default_rng(15).uniform(-1.0, 1.0, wide.grid.shape)
    inside = (np.abs(x) <= 10.0) & (np.abs(mu) <= 5.0) & (s >= 0.5)
    mean = MODEL.alpha + mu * u + MODEL.gamma * x
    expected_v0 = coef_a * (mean * mean + u * u * s + MODEL.sigma_eps2) + coef_b * mean + coef_c
    sigma_next = 1.0 / (1.0 / s + u * u / MODEL.sigma_eps2)
    values = np.ascontiguousarray(inert_value(MODEL, x) + 0.3 * x * mu - 0.2 * s)
    reference = one_period_loss(MODEL, x, mu, s, u) + MODEL.delta * (
        expected_v0 + 0.3 * (mean * mu + u * s) - 0.2 * sigma_next
    )
    np.testing.assert_allclose(wide.q_values(values, u)[inside], reference[inside], rtol=1e-11)


def test_q_values_match_a_pointwise_reference_on_random_values() -> None:
    grid = make_state_grid((-5.0, 7.0, 11), (-3.0, 3.0, 9), (0.05, 2.0, 8), MODEL.xbar, 1.5)
    op = ArrayBellman(MODEL, grid, 12, np, interpolation="trilinear")
    rng = np.random.default_rng(12)
    values = rng.uniform(10.0, 20.0, grid.shape)
    u = rng.normal(0.0, 1.5, grid.shape)
    q = op.q_values(values, u)
    nodes = grid.node_arrays(np)
    interpolant = RegularGridInterpolator(nodes, values)
    z, w = normal_quadrature(12)
    flat = [p.reshape(-1) for p in grid.mesh(np)]
    for i in rng.choice(u.size, 60, replace=False):
        xi, mui, si, ui = flat[0][i], flat[1][i], flat[2][i], u.reshape(-1)[i]
        precision_next = 1.0 / si + ui * ui / MODEL.sigma_eps2
        expected = 0.0
        for zk, wk in zip(z, w, strict=True):
            x_next = MODEL.alpha + mui * ui + MODEL.gamma * xi + np.sqrt(ui * ui * si + MODEL.sigma_eps2) * zk
            y = x_next - MODEL.alpha - MODEL.gamma * xi
            mu_next = (mui / si + ui * y / MODEL.sigma_eps2) / precision_next
            point = [
                np.clip(v, n[0], n[-1]) for v, n in zip((x_next, mu_next, 1.0 / precision_next), nodes, strict=True)
            ]
            expected += wk * interpolant(point)[0]
        reference = one_period_loss(MODEL, xi, mui, si, ui) + MODEL.delta * expected
        assert q.reshape(-1)[i] == pytest.approx(reference, rel=1e-12)


def test_with_no_future_the_minimiser_returns_the_myopic_policy() -> None:
    """delta = 0: min_u Q = min_u L, attained at the closed-form myopic control (paper eq. 11)."""
    model = ModelParams(0.3, 0.6, 0.8, 0.0, 0.5, 1.0, 0.2)
    grid = make_state_grid((-5.0, 7.0, 9), (-3.0, 3.0, 9), (0.05, 2.0, 6), model.xbar, 1.0)
    op = ArrayBellman(model, grid, 8, np, minimiser=MinimiserSettings(scan_points=5, golden_iterations=40))
    x, mu, s = grid.mesh(np)
    value, u = op.improve(np.zeros(grid.shape), None)
    u_myopic = myopic_policy(model, x, mu, s)
    np.testing.assert_allclose(value, one_period_loss(model, x, mu, s, u_myopic), rtol=1e-12)
    # L is quadratic, so a 1e-12 relative value match pins u only to about sqrt(1e-12 * L / a)
    np.testing.assert_allclose(u, u_myopic, atol=2e-5)


def test_minimiser_matches_a_dense_scan_where_the_objective_is_convex() -> None:
    """Trilinear interpolation: a convex V gives convex kinks, so Q is convex in u at many states. (The residual
    interpolant of the concave V - V0 has small concave kinks everywhere; the scan and the safeguard are what
    guard against those.)"""
    grid = make_state_grid((-6.0, 8.0, 12), (-3.0, 3.0, 12), (0.05, 2.0, 8), MODEL.xbar, 1.5)
    values = solve(MODEL, grid, SolveSettings("myopic", 1e-6, quadrature_nodes=10, interpolation="trilinear"), np).value
    op = ArrayBellman(
        MODEL,
        grid,
        10,
        np,
        minimiser=MinimiserSettings(scan_points=8, golden_iterations=40),
        interpolation="trilinear",
    )
    best_q, best_u = op.improve(values, None)
    x, mu, s = grid.mesh(np)
    lo, hi = inert_bounds(MODEL, x, mu, s, np.maximum(inert_value(MODEL, x), values), np)
    rng = np.random.default_rng(13)
    convex_points = 0
    for flat in rng.choice(values.size, 300, replace=False):
        i = np.unravel_index(flat, grid.shape)
        scan = np.linspace(lo[i], hi[i], 4001)
        ones = np.ones_like(scan)
        q = op.q_at_points(values, x[i] * ones, mu[i] * ones, s[i] * ones, scan)
        curvature = np.diff(q, 2)
        if curvature.min() < -1e-9 * np.abs(q).max():
            continue  # not convex in u here: the scan's minimum need not be the golden-section one
        convex_points += 1
        j = int(np.argmin(q))
        assert best_q[i] <= q[j] + 1e-12 * abs(q[j])
        # the scan's minimum exceeds the true one by at most about one second difference (Q'' h^2)
        assert best_q[i] >= q[j] - curvature.max() - 1e-12 * abs(q[j])
        assert abs(best_u[i] - scan[j]) <= 2 * (scan[1] - scan[0]) + 1e-6 * (hi[i] - lo[i])
    assert convex_points >= 30


def test_golden_section_cell_stays_in_the_bracket_when_the_previous_policy_lies_beyond_it() -> None:
    """The previous policy (a start candidate) lies at 5, far beyond the bracket [0, 1], and beats every scan
    point; the golden-section cell must be centred on it clamped into the bracket, [0.5, 1], where a narrow
    well at 0.9 (missed by the 3-point scan 0, 0.5, 1) is the bracket's minimum. Unclamped, the cell was
    [max(lo, 5 - 0.5), min(hi, 5 + 0.5)] = [4.5, 1]: inverted, searched outside the bracket and returned 5.
    The second point is the ordinary case (start inside), the third a start beyond the lower end."""

    def objective(u: np.ndarray) -> np.ndarray:
        calls.append(np.array(u, dtype=float, copy=True))
        return -np.exp(-(((u - 0.9) / 0.1) ** 2)) - 0.5 * np.exp(-(((u - 5.0) / 0.3) ** 2))

    calls: list[np.ndarray] = []
    lo, hi = np.zeros(3), np.ones(3)
    myopic = np.full(3, 0.5)
    previous = np.array([5.0, 0.3, -4.0])
    u, q = golden_section_minimise(objective, lo, hi, [myopic, previous], 3, 40, np)
    np.testing.assert_allclose(u, 0.9, atol=1e-6)
    np.testing.assert_allclose(q, -1.0, atol=1e-9)
    # the two start candidates are evaluated where they are; everything after (scan and golden section)
    # stays inside the bracket
    assert len(calls) == 2 + 3 + 2 + 40
    for evaluated in calls[2:]:
        assert np.all((lo <= evaluated) & (evaluated <= hi)), evaluated
    # the safeguard still returns a start candidate that beats the bracket's minimum
    calls.clear()
    u, q = golden_section_minimise(lambda v: objective(v) - 2.0 * (v == 5.0), lo, hi, [myopic, previous], 3, 40, np)
    assert u[0] == 5.0 and q[0] == pytest.approx(-2.5, abs=1e-12)
    np.testing.assert_allclose(u[1:], 0.9, atol=1e-6)


def test_cuda_source_warms_up_both_precisions_with_the_defines_an_operator_compiles() -> None:
    """The worker compiles the float64 and float32 variants at start with exactly the defines a job's
    operator asks for (the module cache keys on them), so a fresh worker's first job compiles nothing;
    the golden-section constant reaches the kernel as the very literal of minimize.py."""
    source = bellman._SOURCE
    assert source.path.name == "bellman.cu" and source in cuda.declared_sources()
    warm = {(dict(defines)["REAL"], dict(defines)["QUADRATIC"]): dict(defines) for defines in source.warm_up_defines}
    for dtype, real in ((np.float64, "double"), (np.float32, "float")):
        for quadratic in (False, True):
            options = cuda.compile_options(source, bellman.kernel_defines(dtype, quadratic))
            assert options == cuda.compile_options(source, warm[real, "1" if quadratic else "0"])
            assert f"-DREAL={real}" in options and f"-DINVERSE_GOLDEN_RATIO={INVERSE_GOLDEN_RATIO!r}" in options
            assert f"-DQUADRATIC={int(quadratic)}" in options
    assert len(warm) == len(source.warm_up_defines) == 4


def _block_after(text: str, opening: str) -> str:
    """The brace-delimited body that follows ``opening`` (which ends with its ``{``) in C source."""
    start = text.index(opening) + len(opening)
    depth = 1
    for end in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return text[start:end]
    raise AssertionError(f"no closing brace after {opening!r}")


def test_improvement_kernel_evaluates_q_once_per_golden_step() -> None:
    """The golden-section direction differs between neighbouring grid points at nearly every step (the NumPy
    twin at 32^3, default model: 95-99 % of the warps of 32 consecutive points disagree at each of the 28
    steps), and a warp whose threads disagree runs both arms of a branch: with a Q evaluation in each arm,
    golden section cost about 1.98 evaluations per step (an improvement about 68 sweeps' worth of Q instead of
    40; 73-76 sweeps were measured on the H100). The loop body makes one call, outside the branch."""
    body = _block_after(bellman._SOURCE.text(), "for (int it = 0; it < n_golden; ++it) {")
    assert body.count("q_value(") == 1
    call = body.index("q_value(")
    assert "if (" not in body[body.rindex(";", 0, call) : call]  # not guarded by a branch of its own
