"""The Krusell-Smith algorithm (Hatcher & Scheffel 2014, Algorithm A.1), both stages on ``xp``.

Outer loop (MMV 2010 MAIN.m): solve the policy for the current ALM; simulate the panel on a fixed shock
path; regress ln K' on ln K by state; stop when ||B_new - B||_2 < tolerance; else B <- damping B_new +
(1 - damping) B. While ||B_new - B|| > 100 tolerance the next simulation starts from the panel's final
distribution (so it starts in the ergodic set); afterwards the starting panel is held fixed, so that the
fixed point is that of one map. The panel never leaves the device; on the GPU every outer iteration replays
one :class:`~kernels.ks.simulate.CudaPanel` (its period loop captured as CUDA graphs once per solve).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from kernels.backend import is_numpy
from kernels.ks import alm as alm_mod
from kernels.ks.grids import Grids
from kernels.ks.interp import Method
from kernels.ks.model import Calibration, validate_calibration
from kernels.ks.policy import EulerProblem, PolicySettings, initial_policy, solve_policy
from kernels.ks.simulate import (
    STREAM_IDIOSYNCRATIC,
    STREAM_TEST_AGGREGATE,
    STREAM_TEST_IDIOSYNCRATIC,
    CudaPanel,
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


Reporter = Callable[[float, str], None]

MIN_DEN_HAAN_PERIODS = 10  # shortest accuracy-test path: 0 skips the test, 1 .. 9 are refused


def den_haan_test_periods(settings: SolveSettings) -> int:
    """Length of the Den Haan test path (0: no test); ValueError for 1 .. MIN_DEN_HAAN_PERIODS - 1."""
    periods = settings.periods if settings.den_haan_periods is None else settings.den_haan_periods
    if 0 < periods < MIN_DEN_HAAN_PERIODS:
        raise ValueError(f"den_haan_periods must be 0 (skip the accuracy test) or at least {MIN_DEN_HAAN_PERIODS}, "
                         f"not {periods}")
    return periods


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
) -> Solution:
    validate_calibration(cal)
    timer = timer or StageTimer(xp)
    report = report or (lambda fraction, stage: None)
    if settings.burn_in + 3 >= settings.periods:
        raise ValueError("burn_in must leave at least a few periods of the panel for the ALM regression")
    test_periods = den_haan_test_periods(settings)  # checked before the solve, not after it
    on_device = not is_numpy(xp) if use_kernels is None else use_kernels
    with timer.stage("setup"):
        problem = EulerProblem(xp, cal, grids, settings.interpolation)
        policy = initial_policy(xp, grids)
        a_path = aggregate_path(cal, settings.seed, settings.periods + 1)
        k_start, e_start = initial_panel(xp, cal, settings, initial_k, initial_employed, int(a_path[0]))
        # the outer loop simulates the same configuration (N, shock path, seed) every iteration: one engine,
        # its buffers and captured loop reused, the new policy and start panel copied in place
        engine = None
        if on_device:
            engine = CudaPanel(xp, cal, grids, settings.interpolation, k_start.dtype, settings.n_agents, a_path,
                               settings.seed, STREAM_IDIOSYNCRATIC, use_graph=settings.panel_graph)
    alm = np.array(settings.initial_alm, dtype=np.float64)
    policy_iterations: list[int] = []
    history: list[dict[str, float]] = []
    converged = False
    change = float("inf")
    iteration = 0
    regressions = None
    capital_path = np.empty(0)
    started = time.perf_counter()
    for iteration in range(1, settings.max_iterations + 1):
        fraction = min(0.9, 0.9 * iteration / settings.max_iterations)
        report(fraction, f"iteration {iteration}: policy")
        def policy_checkpoint(step: int, fraction: float = fraction, iteration: int = iteration) -> None:
            report(fraction, f"iteration {iteration}: policy step {step}")

        with timer.stage("policy"):
            solved = solve_policy(xp, problem, alm, policy, settings.policy, use_kernel=on_device,
                                  checkpoint=policy_checkpoint)
        policy = solved.policy
        policy_iterations.append(solved.iterations)
        if not solved.converged:
            raise ValueError(
                f"the policy step did not converge in policy_max_iterations={settings.policy.max_iterations} "
                f"(last change {solved.max_change:.3g}); raise it or loosen policy_tolerance"
            )
        report(fraction, f"iteration {iteration}: panel")

        def checkpoint(t: int, fraction: float = fraction, iteration: int = iteration) -> None:
            report(fraction, f"iteration {iteration}: panel period {t}/{settings.periods}")

        with timer.stage("panel"):
            if engine is not None:
                panel = engine.simulate(policy, k_start, e_start, checkpoint)
            else:
                panel = simulate_panel(xp, cal, grids, settings.interpolation, policy, k_start, e_start, a_path,
                                       settings.seed, STREAM_IDIOSYNCRATIC, checkpoint, use_kernel=False)
        with timer.stage("regression"):
            capital_path = panel.capital_path
            regressions = alm_mod.regress_alm(capital_path, a_path, settings.burn_in)
            alm_new = alm_mod.coefficients(*regressions)
            change = float(np.linalg.norm(alm_new - alm))
            history.append({"iteration": iteration, "change": change, "seconds": time.perf_counter() - started,
                            "policy_iterations": solved.iterations,
                            **{f"b{i}": float(v) for i, v in enumerate(alm_new)}})
            if change > 100.0 * settings.tolerance:
                k_start, e_start = panel.k, panel.employed
            last_alm = alm_new
            alm = settings.damping * alm_new + (1.0 - settings.damping) * alm
        if change < settings.tolerance:
            converged = True
            break
    assert regressions is not None
    solution = Solution(last_alm, regressions, iteration, converged, change, policy, capital_path, a_path,
                        policy_iterations, history=history,
                        panel_graph=engine is not None and engine.graph_used)
    del engine  # its buffers (N-sized) are not needed by the accuracy test
    if test_periods > 0:
        report(0.95, "Den Haan accuracy test")
        with timer.stage("den_haan_test"):
            # the test path starts in the aggregate state that drew the panel's final employment states
            test_a = aggregate_path(cal, settings.seed, test_periods + 1, STREAM_TEST_AGGREGATE, int(a_path[-1]))
            # one simulation only: the plain per-period loop (capturing would cost what it saves)
            test = simulate_panel(xp, cal, grids, settings.interpolation, policy, panel.k, panel.employed, test_a,
                                  settings.seed, STREAM_TEST_IDIOSYNCRATIC, use_kernel=on_device)
            max_gap, mean_gap, implied = alm_mod.den_haan_errors(test.capital_path, test_a, last_alm)
        solution.den_haan_max, solution.den_haan_mean = max_gap, mean_gap
        solution.den_haan_panel, solution.den_haan_alm, solution.den_haan_a = test.capital_path, implied, test_a[:-1]
    return solution
