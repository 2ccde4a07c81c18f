"""Value and control at exact states, and the discretisation-error estimate from coarser grids.

A grid array interpolated at a state is not the policy's control there, nor its value: the control of the
optimal policy at a state S is the minimiser of the one-step Bellman right-hand side ``Q(u; S, V)`` at that
very S, and its value is that minimum (V, the solved grid function, enters only through the expectation over
the next state). For the myopic and inert policies the control is the closed form (paper eq. 11, or 0) and
the value ``Q(u(S); S, V)``. This is what the job reports; the interpolated numbers are kept under their own
name.

The error estimate (``richardson``) reads the same exact-state numbers computed on the grid halved per axis
(and halved again): with ``d1 = v_h - v_2h`` and ``d2 = v_2h - v_4h`` the differences shrink by about
``r = d2 / d1`` per halving, so the error left in ``v_h`` is about the geometric tail ``|d1| / (r - 1)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.dualcontrol.bellman import ArrayBellman, Interpolation, MinimiserSettings
from kernels.dualcontrol.grid import StateGrid, interpolate
from kernels.dualcontrol.minimize import golden_section_minimise
from kernels.dualcontrol.model import ModelParams, inert_bounds, inert_value, myopic_policy

# The report minimises at a handful of states, so it affords a finer scan than the grid-wide sweep (64
# restarts). Golden section stops at a cell about 1e-5 of the scan step wide: Q differences between its
# probes (about Q'' w^2, 1e-12 here) stay far above the rounding differences between a GPU- and a
# NumPy-solved V, so both runs take the same path and report the same control (the cross-backend test holds
# every result leaf to 1e-9); the value's own error from the cell width is below 1e-11.
REPORT_MINIMISER = MinimiserSettings(scan_points=64, golden_iterations=24)
# Below this ratio of successive differences the grid sequence is not (yet) converging geometrically; the
# estimate then uses this ratio, i.e. three times the last difference.
MIN_CONVERGENCE_RATIO = 1.5


@dataclass
class ExactReport:
    value: np.ndarray  # min_u Q(u; S, V) (optimal) or Q(u(S); S, V) (fixed policies), one per state
    control: np.ndarray
    interpolated_value: np.ndarray  # the grid arrays interpolated at the states
    interpolated_control: np.ndarray


class StateEvaluator:
    """``Q(u; S, V)`` at arbitrary states for one solved grid function V (float64 on ``xp``: host NumPy for the
    reports, the job's device for the Monte Carlo, whose states number paths x report states per period)."""

    def __init__(
        self,
        model: ModelParams,
        grid: StateGrid,
        values: Any,
        quadrature_nodes: int,
        interpolation: Interpolation = "trilinear",
        xp: Any = np,
    ) -> None:
        self.model, self.grid, self.xp = model, grid, xp
        self.values = xp.ascontiguousarray(xp.asarray(values, dtype=xp.float64))
        self.operator = ArrayBellman(model, grid, quadrature_nodes, xp, interpolation=interpolation)
        self.nodes = grid.node_arrays(xp)

    def interpolate(self, array: Any, x: Any, mu: Any, sigma: Any, value: bool) -> Any:
        """A grid array at the states; ``value`` arrays use the operator's baseline (residual interpolation)."""
        # the stored values themselves (not a copy) so that the operator's curvature cache hits
        array = array if array is self.values else self.xp.asarray(array, dtype=self.xp.float64)
        baseline = self.operator.baseline if value else None
        curvature = self.operator.curvature(array) if value else None
        return interpolate(array, self.grid, self.nodes, x, mu, sigma, self.xp, baseline, curvature)

    def q(self, x: np.ndarray, mu: np.ndarray, sigma: np.ndarray, u: np.ndarray) -> np.ndarray:
        return self.operator.q_at_points(self.values, x, mu, sigma, u)

    def minimise(
        self,
        x: np.ndarray,
        mu: np.ndarray,
        sigma: np.ndarray,
        extra_starts: Sequence[np.ndarray] = (),
        minimiser: MinimiserSettings = REPORT_MINIMISER,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(argmin, min) of ``Q(u; S, V)`` at each state: the grid-wide search (bracket by the inert bounds,
        myopic start, scan, golden section, safeguard) run at exact states, in chunks of states (the
        simulation passes paths x report states at once) so that the (states x nodes) temporaries stay bounded."""
        xp = self.xp
        controls, values = xp.empty_like(x), xp.empty_like(x)
        for start in range(0, x.size, self.operator.chunk):
            part = slice(start, start + self.operator.chunk)
            xs, mus, ss = x[part], mu[part], sigma[part]
            upper = xp.maximum(inert_value(self.model, xs), self.interpolate(self.values, xs, mus, ss, value=True))
            lo, hi = inert_bounds(self.model, xs, mus, ss, upper, xp)
            starts = [myopic_policy(self.model, xs, mus, ss), *(s[part] for s in extra_starts)]
            controls[part], values[part] = golden_section_minimise(
                lambda u, xs=xs, mus=mus, ss=ss: self.q(xs, mus, ss, u),
                lo,
                hi,
                starts,
                minimiser.scan_points,
                minimiser.golden_iterations,
                xp,
            )
        return controls, values

    def control(self, policy: str, x: np.ndarray, mu: np.ndarray, sigma: np.ndarray, grid_policy: Any) -> np.ndarray:
        """The policy's control at exact states (for ``optimal``: the one-step minimiser)."""
        if policy == "inert":
            return self.xp.zeros_like(x)
        if policy == "myopic":
            return myopic_policy(self.model, x, mu, sigma)
        starts = [] if grid_policy is None else [self.interpolate(grid_policy, x, mu, sigma, value=False)]
        return self.minimise(x, mu, sigma, starts)[0]


def exact_report(
    model: ModelParams,
    grid: StateGrid,
    policy: str,
    values: np.ndarray,
    grid_policy: np.ndarray,
    states: np.ndarray,
    quadrature_nodes: int,
    interpolation: Interpolation = "trilinear",
) -> ExactReport:
    """Value and control of ``policy`` at each row ``[x, mu, Sigma]`` of ``states`` (see the module text)."""
    evaluator = StateEvaluator(model, grid, values, quadrature_nodes, interpolation)
    x, mu, sigma = (np.ascontiguousarray(states[:, i], dtype=np.float64) for i in range(3))
    interpolated_value = evaluator.interpolate(values, x, mu, sigma, value=True)
    interpolated_control = evaluator.interpolate(grid_policy, x, mu, sigma, value=False)
    if policy == "optimal":
        control, value = evaluator.minimise(x, mu, sigma, [interpolated_control])
    else:
        control = evaluator.control(policy, x, mu, sigma, None)
        value = evaluator.q(x, mu, sigma, control)
    return ExactReport(value, control, interpolated_value, interpolated_control)


def richardson(sequence: Sequence[np.ndarray]) -> np.ndarray:
    """Error estimate of the first entry of ``sequence`` (finest grid first, each next one halved per axis).

    One coarser grid: ``|d1|`` (first-order convergence, r = 2). Two: ``|d1| / (r - 1)`` with
    ``r = |d2| / |d1|`` floored at :data:`MIN_CONVERGENCE_RATIO`; where the two differences change sign the
    sequence is not monotone and the estimate is ``|d1| + |d2|``. None: NaN (no estimate).
    """
    if len(sequence) < 2:
        return np.full(np.shape(sequence[0]), np.nan)
    d1 = np.abs(sequence[0] - sequence[1])
    if len(sequence) < 3:
        return d1
    diff1, diff2 = sequence[0] - sequence[1], sequence[1] - sequence[2]
    ratio = np.maximum(np.abs(diff2) / np.maximum(d1, np.finfo(np.float64).tiny), MIN_CONVERGENCE_RATIO)
    geometric = d1 / (ratio - 1.0)
    return np.where(diff1 * diff2 >= 0.0, geometric, d1 + np.abs(diff2))


# Grids of the error estimate: the solved one, then halved per axis twice (no axis below this many nodes).
ERROR_GRIDS, SMALLEST_ERROR_AXIS = 2, 4


def halved_shapes(shape: tuple[int, int, int], count: int, smallest: int = 4) -> list[tuple[int, int, int]]:
    """Up to ``count`` grid shapes, each axis halved (rounding up) per step, none with an axis below
    ``smallest`` (the coarse-to-fine levels use the same rule)."""
    shapes: list[tuple[int, int, int]] = []
    for k in range(1, count + 1):
        halved = tuple(-(-n // 2**k) for n in shape)
        if min(halved) < smallest:
            break
        shapes.append(halved)  # type: ignore[arg-type]
    return shapes


# The simulation's optimal control is the one-step minimiser at every simulated state: a lighter search than
# the report's (it runs at paths x periods states).
SIMULATION_MINIMISER = MinimiserSettings(scan_points=16, golden_iterations=30)

StateRule = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def simulation_rules(model: ModelParams, policy: str, evaluator: StateEvaluator,
                     grid_policy: np.ndarray) -> tuple[StateRule, StateRule]:
    """(control, tail value) of ``policy`` at arbitrary states for the Monte Carlo: the optimal control is
    the one-step minimiser started from the grid policy, myopic its closed form, inert 0; the tail is the
    solved grid value."""
    def tail(x: np.ndarray, mu: np.ndarray, s: np.ndarray) -> np.ndarray:
        return evaluator.interpolate(evaluator.values, x, mu, s, value=True)

    def control(x: np.ndarray, mu: np.ndarray, s: np.ndarray) -> np.ndarray:
        if policy == "optimal":
            start = evaluator.interpolate(grid_policy, x, mu, s, value=False)
            return evaluator.minimise(x, mu, s, [start], SIMULATION_MINIMISER)[0]
        if policy == "myopic":
            return myopic_policy(model, x, mu, s)
        return evaluator.xp.zeros_like(x)

    return control, tail

