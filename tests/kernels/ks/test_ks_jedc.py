"""The JEDC accuracy test: the comparison's inputs, the non-stochastic histogram, Den Haan's statistics and the
Euler-equation errors, each against an independent reference (closed form, brute force, a large panel)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from kernels.context import MissingDatasetError, local_context, run_kind
from kernels.ks import accuracy
from kernels.ks.grids import Grids
from kernels.ks.inputs import JEDC_PERIODS, AccuracyInputs, jedc_inputs
from kernels.ks.jobs import KS_SOLVE
from kernels.ks.model import Calibration, aggregate_transition, conditional_employment
from kernels.ks.simulate import simulate_panel
from kernels.ks.spec import KSSolveParams
from kernels.progress import LocalProgress

CAL, GRIDS = Calibration(), Grids()


@pytest.fixture(scope="module")
def jedc() -> AccuracyInputs:
    return jedc_inputs()


def synthetic_policy(slope: float = 0.95) -> np.ndarray:
    """A smooth, concave, mean-reverting policy g(k, K, a, eps) on the solve's grids (no solve needed):
    k' = slope k + (1 - slope) target_eps + 0.2 (sqrt(k + 1) - sqrt(41)) - 0.01 (K - 40) + 0.05 a."""
    k, capital = GRIDS.k[:, None], GRIDS.K[None, :]
    table = np.empty((2, 2, GRIDS.k_size, GRIDS.K_size))
    for a in range(2):
        for eps, target in ((0, 30.0), (1, 42.0)):
            table[a, eps] = (slope * k + (1 - slope) * target + 0.2 * (np.sqrt(k + 1) - np.sqrt(41.0))
                             - 0.01 * (capital - 40.0) + 0.05 * a)
    return np.clip(table, GRIDS.k_min, GRIDS.k_max)


# ---------------------------------------------------------------- the comparison's inputs


def test_jedc_file_readings(jedc: AccuracyInputs) -> None:
    assert jedc.periods == JEDC_PERIODS == 10_000
    assert jedc.a_path.dtype == np.int8 and set(np.unique(jedc.a_path)) == {0, 1}
    assert jedc.a_path[0] == 0  # agshock(1) = 1: the path starts bad, as MMV's simulations do
    assert jedc.employed_path is not None and set(np.unique(jedc.employed_path)) == {0, 1}
    np.testing.assert_array_equal(jedc.k_nodes, np.linspace(0.0, 100.0, 1001))
    assert jedc.individual_k0 == 43.0
    # each column of kdist is a distribution conditional on the employment state (TEST.m's normalisation)
    np.testing.assert_allclose(jedc.distribution.sum(axis=1), 1.0, rtol=0, atol=1e-14)
    assert np.all(jedc.distribution >= 0.0)
    # column 1 is the unemployed: they hold less capital than the employed
    means = jedc.distribution @ jedc.k_nodes
    assert 30.0 < means[0] < means[1] < 40.0


def test_jedc_paths_follow_the_calibrations_chains(jedc: AccuracyInputs) -> None:
    # 1 = bad is the reading under which agshock's persistence is the calibration's 0.875 in both states
    a = jedc.a_path
    transition = aggregate_transition(CAL)
    for state in (0, 1):
        stay = np.mean(a[1:][a[:-1] == state] == state)
        assert stay == pytest.approx(transition[state, state], abs=0.02)  # ~5,000 draws: se 0.005
    # idshock: 1 = unemployed is the reading under which unemployment spells last as calibrated
    employed = jedc.employed_path
    assert employed is not None
    emp = conditional_employment(CAL)
    now_unemployed = (employed[:-1] == 0)
    stays_unemployed = np.mean(employed[1:][now_unemployed] == 0)
    expected = np.mean([1 - emp[a[t], a[t + 1], 0] for t in np.flatnonzero(now_unemployed)])
    assert stays_unemployed == pytest.approx(expected, abs=0.08)  # ~750 unemployed periods: se ~0.02


# ---------------------------------------------------------------- the histogram


