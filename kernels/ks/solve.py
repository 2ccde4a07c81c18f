"""The Krusell-Smith algorithm (Hatcher & Scheffel 2014, Algorithm A.1), both stages on ``xp``.

Outer loop (MMV 2010 MAIN.m): solve the policy for the current ALM; simulate the panel on a fixed shock
path; regress ln K' on ln K by state; stop when ||B_new - B||_2 < tolerance; else B <- damping B_new +
(1 - damping) B. While ||B_new - B|| > 100 tolerance the next simulation starts from the panel's final
distribution (so it starts in the ergodic set); afterwards the starting panel is held fixed, so that the
fixed point is that of one map. The panel never leaves the device; on the GPU every outer iteration replays
one :class:`~kernels.ks.simulate.CudaPanel` (its period loop captured as CUDA graphs once per solve).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

import numpy as np

from kernels.backend import is_numpy
from kernels.ks import accuracy
from kernels.ks import alm as alm_mod
from kernels.ks.grids import Grids
from kernels.ks.inputs import AccuracyInputs
from kernels.ks.interp import Method
from kernels.ks.model import Calibration
from kernels.ks.policy import EulerProblem, PolicySettings, initial_policy, solve_policy
from kernels.ks.simulate import (
    STREAM_IDIOSYNCRATIC,
    STREAM_TEST_AGGREGATE,
    STREAM_TEST_IDIOSYNCRATIC,
    CudaPanel,
    MultiGpuPanel,
    PanelResult,
    aggregate_path,
    initial_employment,
    simulate_panel,
)
from kernels.timing import StageTimer


@dataclass(frozen=True)
class SolveSettings:
    n_agents: int = 10_000
    periods: int = 1_100
    burn_in: int = 100
    tolerance: float = 1e-7
    damping: float = 0.3
    max_iterations: int = 100
    interpolation: Method = "catmull_rom"
    precision: str = "float64"
    seed: int = 0
    policy: PolicySettings = field(default_factory=PolicySettings)
    den_haan_periods: int | None = None  # None: as many as ``periods``; 0 skips the test; else >= 10
    initial_alm: tuple[float, float, float, float] = (0.0, 1.0, 0.0, 1.0)  # MMV / Algorithm A.1 start
    panel_graph: bool = True  # GPU: replay the panel's period loop as captured CUDA graphs (same bits)
    gpus: int = 1  # > 1: the full panel spread over GPUs 0 .. gpus - 1 of the host (MultiGpuPanel)
    alm_update: str = "damped"  # "damped": B <- damping B_new + (1 - damping) B; "anderson": see AndersonUpdate
    # > 0 and < n_agents: first solve on a panel of this many agents (to tolerance coarse_tolerance), then start
    # the full panel from its ALM, policy and final distribution (tiled); the full panel's first final
    # distribution becomes its start panel, held fixed from then on
    coarse_agents: int = 0
    coarse_tolerance: float = 1e-5
    coarse_first_step: float | None = None  # Anderson's first full-panel step (None: damping)
    # "panel": the ALM is fitted to the N-agent panel's K; "histogram": to the mean of a non-stochastic histogram
    # of the cross-section (Young 2010; MMV's AGGREGATE_NS) moved along the same aggregate path: no idiosyncratic
    # sampling noise in K, so the ALM is the policy's own law of motion (docs/ks.md, "Fitting the ALM")
    alm_simulation: str = "panel"
    histogram_nodes: int = 2001  # capital nodes of the histogram, uniform on [k_min, histogram_top(grids)]


@dataclass
class Solution:
    alm: np.ndarray  # coefficients of the last regression [b0_bad, b1_bad, b0_good, b1_good]
    regressions: tuple[alm_mod.StateRegression, alm_mod.StateRegression]
    iterations: int
    converged: bool
    last_change: float
    policy: Any  # (2, 2, k_size, K_size) on xp
    capital_path: np.ndarray
    a_path: np.ndarray
    policy_iterations: list[int]
    den_haan_max: float | None = None
    den_haan_mean: float | None = None
    den_haan_panel: np.ndarray | None = None
    den_haan_alm: np.ndarray | None = None
    den_haan_a: np.ndarray | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    panel_graph: bool = False  # whether the outer loop's panel ran as captured CUDA graphs
    final_k: Any = None  # the last simulation's final panel (k_T, eps_T) on xp
    final_distribution: np.ndarray | None = None  # histogram mode: the final (2, J) conditional distributions
    final_employed: Any = None
    coarse_iterations: int = 0  # outer iterations on the coarse panel (SolveSettings.coarse_agents)
    alm_jacobian: np.ndarray | None = None  # estimate_jacobian: dF/dB at the last evaluated ALM (finite differences)
    jacobian_simulations: int = 0  # panel simulations spent on alm_jacobian (this panel's or the coarse stage's)
    warnings: list[str] = field(default_factory=list)  # what a user must know about a returned solution


Reporter = Callable[[float, str], None]

MIN_DEN_HAAN_PERIODS = 10  # shortest accuracy-test path: 0 skips the test, 1 .. 9 are refused
# Shortest panel after burn_in: the regression of each aggregate state needs three periods (its standard error
# divides by n - 2), and a path of a few periods may not visit both states.
MIN_REGRESSION_PERIODS = 10
ALM_SIMULATIONS = ("panel", "histogram")


def den_haan_test_periods(settings: SolveSettings) -> int:
    """Length of the Den Haan test path (0: no test)."""
    periods = settings.periods if settings.den_haan_periods is None else settings.den_haan_periods
    assert not 0 < periods < MIN_DEN_HAAN_PERIODS, (
        f"den_haan_periods must be 0 (skip the accuracy test) or at least {MIN_DEN_HAAN_PERIODS}, not {periods}")
    return periods


@dataclass(frozen=True)
class GridEdgeProblem:
    message: str
    every_period: bool  # every period after burn_in was clipped


def capital_grid_problem(capital_path: np.ndarray, grids: Grids, burn_in: int,
                         cal: Calibration) -> GridEdgeProblem | None:
    """What is wrong when the simulated K after burn_in touched the K grid's edges (the panel clips K there, so
    the ALM would be fitted to the grid's edge, not to the economy), else None."""
    after = np.asarray(capital_path[burn_in:], dtype=np.float64)
    at_min, at_max = int(np.count_nonzero(after <= grids.K_min)), int(np.count_nonzero(after >= grids.K_max))
    if at_min == 0 and at_max == 0:
        return None
    steady = cal.steady_state_capital
    low = min(0.79 * steady, grids.K_min if at_min == 0 else 0.8 * grids.K_min)
    high = max(1.32 * steady, grids.K_max if at_max == 0 else 1.25 * grids.K_max)
    edges = " and ".join(
        f"its {name} {value:g} in {count} of {after.size} periods"
        for name, value, count in (("min", grids.K_min, at_min), ("max", grids.K_max, at_max)) if count
    )
    message = (
        f"aggregate capital left the K grid: the simulated K after burn_in was clipped to {edges} "
        f"(mean capital {after.mean():.4g}, K_grid [{grids.K_min:g}, {grids.K_max:g}]), so the law of motion would "
        f"describe the grid's edge, not the economy. Widen K_grid so that it holds the simulated K, e.g. "
        f"K_grid {{min: {low:.3g}, max: {high:.3g}}} around the deterministic steady state {steady:.4g}"
    )
    return GridEdgeProblem(message, at_min + at_max == after.size)


