"""alm_simulation 'histogram': the ALM fitted to a non-stochastic histogram of the cross-section (Young 2010,
MMV's non-stochastic simulation) instead of an N-agent panel."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kernels.context import local_context, run_kind
from kernels.ks import alm as alm_mod
from kernels.ks.grids import Grids
from kernels.ks.jobs import KS_SOLVE
from kernels.ks.model import Calibration
from kernels.ks.policy import PolicySettings
from kernels.ks.simulate import aggregate_path
from kernels.ks.solve import (
    SolveSettings,
    histogram_top,
    histogram_top_problem,
    initial_histogram,
    simulate_histogram,
    solve,
)

CAL, GRIDS = Calibration(), Grids()
SMALL = SolveSettings(periods=300, burn_in=50, tolerance=1e-6, interpolation="cubic", alm_simulation="histogram",
                      policy=PolicySettings(tolerance=1e-7), den_haan_periods=100,
                      initial_alm=(0.144219, 0.960361, 0.154786, 0.958879), max_iterations=40)


# the quick tier's: two iterations (not converged) of bilinear on 501 nodes
QUICK = replace(SMALL, interpolation="bilinear", histogram_nodes=501, max_iterations=2,
                policy=PolicySettings(tolerance=1e-5))


@pytest.fixture(scope="module")
def small_solution():
    return solve(np, CAL, GRIDS, SMALL)


@pytest.fixture(scope="module")
def quick_solution():
    return solve(np, CAL, GRIDS, QUICK)


def test_the_histogram_starts_where_it_is_told_and_keeps_each_state_s_mean() -> None:
    nodes = np.linspace(GRIDS.k_min, histogram_top(GRIDS), 1001)
    point = initial_histogram(nodes, 37.99, None, None)
    np.testing.assert_allclose(point.sum(axis=1), 1.0, rtol=0, atol=1e-14)
    np.testing.assert_allclose(point @ nodes, [37.99, 37.99], rtol=1e-14)
    rng = np.random.default_rng(3)
    k = rng.uniform(0.0, 90.0, 5_000)
    employed = rng.uniform(size=k.size) < 0.9
    given = initial_histogram(nodes, 37.99, k, employed)
    np.testing.assert_allclose(given @ nodes, [k[~employed].mean(), k[employed].mean()], rtol=1e-12)


def test_histogram_top_is_four_times_the_K_grid_max_within_the_k_grid() -> None:
    assert histogram_top(GRIDS) == 200.0  # 2,001 nodes: the JEDC test's spacing 0.1 for the default K grid
    assert histogram_top(Grids(k_max=80.0)) == 80.0


def test_a_distribution_piled_on_the_top_node_is_named() -> None:
    nodes = np.linspace(0.0, 100.0, 101)
    fine = np.zeros((2, 101))
    fine[:, 40] = 1.0
    assert histogram_top_problem(fine, nodes) is None
    piled = fine.copy()
    piled[1, 40], piled[1, -1] = 0.99, 0.01
    message = histogram_top_problem(piled, nodes)
    assert message is not None and "top node 100" in message and "widen K_grid" in message


@pytest.mark.slow
def test_the_solution_s_alm_is_the_regression_on_its_own_histogram_path(small_solution) -> None:
    sol = small_solution
    assert sol.converged and sol.final_k is None and sol.final_distribution is not None
    # the fitted path is reproduced from the policy alone: the histogram is deterministic (no draws)
    a_path = aggregate_path(CAL, SMALL.seed, SMALL.periods + 1)
    np.testing.assert_array_equal(a_path, sol.a_path)
    regressions = alm_mod.regress_alm(sol.capital_path, sol.a_path, SMALL.burn_in)
    np.testing.assert_allclose(alm_mod.coefficients(*regressions), sol.alm, rtol=1e-13)
    # converged: one more damped step would barely move it
    assert sol.last_change < SMALL.tolerance
    # the reported Den Haan test is the histogram's, from the final distribution, on a fresh path
    assert sol.den_haan_panel.size == 100 and 0.0 < sol.den_haan_mean < sol.den_haan_max < 2.0


@pytest.mark.slow
def test_the_histogram_path_agrees_with_a_large_panel_under_the_solution_s_policy(small_solution) -> None:
    """Independent check of what the ALM is fitted to: 200,000 agents under the same policy and aggregate path
    (sampling error of K about 0.05 %) against the histogram from the same start."""
    from kernels.ks.simulate import STREAM_IDIOSYNCRATIC, simulate_panel
    from kernels.ks.solve import initial_panel

    sol = small_solution
    settings = SolveSettings(n_agents=200_000, periods=SMALL.periods, interpolation="cubic", seed=SMALL.seed)
    k0, e0 = initial_panel(np, CAL, settings, first_state=int(sol.a_path[0]))
    panel = simulate_panel(np, CAL, GRIDS, "cubic", sol.policy, k0, e0, sol.a_path[:121], settings.seed,
                           STREAM_IDIOSYNCRATIC, use_kernel=False)
    nodes = np.linspace(GRIDS.k_min, histogram_top(GRIDS), SMALL.histogram_nodes)
    start = initial_histogram(nodes, CAL.steady_state_capital, np.asarray(k0), np.asarray(e0).astype(bool))
    hist = simulate_histogram(CAL, GRIDS, SMALL, sol.policy, nodes, start, sol.a_path[:121])
    gap = np.abs(hist.capital / panel.capital_path - 1.0)
    assert gap.max() < 2e-3, gap.max()


def test_a_short_solve_s_alm_is_the_regression_on_its_own_histogram_path(quick_solution) -> None:
    """The slow tier's converged check at a smaller size, stopped after two iterations."""
    sol = quick_solution
    assert not sol.converged and sol.iterations == 2 and sol.warnings
    assert sol.final_k is None and sol.final_distribution is not None
    np.testing.assert_array_equal(aggregate_path(CAL, QUICK.seed, QUICK.periods + 1), sol.a_path)
    regressions = alm_mod.regress_alm(sol.capital_path, sol.a_path, QUICK.burn_in)
    np.testing.assert_allclose(alm_mod.coefficients(*regressions), sol.alm, rtol=1e-13)
    assert sol.den_haan_panel.size == 100 and 0.0 < sol.den_haan_mean < sol.den_haan_max