def test_lottery_keeps_the_mean_and_splits_between_neighbours() -> None:
    nodes = np.array([0.0, 1.0, 2.5, 5.0])
    values = np.array([0.0, 0.4, 2.5, 3.0, 4.99, 7.0, -1.0])
    low, high_weight = accuracy.lottery(nodes, values)
    assert np.all((high_weight >= 0) & (high_weight <= 1))
    clamped = np.clip(values, 0.0, 5.0)
    np.testing.assert_allclose((1 - high_weight) * nodes[low] + high_weight * nodes[low + 1], clamped, atol=1e-15)
    assert np.all(nodes[low] <= clamped) and np.all(clamped <= nodes[low + 1])


def test_histogram_conserves_mass_and_the_exact_unemployment_share(jedc: AccuracyInputs) -> None:
    table = synthetic_policy()
    conditional = jedc.distribution.copy()
    for t in range(200):
        a, a_next = int(jedc.a_path[t]), int(jedc.a_path[t + 1])
        choice = accuracy.interpolate(np, table.reshape(4, 100, 4), 2 * a + np.arange(2)[:, None],
                                      np.broadcast_to(jedc.k_nodes, (2, 1001)), 40.0, GRIDS, "bilinear", GRIDS.k)
        moved = accuracy.move_mass(jedc.k_nodes, conditional, choice)
        np.testing.assert_allclose(moved.sum(axis=1), 1.0, rtol=0, atol=1e-13)
        emp = conditional_employment(CAL)[a, a_next]
        joint_unemployed = CAL.unemployment[a] * (1 - emp[0]) + (1 - CAL.unemployment[a]) * (1 - emp[1])
        assert joint_unemployed == pytest.approx(CAL.unemployment[a_next], abs=1e-5)  # the matrix's 6 decimals
        conditional = accuracy.mix_employment(CAL, moved, a, a_next)
        np.testing.assert_allclose(conditional.sum(axis=1), 1.0, rtol=0, atol=1e-13)
        assert np.all(conditional >= 0.0)


def test_histogram_is_exact_for_a_linear_policy(jedc: AccuracyInputs) -> None:
    """k' = lambda_eps k + b_eps (bilinear reproduces it, destinations inside [0, 100]): the lottery keeps each
    conditional mean exactly, so K_t follows a closed-form recursion of the two conditional means."""
    slope, shift = np.array([0.9, 0.96]), np.array([1.0, 2.5])
    table = np.empty((2, 2, GRIDS.k_size, GRIDS.K_size))
    for eps in range(2):
        table[:, eps] = (slope[eps] * GRIDS.k + shift[eps])[None, :, None]
    path = accuracy.histogram_path(CAL, GRIDS, "bilinear", table, jedc, 300)
    means = jedc.distribution @ jedc.k_nodes
    emp = conditional_employment(CAL)
    for t in range(300):
        a = int(jedc.a_path[t])
        u = CAL.unemployment[a]
        assert path.capital[t] == pytest.approx(u * means[0] + (1 - u) * means[1], rel=1e-12)
        end = slope * means + shift
        p_emp = emp[a, int(jedc.a_path[t + 1])]
        joint = np.array([[u * (1 - p_emp[0]), u * p_emp[0]], [(1 - u) * (1 - p_emp[1]), (1 - u) * p_emp[1]]])
        means = (joint.T @ end) / joint.sum(axis=0)