def degenerate_regression_message(regressions: tuple[alm_mod.StateRegression, ...]) -> str | None:
    """A message when a state's regression fits exactly (se = 0): K then follows a deterministic path, which a
    panel hit by aggregate and idiosyncratic shocks does not; the law of motion would not have been estimated."""
    for name, fit in zip(("bad", "good"), regressions, strict=True):
        if not fit.se > 0.0:
            return (f"the ALM regression of the {name} state fits exactly (se = 0, slope {fit.slope:.6g}, intercept "
                    f"{fit.intercept:.6g}): aggregate capital does not respond to the shocks; check that K_grid holds "
                    f"the simulated K and that n_agents and periods are not degenerate")
    return None


def policy_failure_message(policy: PolicySettings, last_change: float, iteration: int) -> str:
    """The error of a policy step that did not converge, naming the remedy that works."""
    where = (f"the policy step did not converge in policy_max_iterations={policy.max_iterations} at outer iteration "
             f"{iteration} (last change {last_change:.3g} against policy_tolerance {policy.tolerance:g})")
    if policy.method == "time_iteration":
        return (f"{where}: time iteration stalls where the borrowing constraint and low incomes (e.g. mu = 0) make "
                f"the Euler map oscillate; set policy_method 'egm' (the endogenous grid method converges undamped "
                f"there), or else lower policy_damping (e.g. 0.3) and raise policy_max_iterations")
    return (f"{where}: raise policy_max_iterations (EGM contracts at about beta per step), or loosen policy_tolerance; "
            f"a policy_damping below 1 slows it down")


def outer_loop_warning(settings: SolveSettings, change: float) -> str:
    return (f"not converged: the outer loop stopped at max_iterations={settings.max_iterations} with "
            f"||B_new - B|| = {change:.3g} above tolerance {settings.tolerance:g}; the ALM is the last regression, "
            f"not a fixed point: raise max_iterations or start from it (initial_alm)")


class DampedUpdate:
    """B <- damping B_new + (1 - damping) B (MMV): linear convergence at rate >= 1 - damping."""

    def __init__(self, damping: float) -> None:
        self.damping = damping

    def restart(self) -> None:
        pass

    def __call__(self, alm: np.ndarray, alm_new: np.ndarray) -> np.ndarray:
        return self.damping * alm_new + (1.0 - self.damping) * alm