def test_a_short_solve_s_histogram_path_agrees_with_a_panel_under_its_policy(quick_solution) -> None:
    """The slow tier's 200,000-agent check with 20,000 agents (sampling error of K about 0.15 %)."""
    from kernels.ks.simulate import STREAM_IDIOSYNCRATIC, simulate_panel
    from kernels.ks.solve import initial_panel

    sol = quick_solution
    settings = SolveSettings(n_agents=20_000, periods=QUICK.periods, interpolation="bilinear", seed=QUICK.seed)
    k0, e0 = initial_panel(np, CAL, settings, first_state=int(sol.a_path[0]))
    panel = simulate_panel(np, CAL, GRIDS, "bilinear", sol.policy, k0, e0, sol.a_path[:121], settings.seed,
                           STREAM_IDIOSYNCRATIC, use_kernel=False)
    nodes = np.linspace(GRIDS.k_min, histogram_top(GRIDS), QUICK.histogram_nodes)
    start = initial_histogram(nodes, CAL.steady_state_capital, np.asarray(k0), np.asarray(e0).astype(bool))
    hist = simulate_histogram(CAL, GRIDS, QUICK, sol.policy, nodes, start, sol.a_path[:121])
    gap = np.abs(hist.capital / panel.capital_path - 1.0)
    assert gap.max() < 2e-3, gap.max()


def test_the_coarse_panel_stage_is_refused_with_the_histogram() -> None:
    # the params model refuses it at submission (test_ks_job); the kernel asserts it
    with pytest.raises(AssertionError, match="coarse_agents"):
        solve(np, CAL, GRIDS, SolveSettings(alm_simulation="histogram", coarse_agents=1_000))


def test_a_job_fitted_on_the_histogram_labels_its_test() -> None:
    params = {"periods": 200, "burn_in": 50, "max_iterations": 2, "interpolation": "cubic",
              "alm_simulation": "histogram", "policy_tolerance": 1e-4, "den_haan_periods": 100, "seed": 1}
    result = run_kind(KS_SOLVE, params, local_context(device="cpu"))
    assert result["den_haan_error"]["test"] == "histogram"
    assert result["den_haan_error"]["periods"] == 100
    assert result["iterations"] == 2 and not result["converged"] and result["warnings"]