def test_histogram_matches_a_large_stochastic_panel(jedc: AccuracyInputs) -> None:
    """The histogram is the panel's limit as N grows: a panel of 200,000 agents started on the histogram's
    quantiles (exact shares) stays within its sampling error of the histogram's K over 60 periods, while a
    histogram that ignores the employment transition does not."""
    table = synthetic_policy()
    periods, n = 60, 200_000
    hist = accuracy.histogram_path(CAL, GRIDS, "catmull_rom", table, jedc, periods)
    u0 = CAL.unemployment[int(jedc.a_path[0])]
    n_unemployed = round(u0 * n)
    samples = []
    for eps, count in ((0, n_unemployed), (1, n - n_unemployed)):
        cdf = np.cumsum(jedc.distribution[eps])
        samples.append(jedc.k_nodes[np.minimum(np.searchsorted(cdf, (np.arange(count) + 0.5) / count), 1000)])
    k0 = np.concatenate(samples)
    e0 = np.r_[np.zeros(n_unemployed, np.uint8), np.ones(n - n_unemployed, np.uint8)]
    panel = simulate_panel(np, CAL, GRIDS, "catmull_rom", table, k0, e0, jedc.a_path[: periods + 1], seed=3)
    gap = np.abs(np.log(panel.capital_path / hist.capital))
    assert gap.max() < 5e-4  # measured ~1e-4: the employment shares' sampling noise at N = 200,000
    frozen = AccuracyInputs(jedc.a_path[:periods], jedc.k_nodes, jedc.distribution, name="frozen")
    no_mixing = _histogram_without_employment_moves(table, frozen, periods)
    assert np.abs(np.log(panel.capital_path / no_mixing)).max() > 5e-3


def _histogram_without_employment_moves(table: np.ndarray, inputs: AccuracyInputs, periods: int) -> np.ndarray:
    conditional = inputs.distribution.copy()
    capital = np.empty(periods)
    for t in range(periods):
        a = int(inputs.a_path[t])
        capital[t] = accuracy.aggregate_capital(CAL, inputs.k_nodes, conditional, a)
        choice = accuracy.interpolate(np, table.reshape(4, 100, 4), 2 * a + np.arange(2)[:, None],
                                      np.broadcast_to(inputs.k_nodes, (2, inputs.k_nodes.size)), capital[t], GRIDS,
                                      "catmull_rom", GRIDS.k)
        conditional = accuracy.move_mass(inputs.k_nodes, conditional, np.clip(choice, 0.0, 1000.0))
    return capital


# ---------------------------------------------------------------- statistics against brute force


def _scalar_bilinear(table: np.ndarray, k: float, capital: float) -> float:
    j = int(np.clip(np.searchsorted(GRIDS.K, capital, side="right") - 1, 0, GRIDS.K_size - 2))
    capital = float(np.clip(capital, GRIDS.K_min, GRIDS.K_max))
    low, high = np.interp(k, GRIDS.k, table[:, j]), np.interp(k, GRIDS.k, table[:, j + 1])
    w = (capital - GRIDS.K[j]) / (GRIDS.K[j + 1] - GRIDS.K[j])
    return float(np.clip((1 - w) * low + w * high, GRIDS.k_min, GRIDS.k_max))


def _scalar_euler_error(table: np.ndarray, a: int, eps: int, k: float, capital: float,
                        capital_next: tuple[float, float]) -> tuple[float, bool]:
    """|c / c_Euler - 1| by explicit loops over (a', eps'), TEST.m's handling of the borrowing limit."""
    def prices(capital: float, state: int) -> tuple[float, float]:
        ratio = capital / CAL.labour[state]
        z = CAL.productivity[state]
        return CAL.alpha * z * ratio ** (CAL.alpha - 1), (1 - CAL.alpha) * z * ratio**CAL.alpha

    def income(state: int, employed: int, w: float) -> float:
        return (1 - CAL.tax[state]) * CAL.l_bar * w if employed else CAL.mu * w

    r, w = prices(capital, a)
    cash = (1 - CAL.delta + r) * k + income(a, eps, w)
    choice = _scalar_bilinear(table[2 * a + eps], k, capital)
    expectation = 0.0
    for a_n in range(2):
        r_n, w_n = prices(capital_next[a_n], a_n)
        for e_n in range(2):
            k2 = _scalar_bilinear(table[2 * a_n + e_n], choice, capital_next[a_n])
            c_next = max((1 - CAL.delta + r_n) * choice + income(a_n, e_n, w_n) - k2, 1e-10)
            expectation += CAL.transition_matrix[2 * a + eps, 2 * a_n + e_n] * (1 - CAL.delta + r_n) / c_next
    c_euler = 1.0 / (CAL.beta * expectation)
    limit = cash - c_euler < GRIDS.k_min
    if limit:
        c_euler = cash - GRIDS.k_min
    return abs((cash - choice) / c_euler - 1.0), not (limit and choice <= GRIDS.k_min)