class AndersonUpdate:
    """Anderson acceleration (type II, Walker & Ni 2011) of the fixed point B = F(B), F = simulate-and-regress.

    With the residuals f_i = F(B_i) - B_i of the last ``memory + 1`` iterations, gamma minimises
    ||f_k - dF gamma|| (dF the differences of consecutive f, dG of consecutive F(B)), and
    B_{k+1} = B_k + damping f_k - (dX + damping dF) gamma. The first step is B_k + first_step f_k (first_step
    defaults to damping), a step after a restart the damped one. A step longer than ``max_growth`` times
    ||f_k|| (an ill-conditioned history; a contraction at rate q has its fixed point ||f_k|| / (1 - q) away) is
    replaced by the damped step and the history restarts. ``restart`` is called when the map changes (the
    start panel is fixed).
    """

    def __init__(self, damping: float, memory: int = 4, max_growth: float = 100.0,
                 first_step: float | None = None) -> None:
        self.damping, self.memory, self.max_growth = damping, memory, max_growth
        self.first_step = damping if first_step is None else first_step  # the weight of B_new in a first step
        self.points: list[np.ndarray] = []
        self.residuals: list[np.ndarray] = []

    def restart(self) -> None:
        self.points, self.residuals = [], []
        self.first_step = self.damping  # a full first step only at the very start

    def __call__(self, alm: np.ndarray, alm_new: np.ndarray) -> np.ndarray:
        residual = alm_new - alm
        self.points = [*self.points, alm.copy()][-(self.memory + 1):]
        self.residuals = [*self.residuals, residual][-(self.memory + 1):]
        damped = alm + self.damping * residual
        if len(self.points) < 2:
            return alm + self.first_step * residual
        d_x = np.diff(np.array(self.points), axis=0).T  # (4, m)
        d_f = np.diff(np.array(self.residuals), axis=0).T
        gamma = np.linalg.lstsq(d_f, residual, rcond=1e-10)[0]
        step = self.damping * residual - (d_x + self.damping * d_f) @ gamma
        if not np.all(np.isfinite(step)) or np.linalg.norm(step) > self.max_growth * np.linalg.norm(residual):
            self.restart()
            return damped
        return alm + step


class NewtonUpdate:
    """Quasi-Newton steps on the residual R(B) = F(B) - B of the fixed point B = F(B), F = simulate-and-regress.

    ``jacobian`` estimates dF/dB (4 x 4; in the staged solve the coarse panel's, by finite differences: see
    :func:`alm_jacobian`); the step is B <- B - (J - I)^-1 R(B). Between steps, (J - I) takes the Broyden
    ("good") rank-one update from the secant pair (B_k - B_{k-1}, R_k - R_{k-1}), so it learns the full panel's
    map. A step after which ||R|| did not fall (the map is not as linear as J says) is followed by the damped
    step B + damping R instead; after ``max_failures`` such steps only damped steps are taken (MMV's update,
    which converges where the map contracts). A Newton step longer than ``max_growth`` ||R|| (J - I nearly
    singular) is replaced by the damped step too. ``restart`` (the map changed) forgets the secant history.
    """

    def __init__(self, jacobian: np.ndarray, damping: float, max_failures: int = 3, max_growth: float = 1e4) -> None:
        jacobian = np.asarray(jacobian, dtype=np.float64)
        if jacobian.shape != (4, 4) or not np.all(np.isfinite(jacobian)):
            raise ValueError(f"the ALM Jacobian must be a finite 4 x 4 matrix, not shape {jacobian.shape}")
        self.residual_jacobian = jacobian - np.eye(4)  # d(F(B) - B)/dB
        self.damping, self.max_failures, self.max_growth = damping, max_failures, max_growth
        self.previous: tuple[np.ndarray, np.ndarray] | None = None
        self.failures = 0
        self.last_step = "none"  # "newton" or "damped": what the last call returned (tests, history)

    def restart(self) -> None:
        self.previous = None

    def __call__(self, alm: np.ndarray, alm_new: np.ndarray) -> np.ndarray:
        residual = alm_new - alm
        reduced = True
        if self.previous is not None:
            last_alm, last_residual = self.previous
            self._broyden(alm - last_alm, residual - last_residual)
            reduced = bool(np.linalg.norm(residual) < np.linalg.norm(last_residual))
        self.previous = (alm.copy(), residual.copy())
        damped = alm + self.damping * residual
        if not reduced:
            self.failures += 1
        if not reduced or self.failures >= self.max_failures:
            self.last_step = "damped"
            return damped
        try:
            step = -np.linalg.solve(self.residual_jacobian, residual)
        except np.linalg.LinAlgError:
            step = np.full(4, np.nan)
        if not np.all(np.isfinite(step)) or np.linalg.norm(step) > self.max_growth * np.linalg.norm(residual):
            self.last_step = "damped"
            return damped
        self.last_step = "newton"
        return alm + step

    def _broyden(self, d_alm: np.ndarray, d_residual: np.ndarray) -> None:
        size = float(d_alm @ d_alm)
        if size > 0.0:
            self.residual_jacobian = self.residual_jacobian + np.outer(
                d_residual - self.residual_jacobian @ d_alm, d_alm) / size


ALM_UPDATES = ("damped", "anderson", "newton")


def outer_progress(iteration: int, max_iterations: int, history: list[dict[str, float]], tolerance: float) -> float:
    """Share of the bar (up to 0.9) at the start of an outer iteration: the larger of the iteration count's
    share and the convergence's, log(first change / last change) / log(first change / tolerance), so a
    solve that converges in 8 of 100 allowed iterations does not sit at 8 % and jump to the end."""
    by_count = (iteration - 1) / max_iterations
    changes = [h["change"] for h in history if h.get("change", 0.0) > 0.0]
    by_convergence = 0.0
    if len(changes) >= 2 and changes[0] > tolerance:
        span = math.log(changes[0] / tolerance)
        by_convergence = min(1.0, max(0.0, math.log(changes[0] / max(changes[-1], tolerance)) / span))
    return 0.9 * max(by_count, by_convergence)


