"""Individual policy k' = g(k, K, a, eps) by Euler-equation (time) iteration, Maliar, Maliar & Valli (2010).

Given the aggregate law of motion ln K' = b0_a + b1_a ln K, every grid point (a, eps, k_i, K_j) is updated
at once (arrays on ``xp``):

    K'   = clip(exp(b0_a + b1_a ln K_j), K_min, K_max)
    k''  = g(k', K', a', eps')                       (interpolated, for the four (a', eps'))
    c'   = (r(K', a') + 1 - delta) k' + y(a', eps') w(K', a') - k''   (floored at 1e-10 as in MMV)
    c    = (beta sum pi[(a, eps), (a', eps')] (1 - delta + r') c'^-gamma)^(-1/gamma)
    k'n  = clip(wealth(k_i, K_j, a, eps) - c, k_min, k_max)    (the clip is the borrowing constraint)
    g   <- damping k'n + (1 - damping) g             until max |k'n - g| <= tolerance.

Convergence is tested every ``check_every`` steps (and at the last allowed step), on both paths alike, so
both stop at the same step: the GPU then reads the max change back (a device reduction and a host
synchronisation) once per ``check_every`` steps instead of every step (~18,000 steps per 500 x 50 solve).
The iteration may run up to ``check_every - 1`` steps past the first one below the tolerance; each of them
only moves the policy closer to its fixed point.

The GPU runs one fused CUDA kernel per iteration (``ks_euler_step`` in ``kernels/ks/policy.cu``); its NumPy
twin is :func:`euler_update`, written against ``xp``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import numpy as np

from kernels import cuda
from kernels.backend import is_numpy
from kernels.ks.grids import Grids
from kernels.ks.interp import Method, interpolate
from kernels.ks.model import Calibration, interest_rate, labour_income_factor, wage, wealth
from kernels.progress import Pacer

CONSUMPTION_FLOOR = 1e-10  # MMV: a non-positive future consumption is replaced by this
_EULER_THREADS = 128  # block size of the Euler step (a launch parameter: the kernel has no shared memory)

# The policy step is float64 whatever the panel's precision: one variant, compiled at worker start.
_EULER_DEFINES = cuda.real_define(np.float64)
_EULER_SOURCE = cuda.kernel_source(__file__, "policy.cu", headers=["ks/interp.cuh"], warm_up=[_EULER_DEFINES])


PolicyMethod = Literal["time_iteration", "egm"]
DEFAULT_DAMPING: dict[str, float] = {"time_iteration": 0.7, "egm": 1.0}


@dataclass(frozen=True)
class PolicySettings:
    tolerance: float = 1e-8
    damping: float = 0.7
    max_iterations: int = 20_000
    check_every: int = 10  # steps between convergence tests (1 = every step), the same on CPU and GPU
    method: PolicyMethod = "time_iteration"

    def __post_init__(self) -> None:
        if self.check_every < 1:
            raise ValueError(f"check_every must be positive, not {self.check_every}")
        if self.method not in DEFAULT_DAMPING:
            raise ValueError(f"policy method must be 'time_iteration' or 'egm', not {self.method!r}")

    def checks(self, iteration: int) -> bool:
        """Whether convergence is tested after step ``iteration`` (1-based)."""
        return iteration % self.check_every == 0 or iteration == self.max_iterations


def next_aggregate_capital(cal: Calibration, grids: Grids, alm: np.ndarray, capital: np.ndarray) -> np.ndarray:
    """K'[a, ...] = clip(exp(b0_a + b1_a ln K), K_min, K_max); ALM = [b0_bad, b1_bad, b0_good, b1_good]."""
    coef = np.asarray(alm, dtype=np.float64).reshape(2, 2)
    log_k = np.log(np.asarray(capital, dtype=np.float64))
    out = np.exp(coef[:, 0].reshape((2,) + (1,) * log_k.ndim) + coef[:, 1].reshape((2,) + (1,) * log_k.ndim) * log_k)
    return np.clip(out, grids.K_min, grids.K_max)