def test_statistics_against_brute_force(jedc: AccuracyInputs) -> None:
    policy = synthetic_policy()
    table = policy.reshape(4, 100, 4)
    alm = np.array([0.12, 0.967, 0.13, 0.965])
    periods = 400
    test = accuracy.histogram_test(CAL, GRIDS, "bilinear", policy, alm, jedc, periods)
    # Den Haan: the ALM iterated alone from K_0 along the same a_t, max and mean of 100 |ln K^ALM - ln K|
    log_alm = [np.log(test.capital[0])]
    for t in range(periods - 1):
        a = int(jedc.a_path[t])
        log_alm.append(alm[2 * a] + alm[2 * a + 1] * log_alm[-1])
    gaps = [100 * abs(x - np.log(k)) for x, k in zip(log_alm, test.capital, strict=True)]
    assert test.max_pct == pytest.approx(max(gaps), rel=1e-12)
    assert test.mean_pct == pytest.approx(sum(gaps) / periods, rel=1e-12)
    assert test.mean_capital == pytest.approx(sum(test.capital) / periods, rel=1e-14)
    # the individual path: k_{t+1} = g(k_t, K_t, a_t, eps_t) from 43, and its Euler errors with realised K_{t+1}
    employed = jedc.employed_path
    assert employed is not None and test.individual_k is not None and test.euler_path is not None
    k = [43.0]
    errors = []
    for t in range(periods - 1):
        a, eps = int(jedc.a_path[t]), int(employed[t])
        error, counted = _scalar_euler_error(table, a, eps, k[-1], test.capital[t], (test.capital[t + 1],) * 2)
        if counted:
            errors.append(error)
        k.append(_scalar_bilinear(table[2 * a + eps], k[-1], test.capital[t]))
    np.testing.assert_allclose(test.individual_k, k, rtol=1e-12)
    assert test.euler_path.points == len(errors)
    assert test.euler_path.mean_log10 == pytest.approx(np.log10(np.mean(errors)), abs=1e-10)
    assert test.euler_path.max_log10 == pytest.approx(np.log10(np.max(errors)), abs=1e-10)


def test_grid_euler_errors_against_brute_force() -> None:
    policy = synthetic_policy()
    table = policy.reshape(4, 100, 4)
    alm = np.array([0.12, 0.967, 0.13, 0.965])
    k_points = np.array([0.0, 0.3, 7.0, 38.5, 99.0])
    result = accuracy.euler_errors_on_grid(CAL, GRIDS, "bilinear", policy, alm, k_points)
    capital_points = np.linspace(30.0, 50.0, 13)  # the 4 K nodes and 3 points inside each cell
    errors = []
    for a in range(2):
        for eps in range(2):
            for k in k_points:
                for capital in capital_points:
                    nxt = float(np.clip(np.exp(alm[2 * a] + alm[2 * a + 1] * np.log(capital)), 30.0, 50.0))
                    error, counted = _scalar_euler_error(table, a, eps, k, capital, (nxt, nxt))
                    if counted:
                        errors.append(error)
    assert result.points == len(errors)
    assert result.mean_log10 == pytest.approx(np.log10(np.mean(errors)), abs=1e-10)
    assert result.max_log10 == pytest.approx(np.log10(np.max(errors)), abs=1e-10)


# ---------------------------------------------------------------- the job


WARM = [0.144219, 0.960361, 0.154786, 0.958879]
SMALL = {"n_agents": 1_000, "periods": 200, "burn_in": 50, "tolerance": 1e-3, "max_iterations": 1,
         "interpolation": "bilinear", "policy_tolerance": 1e-5, "initial_alm": WARM, "seed": 5,
         "accuracy_test": "jedc", "den_haan_periods": 300}