def alm_updater(settings: SolveSettings, near: bool = False,
                jacobian: np.ndarray | None = None) -> DampedUpdate | AndersonUpdate | NewtonUpdate:
    """The ALM update; ``near``: the start is already close (after the coarse stage), so Anderson's first step
    takes B_new whole (settings.coarse_first_step) instead of the damped step. "newton" needs ``jacobian``
    (the coarse stage's estimate of dF/dB)."""
    if settings.alm_update == "anderson":
        return AndersonUpdate(settings.damping, first_step=settings.coarse_first_step if near else None)
    if settings.alm_update == "newton":
        assert jacobian is not None, "alm_update 'newton' takes its Jacobian from the coarse stage"
        return NewtonUpdate(jacobian, settings.damping)
    assert settings.alm_update == "damped", f"alm_update {settings.alm_update!r}"
    return DampedUpdate(settings.damping)


# forecast change (in ln K') of each finite-difference perturbation of the ALM: small enough that F is linear
# over it (it moves the ALM's implied steady state by ~0.3 %), large against the policy tolerance's noise in F
JACOBIAN_STEP = 1e-4


def jacobian_directions(capital_path: np.ndarray, burn_in: int, step: float = JACOBIAN_STEP) -> np.ndarray:
    """(4, 4) columns: the ALM perturbations of the finite differences. Per state a shift (intercept + step) and
    a tilt about the mean of ln K (slope + step / sd, intercept - step mean / sd): intercept and slope alone are
    nearly collinear (ln K varies by ~1 % about ~3.7), so a slope step would move the forecast 3.7 / sd times
    more than an intercept step; these two move it by ``step`` at the mean and at one sd from it."""
    log_k = np.log(np.asarray(capital_path[burn_in:], dtype=np.float64))
    mean, sd = float(log_k.mean()), max(float(log_k.std()), 1e-6)
    directions = np.zeros((4, 4))
    for state in (0, 1):
        directions[2 * state, 2 * state] = step
        directions[2 * state: 2 * state + 2, 2 * state + 1] = (-step * mean / sd, step / sd)
    return directions


def alm_jacobian(evaluate: Callable[[np.ndarray], np.ndarray], alm: np.ndarray, alm_new: np.ndarray,
                 directions: np.ndarray) -> np.ndarray:
    """dF/dB at ``alm`` by forward differences along ``directions`` (columns), F(alm) = ``alm_new`` given:
    J = [F(alm + d_j) - F(alm)]_j D^-1."""
    differences = np.stack([evaluate(alm + directions[:, j]) - alm_new for j in range(directions.shape[1])], axis=1)
    return differences @ np.linalg.inv(directions)


def histogram_top(grids: Grids) -> float:
    """Top node of the solve's histogram: four times the K grid's max (200 for the default K grid [30, 50], with
    2,001 nodes the JEDC test's spacing of 0.1; its [0, 100] can cut off the right tail of a solution fitted on a
    short path), within the k grid. Mass that would go beyond it is caught by :func:`histogram_top_problem`."""
    return min(grids.k_max, 4.0 * grids.K_max)


def initial_histogram(k_nodes: np.ndarray, start_capital: float, initial_k: np.ndarray | None,
                      initial_employed: np.ndarray | None) -> np.ndarray:
    """(2, J) conditional distributions (unemployed, employed) to start the histogram: every agent at
    ``start_capital``, or the given cross-section (each agent's mass split between its two nodes)."""
    size = k_nodes.size
    if initial_k is None:
        values = np.array([start_capital])
        employed = None
    else:
        values = np.asarray(initial_k, dtype=np.float64)
        employed = None if initial_employed is None else np.asarray(initial_employed).astype(bool)
    low, weight_high = accuracy.lottery(k_nodes, values)
    rows = []
    for state in (False, True):
        chosen = np.ones(values.size, dtype=bool) if employed is None else employed == state
        if not chosen.any():  # nobody in this state: the other state's shape
            chosen = np.ones(values.size, dtype=bool)
        row = (np.bincount(low[chosen], 1.0 - weight_high[chosen], minlength=size)
               + np.bincount(low[chosen] + 1, weight_high[chosen], minlength=size))
        rows.append(row / row.sum())
    return np.stack(rows)


HISTOGRAM_TOP_MASS = 1e-6  # the most mass of an employment state a solution's histogram may hold on its top node


def histogram_mass_at_top(distribution: np.ndarray) -> float:
    return float(distribution[:, -1].max())


def simulate_histogram(cal: Calibration, grids: Grids, settings: SolveSettings, policy: Any, k_nodes: np.ndarray,
                       start: np.ndarray, a_path: np.ndarray,
                       checkpoint: Callable[[int], None] | None = None) -> accuracy.HistogramPath:
    """K_0 .. K_{T-1} of the histogram along ``a_path`` (a_0 .. a_T) and its distribution at T."""
    inputs = AccuracyInputs(a_path=np.asarray(a_path, dtype=np.int8), k_nodes=k_nodes, distribution=start,
                            name="solve")
    path = accuracy.histogram_path(cal, grids, settings.interpolation, policy, inputs, periods=a_path.size,
                                   checkpoint=checkpoint)
    return accuracy.HistogramPath(path.capital[:-1], path.distribution)


def histogram_top_problem(distribution: np.ndarray, k_nodes: np.ndarray) -> str | None:
    """A message when the solution's histogram piles mass on its top node (the policy takes agents beyond it,
    and the lottery keeps them there, so K would be understated)."""
    top = histogram_mass_at_top(distribution)
    if top <= HISTOGRAM_TOP_MASS:
        return None
    return (f"the histogram's top node {k_nodes[-1]:g} holds {top:.2g} of an employment state's mass: the policy takes "
            f"agents beyond it, so K would be understated; widen K_grid (the histogram reaches four times its max) or "
            f"raise k_grid.max")


