"""The quasi-Newton ALM update (alm_update "newton", issue 12 item 6): the full panel's outer loop takes Newton
steps on F(B) - B with the coarse stage's finite-difference Jacobian, Broyden-updated between full steps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kernels.ks.grids import Grids
from kernels.ks.model import Calibration
from kernels.ks.solve import (
    DampedUpdate,
    NewtonUpdate,
    SolveSettings,
    alm_jacobian,
    jacobian_directions,
    solve,
)

# a contraction with a slow direction (eigenvalues 0.95, 0.9, 0.5, -0.3), like the KS map's: damping 0.3 needs
# hundreds of steps to 1e-10
BASIS = np.linalg.qr(np.arange(16.0).reshape(4, 4) ** 0.5 + np.eye(4))[0]
MATRIX = BASIS @ np.diag([0.95, 0.9, 0.5, -0.3]) @ BASIS.T
SHIFT = np.array([0.1, -0.2, 0.3, 0.05])
FIXED = np.linalg.solve(np.eye(4) - MATRIX, SHIFT)


def linear_map(b: np.ndarray) -> np.ndarray:
    return MATRIX @ b + SHIFT


def iterations_to(update, start: np.ndarray, tol: float = 1e-10, cap: int = 1_000) -> tuple[int, np.ndarray]:
    """Evaluations of the map until ||F(B) - B|| < tol (the solve's stopping rule), and the last B."""
    b = start.copy()
    for step in range(1, cap + 1):
        b_new = linear_map(b)
        if np.linalg.norm(b_new - b) < tol:
            return step, b
        b = update(b, b_new)
    return cap, b


def test_newton_with_the_exact_jacobian_solves_a_linear_map_in_one_step() -> None:
    update = NewtonUpdate(MATRIX, damping=0.3)
    start = np.array([0.0, 1.0, 0.0, 1.0])
    first = update(start, linear_map(start))
    assert update.last_step == "newton"
    np.testing.assert_allclose(first, FIXED, rtol=1e-12, atol=1e-12)
    newton, _ = iterations_to(NewtonUpdate(MATRIX, damping=0.3), start)
    damped, _ = iterations_to(DampedUpdate(0.3), start)
    assert newton == 2 and damped > 100  # one step, then the evaluation that finds ||F(B) - B|| below tolerance


def test_broyden_updates_repair_an_approximate_jacobian() -> None:
    # a Jacobian 10 % off in every entry (as a coarse panel's may be): without the secant updates the error would
    # shrink by a fixed factor per step; with them the iteration still ends at the map's own fixed point
    rng = np.random.default_rng(3)
    approximate = MATRIX * (1.0 + 0.1 * rng.uniform(-1.0, 1.0, MATRIX.shape))
    steps, b = iterations_to(NewtonUpdate(approximate, damping=0.3), np.zeros(4))
    assert steps <= 10
    np.testing.assert_allclose(b, FIXED, atol=1e-9)


def test_a_step_that_does_not_reduce_the_residual_is_followed_by_the_damped_step() -> None:
    wrong = MATRIX + 2.0 * np.eye(4)  # J - I = M + I: the wrong sign, the Newton step goes away from the fixed point
    update = NewtonUpdate(wrong, damping=0.3)
    b0 = np.zeros(4)
    b1 = update(b0, linear_map(b0))
    assert update.last_step == "newton"
    r0, r1 = linear_map(b0) - b0, linear_map(b1) - b1
    assert np.linalg.norm(r1) >= np.linalg.norm(r0)  # the premise: this step did not reduce ||F(B) - B||
    b2 = update(b1, linear_map(b1))
    assert update.last_step == "damped" and update.failures == 1
    np.testing.assert_allclose(b2, b1 + 0.3 * r1, rtol=1e-14)
    # with the fallback (after max_failures steps only damped ones) the iteration still converges, in about the
    # damped update's number of steps
    steps, b = iterations_to(NewtonUpdate(wrong, damping=0.3), np.zeros(4), cap=5_000)
    assert steps <= iterations_to(DampedUpdate(0.3), np.zeros(4), cap=5_000)[0] + 10
    np.testing.assert_allclose(b, FIXED, atol=1e-8)


def test_after_max_failures_only_damped_steps_are_taken() -> None:
    update = NewtonUpdate(MATRIX, damping=0.3, max_failures=1)
    b = np.zeros(4)
    update(b, linear_map(b))
    update.failures = 1  # as after one step that did not reduce the residual
    b1 = np.ones(4)
    assert np.array_equal(update(b1, linear_map(b1)), b1 + 0.3 * (linear_map(b1) - b1))
    assert update.last_step == "damped"


def test_the_finite_difference_jacobian_of_a_linear_map_is_exact() -> None:
    capital = np.exp(np.log(40.0) + 0.02 * np.sin(np.arange(300.0)))
    directions = jacobian_directions(capital, burn_in=100)
    log_k = np.log(capital[100:])
    mean, sd = log_k.mean(), log_k.std()
    for state in (0, 1):  # each moves the forecast ln K' = b0 + b1 ln K by the step at the mean or one sd above
        rows = slice(2 * state, 2 * state + 2)
        shift, tilt = directions[rows, 2 * state], directions[rows, 2 * state + 1]
        assert shift[0] + shift[1] * mean == pytest.approx(1e-4) and shift[1] == 0.0
        assert tilt[0] + tilt[1] * mean == pytest.approx(0.0, abs=1e-15)
        assert tilt[0] + tilt[1] * (mean + sd) == pytest.approx(1e-4)
    point = np.array([0.1, 0.97, 0.1, 0.97])
    np.testing.assert_allclose(alm_jacobian(linear_map, point, linear_map(point), directions), MATRIX, atol=1e-9)


def test_newton_needs_the_coarse_stage() -> None:
    # the params model refuses both at submission (test_ks_job); the kernel asserts them
    with pytest.raises(AssertionError, match="coarse_agents"):
        solve(np, Calibration(), Grids(), SolveSettings(alm_update="newton", n_agents=1_000, periods=300))
    with pytest.raises(AssertionError, match="alm_update must be one of"):
        solve(np, Calibration(), Grids(), SolveSettings(alm_update="broyden", n_agents=1_000, periods=300))


@pytest.mark.slow
def test_the_staged_newton_solve_reaches_the_anderson_fixed_point_with_fewer_full_iterations() -> None:
    # the same coarse stage (Anderson) and the same start-panel convention (the full panel's first final panel,
    # fixed), so both evaluate one map: they must agree within what the tolerance leaves (||F(B) - B|| < 1e-7 and
    # a contraction: ~1e-6), while Newton needs fewer full-panel simulations
    base = SolveSettings(n_agents=6_000, periods=300, burn_in=100, tolerance=1e-7, den_haan_periods=0, seed=2,
                         interpolation="bilinear", coarse_agents=1_000, alm_update="anderson")
    anderson = solve(np, Calibration(), Grids(), base)
    newton = solve(np, Calibration(), Grids(), replace(base, alm_update="newton"))
    assert anderson.converged and newton.converged
    assert newton.coarse_iterations == anderson.coarse_iterations and newton.jacobian_simulations == 4
    np.testing.assert_allclose(newton.alm, anderson.alm, atol=2e-6)
    assert newton.iterations < anderson.iterations and newton.iterations <= 6