def test_job_reports_the_jedc_statistics() -> None:
    progress = LocalProgress()
    result = run_kind(KS_SOLVE, KSSolveParams.model_validate(SMALL), local_context(device="cpu", progress=progress))
    assert result["den_haan_error"]["test"] == "jedc" and result["den_haan_error"]["periods"] == 300
    stats = result["accuracy"]
    assert stats["test"] == "jedc" and stats["periods"] == 300
    assert stats["den_haan_max_pct"] == result["den_haan_error"]["max_pct"] >= stats["den_haan_mean_pct"] > 0
    assert 35.0 < stats["mean_capital"] < 45.0
    for part in ("euler_grid", "euler_path"):
        assert -6.0 < stats[part]["mean_log10"] <= stats[part]["max_log10"] < 0.0
    assert stats["euler_path"]["points"] <= 299
    path = progress.artifacts["accuracy_path"]
    assert path["K"].shape == path["K_alm"].shape == path["a"].shape == path["k_individual"].shape == (300,)
    assert "den_haan_path" not in progress.artifacts  # the panel test did not run
    assert "accuracy_test" in result["timings"]


def test_job_takes_an_uploaded_path_and_cross_section() -> None:
    import pandas as pd  # here, not at the top: the GPU machine runs gpu tests without pandas

    jedc = jedc_inputs()
    path = pd.DataFrame({"a": jedc.a_path[:120].astype(int)})
    nodes = np.linspace(0.0, 100.0, 201)
    cross_section = pd.DataFrame({"k": nodes, "unemployed": np.exp(-((nodes - 30) / 10) ** 2),
                                  "employed": np.exp(-((nodes - 40) / 12) ** 2)})
    params = KSSolveParams.model_validate({**SMALL, "den_haan_periods": None, "accuracy_path": "p",
                                           "accuracy_distribution": "d"})
    progress = LocalProgress()
    ctx = local_context(device="cpu", datasets={"accuracy_path": path, "accuracy_distribution": cross_section},
                        progress=progress)
    result = run_kind(KS_SOLVE, params, ctx)
    stats = result["accuracy"]
    assert stats["test"] == "dataset" and stats["periods"] == 120 and stats["euler_path"] is None
    masses = cross_section[["unemployed", "employed"]].to_numpy().T
    masses = masses / masses.sum(axis=1, keepdims=True)
    expected_k0 = 0.1 * masses[0] @ nodes + 0.9 * masses[1] @ nodes  # a_0 = bad: u = 0.1
    assert result["den_haan_error"]["periods"] == 120
    k_path = progress.artifacts["accuracy_path"]["K"]
    assert k_path[0] == pytest.approx(expected_k0, rel=1e-12)

    bad_inputs = [({"accuracy_path": path.rename(columns={"a": "state"})}, "column 'a'"),
                  ({"accuracy_path": path.assign(a=2)}, "'a' must hold only 0 and 1"),
                  ({"accuracy_path": path.head(5)}, "at least 10 periods"),
                  ({"accuracy_distribution": cross_section.drop(columns="employed")}, "missing: employed"),
                  ({"accuracy_distribution": cross_section.assign(k=nodes[::-1])}, "strictly increasing"),
                  ({"accuracy_distribution": cross_section.assign(unemployed=-1.0)}, "non-negative")]
    for replacement, message in bad_inputs:
        frames = {"accuracy_path": path, "accuracy_distribution": cross_section, **replacement}
        with pytest.raises(ValueError, match=message) as info:
            run_kind(KS_SOLVE, params, local_context(device="cpu", datasets=frames))
        assert next(iter(replacement)) in str(info.value)  # the message names the field
    with pytest.raises(MissingDatasetError, match="accuracy_path"):
        run_kind(KS_SOLVE, params, local_context(device="cpu", datasets={"accuracy_distribution": cross_section}))


@pytest.mark.parametrize(
    ("payload", "message"),
    [({"accuracy_path": "p"}, "set accuracy_test to 'jedc'"),
     ({"accuracy_distribution": "d"}, "set accuracy_test to 'jedc'"),
     ({"accuracy_test": "jedc", "den_haan_periods": 10_001}, "10000 periods"),
     ({"accuracy_test": "histogram"}, "accuracy_test")],
)
def test_accuracy_parameters_are_checked(payload: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        KSSolveParams.model_validate(payload)