def initial_panel(xp: ModuleType, cal: Calibration, settings: SolveSettings,
                  initial_k: np.ndarray | None = None, initial_employed: np.ndarray | None = None,
                  first_state: int = 0) -> tuple[Any, Any]:
    """Starting panel: every agent at the steady state (MMV) unless ``initial_k`` is given; employment drawn
    with the bad state's unemployment rate unless ``initial_employed`` is given. A shorter given
    distribution is tiled: agent i takes entry i mod len."""
    dtype = np.float64 if settings.precision == "float64" else np.float32
    n = settings.n_agents
    if initial_k is None:
        k = xp.full(n, cal.steady_state_capital, dtype=dtype)
    else:
        k = xp.asarray(np.resize(np.asarray(initial_k, dtype=np.float64), n).astype(dtype))
    if initial_employed is None:
        employed = initial_employment(xp, cal, settings.seed, n, first_state)
    else:
        employed = xp.asarray(np.resize(np.asarray(initial_employed), n).astype(np.uint8))
    return k, employed


def check_settings(xp: ModuleType, settings: SolveSettings) -> int:
    """The Den Haan test's length (0: no test), after the solve's preconditions. ``KSSolveParams`` enforces each
    of them for a job (a failed assert is a caller's error); the one raised depends on the worker, not on the
    settings: a panel over several GPUs needs a GPU."""
    assert settings.burn_in + MIN_REGRESSION_PERIODS <= settings.periods, (
        f"burn_in must leave at least {MIN_REGRESSION_PERIODS} periods of the panel for the ALM regression")
    test_periods = den_haan_test_periods(settings)
    assert settings.alm_simulation in ALM_SIMULATIONS, f"alm_simulation {settings.alm_simulation!r}"
    histogram = settings.alm_simulation == "histogram"
    assert not (histogram and settings.coarse_agents), "coarse_agents stages the panel: not with a histogram"
    assert settings.alm_update in ALM_UPDATES, (
        f"alm_update must be one of {', '.join(ALM_UPDATES)}, not {settings.alm_update!r}")
    assert not (histogram and settings.gpus > 1), "gpus > 1 spreads a panel: not with a histogram"
    if settings.gpus > 1 and is_numpy(xp):
        raise ValueError(f"gpus = {settings.gpus} spreads the panel over GPUs: it needs a GPU worker and "
                         "alm_simulation 'panel'")
    assert settings.alm_update != "newton" or is_staged(settings), (
        "alm_update 'newton' takes its Jacobian from the coarse stage: set coarse_agents")
    return test_periods


def is_staged(settings: SolveSettings) -> bool:
    """Whether a coarse panel is solved first (``coarse_agents``)."""
    return 0 < settings.coarse_agents < settings.n_agents


@dataclass(frozen=True)
class SolveRun:
    """What every stage of one solve reads: the economy, the settings, the backend and where timings and
    progress go. ``on_device``: the policy step and the panel run as CUDA kernels."""

    xp: ModuleType
    cal: Calibration
    grids: Grids
    settings: SolveSettings
    timer: StageTimer
    report: Reporter
    on_device: bool

    @property
    def histogram(self) -> bool:
        return self.settings.alm_simulation == "histogram"


@dataclass
class Simulation:
    """The outer loop's fixed parts: the policy problem, the aggregate path, the histogram's nodes (histogram
    mode) and the panel engine (on the device: one configuration, its buffers and captured loop reused by every
    iteration)."""

    problem: EulerProblem
    a_path: np.ndarray
    k_nodes: np.ndarray | None
    engine: CudaPanel | MultiGpuPanel | None


@dataclass
class OuterState:
    """What the outer loop carries from one iteration to the next."""

    alm: np.ndarray  # B, the ALM the next policy step solves for
    policy: Any
    update: DampedUpdate | AndersonUpdate | NewtonUpdate
    k_start: Any = None  # the start panel (panel mode)
    e_start: Any = None
    hist_start: np.ndarray | None = None  # the start distribution (histogram mode)
    start_fixed: bool = False  # from here on every iteration evaluates one map
    policy_iterations: list[int] = field(default_factory=list)
    history: list[dict[str, float]] = field(default_factory=list)
    iteration: int = 0
    change: float = float("inf")
    converged: bool = False
    regressions: tuple[alm_mod.StateRegression, alm_mod.StateRegression] | None = None
    capital_path: np.ndarray = field(default_factory=lambda: np.empty(0))
    panel: PanelResult | None = None  # the last simulation's panel ...
    hist: accuracy.HistogramPath | None = None  # ... or histogram
    last_alm: np.ndarray | None = None  # the last regression's B_new
    last_point: np.ndarray | None = None  # the B it was simulated at


def solve_coarse(run: SolveRun, initial_k: np.ndarray | None, initial_employed: np.ndarray | None,
                 use_kernels: bool | None) -> Solution | None:
    """The same solve on a small panel (None unless staged): it finds the ALM and an ergodic distribution
    cheaply, so the full panel only refines the ALM (its start held fixed, so every full iteration evaluates one
    map). For "newton" the coarse stage runs Anderson and then estimates the map's Jacobian on its panel (coarse
    simulations cost N_coarse / N of a full one); the full panel takes quasi-Newton steps with it."""
    settings = run.settings
    if not is_staged(settings):
        return None
    newton = settings.alm_update == "newton"
    coarse_settings = replace(settings, n_agents=settings.coarse_agents, coarse_agents=0, gpus=1,
                              tolerance=max(settings.coarse_tolerance, settings.tolerance), den_haan_periods=0,
                              alm_update="anderson" if newton else settings.alm_update)
    return solve(run.xp, run.cal, run.grids, coarse_settings, run.timer, run.report, initial_k, initial_employed,
                 use_kernels, estimate_jacobian=newton)


