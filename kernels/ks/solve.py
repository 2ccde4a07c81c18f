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
from kernels.ks.model import Calibration, validate_calibration
from kernels.ks.policy import EulerProblem, PolicySettings, initial_policy, solve_policy
from kernels.ks.simulate import (
    STREAM_IDIOSYNCRATIC,
    STREAM_TEST_AGGREGATE,
    STREAM_TEST_IDIOSYNCRATIC,
    CudaPanel,
    MultiGpuPanel,
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
    panel_gpus: int = 1  # > 1: the full panel spread over GPUs 0 .. panel_gpus - 1 of the host (MultiGpuPanel)
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


def den_haan_test_periods(settings: SolveSettings) -> int:
    """Length of the Den Haan test path (0: no test); ValueError for 1 .. MIN_DEN_HAAN_PERIODS - 1."""
    periods = settings.periods if settings.den_haan_periods is None else settings.den_haan_periods
    if 0 < periods < MIN_DEN_HAAN_PERIODS:
        raise ValueError(f"den_haan_periods must be 0 (skip the accuracy test) or at least {MIN_DEN_HAAN_PERIODS}, "
                         f"not {periods}")
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
        if jacobian is None:
            raise ValueError("alm_update 'newton' takes its Jacobian from the coarse stage: set coarse_agents "
                             "(> 0 and < n_agents)")
        return NewtonUpdate(jacobian, settings.damping)
    if settings.alm_update != "damped":
        raise ValueError(f"alm_update must be one of {', '.join(ALM_UPDATES)}, not {settings.alm_update!r}")
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
                       start: np.ndarray, a_path: np.ndarray) -> accuracy.HistogramPath:
    """K_0 .. K_{T-1} of the histogram along ``a_path`` (a_0 .. a_T) and its distribution at T."""
    inputs = AccuracyInputs(a_path=np.asarray(a_path, dtype=np.int8), k_nodes=k_nodes, distribution=start,
                            name="solve")
    path = accuracy.histogram_path(cal, grids, settings.interpolation, policy, inputs, periods=a_path.size)
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
    validate_calibration(cal)
    timer = timer or StageTimer(xp)
    report = report or (lambda fraction, stage: None)
    if settings.burn_in + 3 >= settings.periods:
        raise ValueError("burn_in must leave at least a few periods of the panel for the ALM regression")
    test_periods = den_haan_test_periods(settings)  # checked before the solve, not after it
    on_device = not is_numpy(xp) if use_kernels is None else use_kernels
    histogram = settings.alm_simulation == "histogram"
    if settings.alm_simulation not in ("panel", "histogram"):
        raise ValueError(f"alm_simulation must be 'panel' or 'histogram', not {settings.alm_simulation!r}")
    if histogram and settings.coarse_agents:
        raise ValueError("coarse_agents stages the panel: it has no meaning with alm_simulation 'histogram'")
    if settings.alm_update not in ALM_UPDATES:
        raise ValueError(f"alm_update must be one of {', '.join(ALM_UPDATES)}, not {settings.alm_update!r}")
    if settings.panel_gpus > 1 and (histogram or is_numpy(xp)):
        raise ValueError(f"gpus = {settings.panel_gpus} spreads the panel over GPUs: it needs a GPU worker and "
                         "alm_simulation 'panel'")
    newton = settings.alm_update == "newton"
    if newton and not 0 < settings.coarse_agents < settings.n_agents:
        alm_updater(settings)  # raises: Newton's Jacobian comes from the coarse stage
    coarse = None
    if 0 < settings.coarse_agents < settings.n_agents:
        # the same solve on a small panel finds the ALM and an ergodic distribution cheaply; the full panel then
        # only refines the ALM (its start held fixed, so every full iteration evaluates one map). For "newton" the
        # coarse stage runs Anderson and then estimates the map's Jacobian on its panel (coarse simulations cost
        # N_coarse / N of a full one); the full panel takes quasi-Newton steps with it
        coarse = solve(xp, cal, grids, replace(settings, n_agents=settings.coarse_agents, coarse_agents=0, panel_gpus=1,
                                                tolerance=max(settings.coarse_tolerance, settings.tolerance),
                                                den_haan_periods=0, alm_update="anderson" if newton
                                                else settings.alm_update),
                       timer, report, initial_k, initial_employed, use_kernels, estimate_jacobian=newton)
    with timer.stage("setup"):
        problem = EulerProblem(xp, cal, grids, settings.interpolation)
        policy = initial_policy(xp, grids) if coarse is None else coarse.policy
        a_path = aggregate_path(cal, settings.seed, settings.periods + 1)
        k_nodes = hist_start = None
        if histogram:  # no panel: the cross-section is a histogram on k_nodes, moved on the host
            k_nodes = np.linspace(grids.k_min, histogram_top(grids), settings.histogram_nodes)
            hist_start = initial_histogram(k_nodes, cal.steady_state_capital, initial_k, initial_employed)
        elif coarse is None:
            k_start, e_start = initial_panel(xp, cal, settings, initial_k, initial_employed, int(a_path[0]))
        else:
            reps = -(-settings.n_agents // settings.coarse_agents)
            k_start = xp.tile(coarse.final_k, reps)[: settings.n_agents].copy()
            e_start = xp.tile(coarse.final_employed, reps)[: settings.n_agents].copy()
        # the outer loop simulates the same configuration (N, shock path, seed) every iteration: one engine,
        # its buffers and captured loop reused, the new policy and start panel copied in place
        engine: CudaPanel | MultiGpuPanel | None = None
        if on_device and not histogram and settings.panel_gpus > 1:
            engine = MultiGpuPanel(xp, cal, grids, settings.interpolation, k_start.dtype, settings.n_agents, a_path,
                                   settings.seed, STREAM_IDIOSYNCRATIC, tuple(range(settings.panel_gpus)))
        elif on_device and not histogram:
            engine = CudaPanel(xp, cal, grids, settings.interpolation, k_start.dtype, settings.n_agents, a_path,
                               settings.seed, STREAM_IDIOSYNCRATIC, use_graph=settings.panel_graph)
    alm = np.array(settings.initial_alm if coarse is None else coarse.alm, dtype=np.float64)
    jacobian = None if coarse is None else coarse.alm_jacobian
    update = alm_updater(settings, near=coarse is not None, jacobian=jacobian)
    start_fixed = coarse is not None
    policy_iterations: list[int] = [] if coarse is None else list(coarse.policy_iterations)
    history: list[dict[str, float]] = [] if coarse is None else list(coarse.history)
    converged = False
    change = float("inf")
    iteration = 0
    regressions = None
    capital_path = np.empty(0)
    panel = hist = None
    started = time.perf_counter()
    shown = 0.0  # the progress bar never goes back
    for iteration in range(1, settings.max_iterations + 1):
        shown = fraction = max(shown, outer_progress(iteration, settings.max_iterations, history,
                                                     settings.tolerance))
        report(fraction, f"iteration {iteration}: policy")
        def policy_checkpoint(step: int, fraction: float = fraction, iteration: int = iteration) -> None:
            report(fraction, f"iteration {iteration}: policy step {step}")

        with timer.stage("policy"):
            solved = solve_policy(xp, problem, alm, policy, settings.policy, use_kernel=on_device,
                                  checkpoint=policy_checkpoint)
        policy = solved.policy
        policy_iterations.append(solved.iterations)
        if not solved.converged:
            raise ValueError(policy_failure_message(settings.policy, solved.max_change, iteration))
        report(fraction, f"iteration {iteration}: panel")

        def checkpoint(t: int, fraction: float = fraction, iteration: int = iteration) -> None:
            report(fraction, f"iteration {iteration}: panel period {t}/{settings.periods}")

        with timer.stage("histogram" if histogram else "panel"):
            if histogram:
                hist = simulate_histogram(cal, grids, settings, policy, k_nodes, hist_start, a_path)
                capital_path = hist.capital
            elif engine is not None:
                panel = engine.simulate(policy, k_start, e_start, checkpoint)
                capital_path = panel.capital_path
            else:
                panel = simulate_panel(xp, cal, grids, settings.interpolation, policy, k_start, e_start, a_path,
                                       settings.seed, STREAM_IDIOSYNCRATIC, checkpoint, use_kernel=False)
                capital_path = panel.capital_path
        with timer.stage("regression"):
            edge = capital_grid_problem(capital_path, grids, settings.burn_in, cal)
            if edge is not None and edge.every_period:  # nothing left to regress on: no later iteration can help
                if iteration == 1:
                    raise ValueError(edge.message)
                raise ValueError(f"at outer iteration {iteration} (ALM {np.round(alm, 6).tolist()}): {edge.message}; "
                                 f"or, if the first iterations stayed inside the grid, lower damping (now "
                                 f"{settings.damping:g}) so that the ALM update does not overshoot")
            regressions = alm_mod.regress_alm(capital_path, a_path, settings.burn_in)
            degenerate = degenerate_regression_message(regressions)
            if degenerate is not None:
                raise ValueError(degenerate)
            alm_new = alm_mod.coefficients(*regressions)
            change = float(np.linalg.norm(alm_new - alm))
            history.append({"iteration": iteration, "n_agents": settings.n_agents, "change": change,
                            "seconds": time.perf_counter() - started, "policy_iterations": solved.iterations,
                            **{f"b{i}": float(v) for i, v in enumerate(alm_new)}})
            last_alm, last_point = alm_new, alm.copy()
            if coarse is not None and iteration == 1:
                # the tiled coarse panel carries the coarse sample's error in its mean: start the full panel
                # from its own first final distribution (then fixed), the coarse stage having made it ergodic;
                # the map changed, so a fresh update (its first step takes first_step of B_new)
                k_start, e_start = panel.k, panel.employed
                alm = update(alm, alm_new)
                update = alm_updater(settings, near=True, jacobian=jacobian)
            else:
                if change > 100.0 * settings.tolerance and not start_fixed:
                    if hist is not None:
                        hist_start = hist.distribution
                    else:
                        k_start, e_start = panel.k, panel.employed
                elif not start_fixed:  # from here on every iteration evaluates one map: a fresh history for it
                    start_fixed = True
                    update.restart()
                alm = update(alm, alm_new)
        if change < settings.tolerance:
            converged = True
            break
    assert regressions is not None
    edge = capital_grid_problem(capital_path, grids, settings.burn_in, cal)
    if edge is not None:  # the final simulation's K was clipped: the ALM describes the grid's edge
        raise ValueError(edge.message)
    jacobian_estimate = None
    if estimate_jacobian and not histogram:
        def evaluate_map(point: np.ndarray, engine: CudaPanel | MultiGpuPanel | None = engine) -> np.ndarray:
            """F(point): the policy for ``point`` (warm from the last one), the panel from the fixed start, the
            regression."""
            solved = solve_policy(xp, problem, point, policy, settings.policy, use_kernel=on_device)
            if not solved.converged:
                raise ValueError(policy_failure_message(settings.policy, solved.max_change, iteration))
            if engine is not None:
                path = engine.simulate(solved.policy, k_start, e_start).capital_path
            else:
                path = simulate_panel(xp, cal, grids, settings.interpolation, solved.policy, k_start, e_start,
                                      a_path, settings.seed, STREAM_IDIOSYNCRATIC, use_kernel=False).capital_path
            return alm_mod.coefficients(*alm_mod.regress_alm(path, a_path, settings.burn_in))

        report(0.9, "ALM Jacobian")
        with timer.stage("jacobian"):
            jacobian_estimate = alm_jacobian(evaluate_map, last_point, last_alm,
                                             jacobian_directions(capital_path, settings.burn_in))
        del evaluate_map  # it holds the engine, whose buffers are freed below
    warnings = [] if converged else [outer_loop_warning(settings, change)]
    top_problem = None if hist is None else histogram_top_problem(hist.distribution, k_nodes)
    if top_problem is not None:  # a fixed point with a cut-off distribution is no solution; a stop on the way is
        if converged:            # already flagged as not converged, and says why its K may be off
            raise ValueError(top_problem)
        warnings.append(top_problem)
    solution = Solution(last_alm, regressions, iteration, converged, change, policy, capital_path, a_path,
                        policy_iterations, history=history,
                        panel_graph=isinstance(engine, CudaPanel) and engine.graph_used, warnings=warnings,
                        final_k=None if panel is None else panel.k,
                        final_employed=None if panel is None else panel.employed,
                        final_distribution=None if hist is None else hist.distribution,
                        coarse_iterations=0 if coarse is None else coarse.iterations,
                        alm_jacobian=jacobian_estimate,
                        jacobian_simulations=4 if jacobian_estimate is not None else
                        0 if coarse is None else coarse.jacobian_simulations)
    del engine  # its buffers (N-sized) are not needed by the accuracy test
    if test_periods > 0:
        report(0.95, "Den Haan accuracy test")
        with timer.stage("den_haan_test"):
            # the test path starts in the aggregate state that drew the panel's final employment states
            test_a = aggregate_path(cal, settings.seed, test_periods + 1, STREAM_TEST_AGGREGATE, int(a_path[-1]))
            if hist is not None:  # the same simulation as the solve's: the histogram, from its final distribution
                test_capital = simulate_histogram(cal, grids, settings, policy, k_nodes, hist.distribution,
                                                  test_a).capital
            else:  # one simulation only: the plain per-period loop (capturing would cost what it saves)
                test_capital = simulate_panel(xp, cal, grids, settings.interpolation, policy, panel.k, panel.employed,
                                              test_a, settings.seed, STREAM_TEST_IDIOSYNCRATIC,
                                              use_kernel=on_device).capital_path
            max_gap, mean_gap, implied = alm_mod.den_haan_errors(test_capital, test_a, last_alm)
        solution.den_haan_max, solution.den_haan_mean = max_gap, mean_gap
        solution.den_haan_panel, solution.den_haan_alm, solution.den_haan_a = test_capital, implied, test_a[:-1]
    return solution
