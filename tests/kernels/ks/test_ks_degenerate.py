"""A K grid that does not hold the economy, a degenerate regression, a policy step or an outer loop that does not
converge: never a clean success (issue 12, item 4). A runner's ValueError ends the job ``failed`` with its message
(worker/tasks.py); an outer loop stopped at max_iterations succeeds with ``converged: false`` and a warning."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.context import local_context, run_kind
from kernels.ks.alm import StateRegression
from kernels.ks.grids import Grids
from kernels.ks.jobs import KS_SOLVE
from kernels.ks.model import Calibration
from kernels.ks.solve import capital_grid_problem, degenerate_regression_message

FAST = {"n_agents": 1_000, "periods": 200, "burn_in": 50, "interpolation": "bilinear", "policy_tolerance": 1e-5,
        "den_haan_periods": 0, "seed": 3}


@pytest.mark.parametrize(("low", "high", "edge"), [(30.0, 35.0, "max 35"), (1.0, 2.0, "max 2")])
def test_a_K_grid_below_the_steady_state_fails_and_names_the_remedy(low: float, high: float, edge: str) -> None:
    # the cases: they used to return converged: true, slope 1, R^2 1, mean capital at the grid's max
    with pytest.raises(ValueError) as info:
        run_kind(KS_SOLVE, {**FAST, "K_grid": {"min": low, "max": high}}, local_context(device="cpu"))
    message = str(info.value)
    assert "left the K grid" in message and edge in message
    assert "150 of 150 periods" in message  # every period after burn_in sat on the edge
    assert "Widen K_grid" in message and "steady state 37.99" in message
    assert f"mean capital {high:g}" in message


def test_a_K_grid_above_the_economy_fails_at_its_min() -> None:
    with pytest.raises(ValueError, match=r"clipped to its min 60 in 150 of 150 periods"):
        run_kind(KS_SOLVE, {**FAST, "K_grid": {"min": 60.0, "max": 80.0}}, local_context(device="cpu"))


def test_grid_check_on_paths_inside_partly_and_wholly_at_the_edges() -> None:
    grids, cal = Grids(K_min=30.0, K_max=50.0), Calibration()
    inside = np.r_[np.full(10, 37.0), np.linspace(31.0, 49.0, 100)]
    assert capital_grid_problem(inside, grids, 10, cal) is None
    # clipped during burn_in only: fine (the start may lie outside the ergodic set)
    assert capital_grid_problem(np.r_[np.full(10, 50.0), inside[10:]], grids, 10, cal) is None
    partly = inside.copy()
    partly[50:53] = 50.0  # three periods clipped at the max, one at the min
    partly[80] = 30.0
    problem = capital_grid_problem(partly, grids, 10, cal)
    assert problem is not None and not problem.every_period
    assert "min 30 in 1 of 100 periods and its max 50 in 3 of 100 periods" in problem.message
    assert "K_grid {min: 24, max: 62.5}" in problem.message  # both edges widened by the suggestion
    pinned = np.full(110, 30.0)
    problem = capital_grid_problem(pinned, grids, 10, cal)
    assert problem is not None and problem.every_period


def test_a_regression_that_fits_exactly_is_refused() -> None:
    fit = StateRegression(0.1, 0.96, 0.9999, 2e-4, 500)
    exact = StateRegression(0.0, 1.0, 1.0, 0.0, 500)
    assert degenerate_regression_message((fit, fit)) is None
    message = degenerate_regression_message((fit, exact))
    assert message is not None and "good state fits exactly (se = 0, slope 1, intercept 0)" in message


def test_a_policy_step_that_stalls_names_the_remedy() -> None:
    with pytest.raises(ValueError, match=r"policy_method 'egm'.*policy_damping") as info:
        run_kind(KS_SOLVE, {**FAST, "policy_max_iterations": 10}, local_context(device="cpu"))
    assert "policy_max_iterations=10 at outer iteration 1" in str(info.value)
    with pytest.raises(ValueError, match=r"raise policy_max_iterations \(EGM"):
        run_kind(KS_SOLVE, {**FAST, "policy_max_iterations": 10, "policy_method": "egm"}, local_context(device="cpu"))


def test_an_outer_loop_stopped_early_says_so() -> None:
    result = run_kind(KS_SOLVE, {**FAST, "max_iterations": 1}, local_context(device="cpu"))
    assert result["converged"] is False
    assert len(result["warnings"]) == 1 and "max_iterations=1" in result["warnings"][0]