def panel_engine(run: SolveRun, dtype: Any, a_path: np.ndarray) -> CudaPanel | MultiGpuPanel | None:
    """The device's panel engine (None for NumPy and the histogram): the outer loop simulates the same
    configuration (N, shock path, seed) every iteration, the new policy and start panel copied in place."""
    settings = run.settings
    if not run.on_device or run.histogram:
        return None
    if settings.gpus > 1:
        return MultiGpuPanel(run.xp, run.cal, run.grids, settings.interpolation, dtype, settings.n_agents, a_path,
                             settings.seed, STREAM_IDIOSYNCRATIC, tuple(range(settings.gpus)))
    return CudaPanel(run.xp, run.cal, run.grids, settings.interpolation, dtype, settings.n_agents, a_path,
                     settings.seed, STREAM_IDIOSYNCRATIC, use_graph=settings.panel_graph)


def set_up(run: SolveRun, coarse: Solution | None, initial_k: np.ndarray | None,
           initial_employed: np.ndarray | None) -> tuple[Simulation, OuterState]:
    """The loop's fixed parts and its first state: the start policy, panel or histogram and ALM (the coarse
    stage's where there is one)."""
    settings, grids = run.settings, run.grids
    with run.timer.stage("setup"):
        problem = EulerProblem(run.xp, run.cal, grids, settings.interpolation)
        policy = initial_policy(run.xp, grids) if coarse is None else coarse.policy
        a_path = aggregate_path(run.cal, settings.seed, settings.periods + 1)
        k_nodes = hist_start = k_start = e_start = None
        if run.histogram:  # no panel: the cross-section is a histogram on k_nodes, moved on the host
            k_nodes = np.linspace(grids.k_min, histogram_top(grids), settings.histogram_nodes)
            hist_start = initial_histogram(k_nodes, run.cal.steady_state_capital, initial_k, initial_employed)
        elif coarse is None:
            k_start, e_start = initial_panel(run.xp, run.cal, settings, initial_k, initial_employed, int(a_path[0]))
        else:
            reps = -(-settings.n_agents // settings.coarse_agents)
            k_start = run.xp.tile(coarse.final_k, reps)[: settings.n_agents].copy()
            e_start = run.xp.tile(coarse.final_employed, reps)[: settings.n_agents].copy()
        engine = None if k_start is None else panel_engine(run, k_start.dtype, a_path)
    alm = np.array(settings.initial_alm if coarse is None else coarse.alm, dtype=np.float64)
    update = alm_updater(settings, near=coarse is not None, jacobian=None if coarse is None else coarse.alm_jacobian)
    state = OuterState(alm, policy, update, k_start, e_start, hist_start, start_fixed=coarse is not None,
                       policy_iterations=[] if coarse is None else list(coarse.policy_iterations),
                       history=[] if coarse is None else list(coarse.history))
    return Simulation(problem, a_path, k_nodes, engine), state


def policy_step(run: SolveRun, simulation: Simulation, state: OuterState, fraction: float) -> int:
    """Solve the policy for the current ALM (from the last policy); its Euler iterations."""
    iteration = state.iteration

    def checkpoint(step: int) -> None:
        run.report(fraction, f"iteration {iteration}: policy step {step}")

    with run.timer.stage("policy"):
        solved = solve_policy(run.xp, simulation.problem, state.alm, state.policy, run.settings.policy,
                              use_kernel=run.on_device, checkpoint=checkpoint)
    state.policy = solved.policy
    state.policy_iterations.append(solved.iterations)
    if not solved.converged:
        raise ValueError(policy_failure_message(run.settings.policy, solved.max_change, iteration))
    return solved.iterations


def simulation_step(run: SolveRun, simulation: Simulation, state: OuterState, fraction: float) -> None:
    """Simulate the panel (or the histogram) under the current policy from the start; K's path in the state."""
    settings, iteration = run.settings, state.iteration

    def checkpoint(t: int) -> None:
        run.report(fraction, f"iteration {iteration}: panel period {t}/{settings.periods}")

    with run.timer.stage("histogram" if run.histogram else "panel"):
        if run.histogram:
            state.hist = simulate_histogram(run.cal, run.grids, settings, state.policy, simulation.k_nodes,
                                            state.hist_start, simulation.a_path, checkpoint)
            state.capital_path = state.hist.capital
            return
        if simulation.engine is not None:
            state.panel = simulation.engine.simulate(state.policy, state.k_start, state.e_start, checkpoint)
        else:
            state.panel = simulate_panel(run.xp, run.cal, run.grids, settings.interpolation, state.policy,
                                         state.k_start, state.e_start, simulation.a_path, settings.seed,
                                         STREAM_IDIOSYNCRATIC, checkpoint, use_kernel=False)
        state.capital_path = state.panel.capital_path


def regression_step(run: SolveRun, simulation: Simulation, state: OuterState) -> np.ndarray:
    """B_new, the regression of the simulated K (refused when K sat on the grid's edge in every period after
    burn_in, or when a state's regression fits exactly); its distance to B is ``state.change``."""
    settings = run.settings
    edge = capital_grid_problem(state.capital_path, run.grids, settings.burn_in, run.cal)
    if edge is not None and edge.every_period:  # nothing left to regress on: no later iteration can help
        if state.iteration == 1:
            raise ValueError(edge.message)
        raise ValueError(f"at outer iteration {state.iteration} (ALM {np.round(state.alm, 6).tolist()}): "
                         f"{edge.message}; or, if the first iterations stayed inside the grid, lower damping (now "
                         f"{settings.damping:g}) so that the ALM update does not overshoot")
    state.regressions = alm_mod.regress_alm(state.capital_path, simulation.a_path, settings.burn_in)
    degenerate = degenerate_regression_message(state.regressions)
    if degenerate is not None:
        raise ValueError(degenerate)
    alm_new = alm_mod.coefficients(*state.regressions)
    state.change = float(np.linalg.norm(alm_new - state.alm))
    return alm_new


def record_iteration(run: SolveRun, state: OuterState, alm_new: np.ndarray, policy_iterations: int,
                     started: float) -> None:
    state.history.append({"iteration": state.iteration, "n_agents": run.settings.n_agents, "change": state.change,
                          "seconds": time.perf_counter() - started, "policy_iterations": policy_iterations,
                          **{f"b{i}": float(v) for i, v in enumerate(alm_new)}})
    state.last_alm, state.last_point = alm_new, state.alm.copy()


def advance(run: SolveRun, state: OuterState, alm_new: np.ndarray, staged: bool,
            jacobian: np.ndarray | None) -> None:
    """The next B and start: while ||B_new - B|| > 100 tolerance the next simulation starts from this one's
    final panel (or distribution); then the start is fixed and the update's history restarts (one map)."""
    settings = run.settings
    if staged and state.iteration == 1:
        # the tiled coarse panel carries the coarse sample's error in its mean: start the full panel from its
        # own first final distribution (then fixed), the coarse stage having made it ergodic; the map changed,
        # so a fresh update (its first step takes first_step of B_new)
        assert state.panel is not None
        state.k_start, state.e_start = state.panel.k, state.panel.employed
        state.alm = state.update(state.alm, alm_new)
        state.update = alm_updater(settings, near=True, jacobian=jacobian)
        return
    if state.change > 100.0 * settings.tolerance and not state.start_fixed:
        if state.hist is not None:
            state.hist_start = state.hist.distribution
        else:
            assert state.panel is not None
            state.k_start, state.e_start = state.panel.k, state.panel.employed
    elif not state.start_fixed:  # from here on every iteration evaluates one map: a fresh history for it
        state.start_fixed = True
        state.update.restart()
    state.alm = state.update(state.alm, alm_new)


def has_converged(run: SolveRun, state: OuterState) -> bool:
    return state.change < run.settings.tolerance


def outer_loop(run: SolveRun, simulation: Simulation, state: OuterState, coarse: Solution | None) -> None:
    """Policy, simulation, regression and update until ||B_new - B|| < tolerance or max_iterations."""
    settings = run.settings
    jacobian = None if coarse is None else coarse.alm_jacobian
    started = time.perf_counter()
    shown = 0.0  # the progress bar never goes back
    for iteration in range(1, settings.max_iterations + 1):
        state.iteration = iteration
        shown = fraction = max(shown, outer_progress(iteration, settings.max_iterations, state.history,
                                                     settings.tolerance))
        run.report(fraction, f"iteration {iteration}: policy")
        policy_iterations = policy_step(run, simulation, state, fraction)
        run.report(fraction, f"iteration {iteration}: panel")
        simulation_step(run, simulation, state, fraction)
        with run.timer.stage("regression"):
            alm_new = regression_step(run, simulation, state)
            record_iteration(run, state, alm_new, policy_iterations, started)
            advance(run, state, alm_new, coarse is not None, jacobian)
        if has_converged(run, state):
            state.converged = True
            return


def final_jacobian(run: SolveRun, simulation: Simulation, state: OuterState) -> np.ndarray:
    """dF/dB of the final (fixed-start) map at the last evaluated ALM, by finite differences (4 more policy
    solves and simulations)."""
    settings = run.settings

    def evaluate_map(point: np.ndarray) -> np.ndarray:
        """F(point): the policy for ``point`` (warm from the last one), the panel from the fixed start, the
        regression."""
        solved = solve_policy(run.xp, simulation.problem, point, state.policy, settings.policy,
                              use_kernel=run.on_device)
        if not solved.converged:
            raise ValueError(policy_failure_message(settings.policy, solved.max_change, state.iteration))
        if simulation.engine is not None:
            path = simulation.engine.simulate(solved.policy, state.k_start, state.e_start).capital_path
        else:
            path = simulate_panel(run.xp, run.cal, run.grids, settings.interpolation, solved.policy, state.k_start,
                                  state.e_start, simulation.a_path, settings.seed, STREAM_IDIOSYNCRATIC,
                                  use_kernel=False).capital_path
        return alm_mod.coefficients(*alm_mod.regress_alm(path, simulation.a_path, settings.burn_in))

    assert state.last_point is not None and state.last_alm is not None
    run.report(0.9, "ALM Jacobian")
    with run.timer.stage("jacobian"):
        return alm_jacobian(evaluate_map, state.last_point, state.last_alm,
                            jacobian_directions(state.capital_path, settings.burn_in))


def check_final_simulation(run: SolveRun, state: OuterState) -> None:
    """ValueError when the final simulation's K was clipped at the K grid's edge: the ALM would describe the
    grid's edge."""
    edge = capital_grid_problem(state.capital_path, run.grids, run.settings.burn_in, run.cal)
    if edge is not None:
        raise ValueError(edge.message)


def solution_warnings(run: SolveRun, simulation: Simulation, state: OuterState) -> list[str]:
    """What a user must know about the returned solution; ValueError where it is none (a converged histogram
    cut off at its top node)."""
    warnings = [] if state.converged else [outer_loop_warning(run.settings, state.change)]
    top_problem = None if state.hist is None else histogram_top_problem(state.hist.distribution, simulation.k_nodes)
    if top_problem is not None:  # a fixed point with a cut-off distribution is no solution; a stop on the way is
        if state.converged:      # already flagged as not converged, and says why its K may be off
            raise ValueError(top_problem)
        warnings.append(top_problem)
    return warnings


def make_solution(simulation: Simulation, state: OuterState, coarse: Solution | None,
                  jacobian: np.ndarray | None, warnings: list[str]) -> Solution:
    assert state.regressions is not None and state.last_alm is not None
    engine, panel, hist = simulation.engine, state.panel, state.hist
    return Solution(state.last_alm, state.regressions, state.iteration, state.converged, state.change, state.policy,
                    state.capital_path, simulation.a_path, state.policy_iterations, history=state.history,
                    panel_graph=isinstance(engine, CudaPanel) and engine.graph_used, warnings=warnings,
                    final_k=None if panel is None else panel.k,
                    final_employed=None if panel is None else panel.employed,
                    final_distribution=None if hist is None else hist.distribution,
                    coarse_iterations=0 if coarse is None else coarse.iterations,
                    alm_jacobian=jacobian,
                    jacobian_simulations=4 if jacobian is not None else
                    0 if coarse is None else coarse.jacobian_simulations)


def den_haan_test(run: SolveRun, simulation: Simulation, state: OuterState, solution: Solution,
                  test_periods: int) -> None:
    """Den Haan's accuracy test of the solution's ALM on a fresh path of ``test_periods`` periods, into
    ``solution``. The path starts in the aggregate state that drew the panel's final employment states."""
    settings = run.settings
    run.report(0.95, "Den Haan accuracy test")

    def checkpoint(t: int) -> None:
        run.report(0.95, f"Den Haan accuracy test: period {t}/{test_periods}")

    with run.timer.stage("den_haan_test"):
        test_a = aggregate_path(run.cal, settings.seed, test_periods + 1, STREAM_TEST_AGGREGATE,
                                int(simulation.a_path[-1]))
        if state.hist is not None:  # the same simulation as the solve's: the histogram, from its final distribution
            test_capital = simulate_histogram(run.cal, run.grids, settings, state.policy, simulation.k_nodes,
                                              state.hist.distribution, test_a, checkpoint).capital
        else:  # one simulation only: the plain per-period loop (capturing would cost what it saves)
            assert state.panel is not None
            test_capital = simulate_panel(run.xp, run.cal, run.grids, settings.interpolation, state.policy,
                                          state.panel.k, state.panel.employed, test_a, settings.seed,
                                          STREAM_TEST_IDIOSYNCRATIC, checkpoint,
                                          use_kernel=run.on_device).capital_path
        max_gap, mean_gap, implied = alm_mod.den_haan_errors(test_capital, test_a, solution.alm)
    solution.den_haan_max, solution.den_haan_mean = max_gap, mean_gap
    solution.den_haan_panel, solution.den_haan_alm, solution.den_haan_a = test_capital, implied, test_a[:-1]


def _no_report(fraction: float, stage: str) -> None:
    pass


def solve(
    xp: ModuleType,
    cal: Calibration,
    grids: Grids,
    settings: SolveSettings,
    timer: StageTimer | None = None,
    report: Reporter | None = None,
    initial_k: np.ndarray | None = None,
    initial_employed: np.ndarray | None = None,
    use_kernels: bool | None = None,
    estimate_jacobian: bool = False,
) -> Solution:
    """The KS solve; ``estimate_jacobian``: also estimate dF/dB of the final (fixed-start) map by finite
    differences (:func:`alm_jacobian`, 4 more policy solves and simulations), for the "newton" update's full panel."""
    on_device = not is_numpy(xp) if use_kernels is None else use_kernels
    run = SolveRun(xp, cal, grids, settings, timer or StageTimer(xp), report or _no_report, on_device)
    test_periods = check_settings(xp, settings)  # before the solve, not after it
    coarse = solve_coarse(run, initial_k, initial_employed, use_kernels)
    simulation, state = set_up(run, coarse, initial_k, initial_employed)
    outer_loop(run, simulation, state, coarse)
    check_final_simulation(run, state)
    jacobian = final_jacobian(run, simulation, state) if estimate_jacobian and not run.histogram else None
    solution = make_solution(simulation, state, coarse, jacobian, solution_warnings(run, simulation, state))
    simulation.engine = None  # its buffers (N-sized) are not needed by the accuracy test
    if test_periods > 0:
        den_haan_test(run, simulation, state, solution, test_periods)
    return solution