class EulerProblem:
    """Arrays of one policy problem that do not change while the policy iterates (on ``xp``)."""

    def __init__(self, xp: ModuleType, cal: Calibration, grids: Grids, method: Method) -> None:
        self.xp, self.cal, self.grids, self.method = xp, cal, grids, method
        k = grids.k
        capital = grids.K
        self.k_nodes = xp.asarray(k)
        wealth_now = np.empty((2, 2, grids.k_size, grids.K_size))
        for a in range(2):
            for eps in range(2):
                wealth_now[a, eps] = wealth(np, cal, k[:, None], capital[None, :], a, eps)
        self.wealth_now = xp.asarray(wealth_now)
        # the EGM step inverts cash = gross_now k + income_now for k at each choice k' (end-of-period grid)
        gross = np.stack([interest_rate(np, cal, capital, a) + (1.0 - cal.delta) for a in range(2)])
        income = np.stack([[labour_income_factor(cal, a, eps) * wage(np, cal, capital, a) for eps in range(2)]
                           for a in range(2)])
        self.gross_now = xp.asarray(gross.reshape(2, 1, 1, grids.K_size))  # [a, j] -> (2, 1, 1, nK)
        self.income_now = xp.asarray(income.reshape(2, 2, 1, grids.K_size))  # [a, eps, j]
        self.choice_nodes = xp.asarray(np.broadcast_to(k[None, None, :, None], (2, 2, grids.k_size, grids.K_size))
                                       .copy())
        # prob[a', eps'] has shape (2, 2, 1, 1) over the current (a, eps)
        p = cal.transition_matrix.reshape(2, 2, 2, 2)
        self.prob = [[xp.asarray(p[:, :, a_next, e_next].reshape(2, 2, 1, 1).copy()) for e_next in range(2)]
                     for a_next in range(2)]

    def next_prices(self, alm: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """K'[a, j], r'[a, a', j], w'[a, a', j] on the host (tiny)."""
        k_next = next_aggregate_capital(self.cal, self.grids, alm, self.grids.K)
        r_next = np.stack([interest_rate(np, self.cal, k_next, a_next) for a_next in range(2)], axis=1)
        w_next = np.stack([wage(np, self.cal, k_next, a_next) for a_next in range(2)], axis=1)
        return k_next, r_next, w_next


def euler_consumption(
    xp: ModuleType,
    problem: EulerProblem,
    table: Any,
    k_next: Any,
    capital_next: Any,
    r_next: Any,
    w_next: Any,
) -> Any:
    """Consumption implied by the Euler equation at the choice k' (shape (2, 2, ...) over (a, eps)).

    ``capital_next`` broadcasts against k' over (a, ...); ``r_next``/``w_next`` are indexed [a'] first and
    broadcast likewise. ``table`` is the policy (4, k_size, K_size) used for k''.
    """
    cal = problem.cal
    one_minus_delta = 1.0 - cal.delta
    expectation = None
    for a_next in range(2):
        for e_next in range(2):
            k_next2 = interpolate(
                xp, table, 2 * a_next + e_next, k_next, capital_next, problem.grids, problem.method,
                problem.k_nodes,
            )
            income = (r_next[a_next] + one_minus_delta) * k_next + labour_income_factor(cal, a_next, e_next) * w_next[
                a_next
            ]
            c_next = income - k_next2
            c_next = xp.where(c_next > 0.0, c_next, CONSUMPTION_FLOOR)
            term = problem.prob[a_next][e_next] * ((one_minus_delta + r_next[a_next]) * c_next ** (-cal.gamma))
            expectation = term if expectation is None else expectation + term
    return (cal.beta * expectation) ** (-1.0 / cal.gamma)


def euler_update(xp: ModuleType, problem: EulerProblem, policy: Any, prices: tuple[Any, Any, Any],
                 damping: float) -> tuple[Any, float]:
    """One damped time-iteration step on the whole grid: (new policy, max |k'n - g|)."""
    grids = problem.grids
    capital_next, r_next, w_next = prices
    table = policy.reshape(4, grids.k_size, grids.K_size)
    consumption = euler_consumption(xp, problem, table, policy, capital_next, r_next, w_next)
    k_new = xp.clip(problem.wealth_now - consumption, grids.k_min, grids.k_max)
    diff = float(xp.max(xp.abs(k_new - policy)))
    return damping * k_new + (1.0 - damping) * policy, diff


def endogenous_capital(xp: ModuleType, problem: EulerProblem, policy: Any, prices: tuple[Any, Any, Any]) -> Any:
    """EGM, first half: the current k at which each end-of-period choice k' = k_i' is optimal.

    c from the Euler equation at the choice k_i' (next period's k'' read off ``policy`` at the node k_i', so
    only the K' direction is interpolated), then cash = c + k_i' and k = (cash - income_now) / gross_now.
    Shape (2, 2, k_size, K_size), axis 2 over the choice nodes.
    """
    grids = problem.grids
    capital_next, r_next, w_next = prices
    table = policy.reshape(4, grids.k_size, grids.K_size)
    choice = problem.choice_nodes
    consumption = euler_consumption(xp, problem, table, choice, capital_next, r_next, w_next)
    return (consumption + choice - problem.income_now) / problem.gross_now


def policy_on_grid(xp: ModuleType, problem: EulerProblem, k_end: Any) -> Any:
    """EGM, second half: k'(k_i, K_j) by linear interpolation of the choices k_i' over their endogenous k.

    Per column (a, eps, K_j) the endogenous points are made non-decreasing by a running maximum (they are
    increasing at a solution; the running maximum only fixes the order of a transient iterate, the same way
    on both backends); cell p of k_i is the last endogenous point <= k_i, clamped to [0, k_size - 2], and
    k' = k_p' + w (k_{p+1}' - k_p') with w = (k_i - e_p) / (e_{p+1} - e_p) (w = 0 where e_{p+1} = e_p).
    Below the first endogenous point the borrowing constraint binds (w < 0: clipped to k_min); above the last
    the line is extended and clipped to k_max. NumPy only: on a GPU the kernel ``ks_egm_onto_grid`` runs it.
    """
    grids = problem.grids
    nodes = grids.k
    ends = np.maximum.accumulate(np.asarray(k_end), axis=2)
    out = np.empty_like(ends)
    for a in range(2):
        for eps in range(2):
            for j in range(grids.K_size):
                column = ends[a, eps, :, j]
                cell = np.clip(np.searchsorted(column, nodes, side="right") - 1, 0, grids.k_size - 2)
                low, high = column[cell], column[cell + 1]
                span = high - low
                safe = np.where(span > 0.0, span, 1.0)
                weight = np.where(span > 0.0, (nodes - low) / safe, 0.0)
                out[a, eps, :, j] = nodes[cell] + weight * (nodes[cell + 1] - nodes[cell])
    return np.clip(out, grids.k_min, grids.k_max)


def egm_update(xp: ModuleType, problem: EulerProblem, policy: Any, prices: tuple[Any, Any, Any],
               damping: float) -> tuple[Any, float]:
    """One endogenous-grid-method step (Carroll 2006) on the whole grid: (new policy, max |k'n - g|)."""
    k_new = policy_on_grid(xp, problem, endogenous_capital(xp, problem, policy, prices))
    diff = float(np.max(np.abs(k_new - policy)))
    return damping * k_new + (1.0 - damping) * policy, diff


def device_prices(xp: ModuleType, problem: EulerProblem, alm: np.ndarray) -> tuple[Any, Any, Any]:
    """K', r', w' shaped for broadcasting over (a, eps, k, K): K' (2,1,1,nK); r', w' [a'] -> (2,1,1,nK)."""
    k_next, r_next, w_next = problem.next_prices(alm)
    nK = problem.grids.K_size
    capital = xp.asarray(k_next.reshape(2, 1, 1, nK))
    rates = [xp.asarray(r_next[:, a_next].reshape(2, 1, 1, nK).copy()) for a_next in range(2)]
    wages = [xp.asarray(w_next[:, a_next].reshape(2, 1, 1, nK).copy()) for a_next in range(2)]
    return capital, rates, wages


@dataclass
class PolicySolution:
    policy: Any  # (2, 2, k_size, K_size) on xp
    iterations: int
    max_change: float
    converged: bool


def initial_policy(xp: ModuleType, grids: Grids) -> Any:
    """MMV's starting guess k' = 0.9 k everywhere."""
    return xp.asarray(np.broadcast_to(0.9 * grids.k[None, None, :, None], (2, 2, grids.k_size, grids.K_size)).copy())


def solve_policy(
    xp: ModuleType,
    problem: EulerProblem,
    alm: np.ndarray,
    policy: Any,
    settings: PolicySettings,
    use_kernel: bool | None = None,
    checkpoint: Callable[[int], None] | None = None,
    checkpoint_every: int = 250,
) -> PolicySolution:
    """Iterate the Euler equation to its fixed point for the ALM ``alm`` from the guess ``policy``.

    On a GPU the fused CUDA kernel runs each step (``use_kernel=False`` forces the array code).
    ``checkpoint(iteration)`` is called every ``checkpoint_every`` iterations and whenever a second passed
    since the last call (progress, cancellation: a large grid's step may take seconds).
    """
    if use_kernel is None:
        use_kernel = not is_numpy(xp)
    if use_kernel:
        return _solve_policy_cuda(xp, problem, alm, policy, settings, checkpoint, checkpoint_every)
    if settings.method == "egm" and not is_numpy(xp):
        raise ValueError("the EGM array code runs on NumPy only; on a GPU the kernels run it (use_kernel=True)")
    prices = device_prices(xp, problem, alm)
    step = egm_update if settings.method == "egm" else euler_update
    diff = float("inf")
    pacer = Pacer()
    for iteration in range(1, settings.max_iterations + 1):
        policy, diff = step(xp, problem, policy, prices, settings.damping)
        if settings.checks(iteration) and diff <= settings.tolerance:
            return PolicySolution(policy, iteration, diff, True)
        if checkpoint is not None and (iteration % checkpoint_every == 0 or pacer.due()):
            checkpoint(iteration)
    return PolicySolution(policy, settings.max_iterations, diff, False)


def euler_residuals(xp: ModuleType, problem: EulerProblem, policy: Any, alm: np.ndarray, k_points: Any) -> Any:
    """Unit-free Euler residuals 1 - c_Euler / c at points (a, eps, k, K_j) off the k grid.

    Shape (2, 2, len(k_points), K_size); NaN where the borrowing constraint binds (the Euler consumption
    would need k' < k_min, or g = k_min), where the Euler equation holds as an inequality.
    """
    grids = problem.grids
    table = policy.reshape(4, grids.k_size, grids.K_size)
    k = xp.asarray(k_points).reshape(1, 1, -1, 1)
    capital = xp.asarray(grids.K).reshape(1, 1, 1, -1)
    shape = (2, 2, k.shape[2], grids.K_size)
    plane = xp.arange(4).reshape(2, 2, 1, 1)
    choice = interpolate(xp, table, plane, xp.broadcast_to(k, shape), xp.broadcast_to(capital, shape), grids,
                         problem.method, problem.k_nodes)
    choice = xp.clip(choice, grids.k_min, grids.k_max)
    cash = xp.empty(shape)
    for a in range(2):
        for eps in range(2):
            cash[a, eps] = wealth(xp, problem.cal, k[0, 0], capital[0, 0], a, eps)
    capital_next, r_next, w_next = device_prices(xp, problem, alm)
    c_euler = euler_consumption(xp, problem, table, choice, capital_next, r_next, w_next)
    residual = 1.0 - c_euler / (cash - choice)
    binding = (cash - c_euler <= grids.k_min) | (choice <= grids.k_min)
    return xp.where(binding, xp.nan, residual)


def _policy_kernel(name: str) -> Any:
    return cuda.function(_EULER_SOURCE, name, defines=_EULER_DEFINES)


def grid_args(grids: Grids, dtype: Any = np.float64) -> tuple[Any, ...]:
    """The grid's scalars in the order of the kernels' (nk, nK, k_min, k_max, inv_power, K_min, K_max)."""
    real = np.dtype(dtype).type
    return (np.int32(grids.k_size), np.int32(grids.K_size), real(grids.k_min), real(grids.k_max),
            real(1.0 / grids.spacing_power), real(grids.K_min), real(grids.K_max))


def method_code(method: Method) -> int:
    """ks_interpolate's method code (interp.cuh): 0 bilinear, 1 Catmull-Rom, 2 local cubic."""
    codes = {"bilinear": 0, "catmull_rom": 1, "cubic": 2}
    if method not in codes:
        raise ValueError(f"interpolation must be one of {', '.join(codes)}, not {method!r}")
    return codes[method]


def _solve_policy_cuda(xp: ModuleType, problem: EulerProblem, alm: np.ndarray, policy: Any,
                       settings: PolicySettings, checkpoint: Callable[[int], None] | None,
                       checkpoint_every: int) -> PolicySolution:
    cal, grids = problem.cal, problem.grids
    k_next, r_next, w_next = problem.next_prices(alm)
    capital_next = xp.asarray(np.ascontiguousarray(k_next))
    rates = xp.asarray(np.ascontiguousarray(r_next))
    wages = xp.asarray(np.ascontiguousarray(w_next))
    prob = xp.asarray(cal.transition_matrix)
    factors = xp.asarray(np.array([labour_income_factor(cal, a, e) for a in range(2) for e in range(2)]))
    current = xp.array(policy, dtype=xp.float64, order="C", copy=True)  # the ping-pong must not write the input
    scratch = xp.empty_like(current)
    change = xp.empty_like(current)
    total = current.size
    threads = _EULER_THREADS
    blocks = (total + threads - 1) // threads
    grid = grid_args(grids)
    code = np.int32(method_code(problem.method))
    constants = (np.float64(1.0 - cal.delta), np.float64(cal.beta), np.float64(cal.gamma))
    damping, floor = np.float64(settings.damping), np.float64(CONSUMPTION_FLOOR)
    if settings.method == "egm":
        endogenous, onto_grid = _policy_kernel("ks_egm_endogenous"), _policy_kernel("ks_egm_onto_grid")
        k_end = xp.empty_like(current)
        gross_now, income_now = xp.ascontiguousarray(problem.gross_now), xp.ascontiguousarray(problem.income_now)
        columns = 4 * grids.K_size
        column_blocks = (columns + threads - 1) // threads

        def launch(source: Any, target: Any) -> None:
            endogenous((blocks,), (threads,), (source, k_end, problem.k_nodes, gross_now, income_now, capital_next,
                                               rates, wages, prob, factors, *grid, code, *constants, floor))
            onto_grid((column_blocks,), (threads,), (source, target, change, k_end, problem.k_nodes, grid[0],
                                                     grid[1], grid[2], grid[3], damping))
    else:
        kernel = _policy_kernel("ks_euler_step")

        def launch(source: Any, target: Any) -> None:
            kernel((blocks,), (threads,), (source, target, change, problem.k_nodes, problem.wealth_now, capital_next,
                                           rates, wages, prob, factors, *grid, code, *constants, damping, floor))
    diff = float("inf")
    pacer = Pacer()
    for iteration in range(1, settings.max_iterations + 1):
        launch(current, scratch)
        current, scratch = scratch, current
        if settings.checks(iteration):  # otherwise no read-back: the next launch queues behind this one
            diff = float(change.max())
            if diff <= settings.tolerance:
                return PolicySolution(current, iteration, diff, True)
        if checkpoint is not None and (iteration % checkpoint_every == 0 or pacer.due()):
            checkpoint(iteration)
    return PolicySolution(current, settings.max_iterations, diff, False)
