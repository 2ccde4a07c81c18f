"""Solve the dual-control dynamic programme on the grid: policy evaluation or value iteration.

- ``inert`` (u = 0) and ``myopic`` (paper eq. 11): policy evaluation ``V <- T_u V`` to convergence.
- ``optimal``: value iteration ``V <- T V`` with the grid-wide minimiser; optionally accelerated by modified
  policy iteration (``evaluation_sweeps`` cheap sweeps ``V <- T_u V`` with the latest policy between two
  improvement steps) and coarse-to-fine warm starts (solve on grids halved per axis, interpolate V and u
  up as the next level's start).
- Policy evaluation (the fixed policies' solves, and the sweeps between two improvement steps) either sweeps
  plainly (``evaluation="sweeps"``, the reference) or sweeps the Anderson mix of the last sweeps
  (``"anderson"``, :mod:`kernels.dualcontrol.anderson`); the convergence statistic is that of the sweep itself
  either way, so the mix changes which iterate is swept, never what counts as converged.
- ``gpus > 1`` spreads each level's sweeps over the host's GPUs in slabs of grid points
  (:mod:`kernels.dualcontrol.slabs`): the one-GPU result bit for bit, in less time on large grids.

Convergence (checked after every sweep of ``T`` or ``T_u``, from three device-side reductions, so no array
crosses to the host): with ``d = V_new - V``, the MacQueen-Porteus bounds put the fixed point within
``[V_new + k min d, V_new + k max d]``, ``k = delta / (1 - delta)``. Criterion ``macqueen_porteus``: their
width ``k (max d - min d)`` relative to ``max |V_new|``; ``sup_norm`` (the paper's): ``k max |d|`` relative
to ``max |V_new|``. At convergence the value is set to the midpoint of the bounds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from kernels.backend import synchronize, to_host
from kernels.dualcontrol.anderson import AndersonMixer
from kernels.dualcontrol.bellman import BellmanOperator, Interpolation, MinimiserSettings, make_operator
from kernels.dualcontrol.grid import StateGrid, interpolate, x_curvature
from kernels.dualcontrol.model import ModelParams, myopic_policy
from kernels.dualcontrol.slabs import MIN_POINTS_PER_GPU, SlabBellman, check_gpus, level_gpus
from kernels.spec import settings_from

if TYPE_CHECKING:
    from kernels.dualcontrol.spec import DualControlParams

Policy = Literal["inert", "myopic", "optimal"]
Criterion = Literal["macqueen_porteus", "sup_norm"]
Evaluation = Literal["sweeps", "anderson"]
Checkpoint = Callable[[float, str], None]
LevelCallback = Callable[[StateGrid, Any, Any], None]  # (level grid, converged V, policy) after each level


@dataclass(frozen=True)
class SolveSettings:
    policy: Policy
    tolerance: float
    max_iterations: int = 2000
    evaluation_sweeps: int = 0  # modified policy iteration; 0 = plain value iteration
    coarse_to_fine: bool = False
    coarsest_size: int = 16
    criterion: Criterion = "macqueen_porteus"
    quadrature_nodes: int = 32
    dtype: Any = np.float64
    minimiser: MinimiserSettings = field(default_factory=MinimiserSettings)
    fused: bool | None = None  # None: CUDA kernels on a GPU namespace, array code otherwise
    interpolation: Interpolation = "trilinear"  # or "quadratic" (in x) or "residual" (V - V0): bellman.py
    # How a policy is evaluated (inert and myopic solves, and between two improvement steps): "sweeps" is
    # plain V <- T_u V (the reference), "anderson" sweeps the Anderson mix of the last anderson_memory
    # sweeps instead (anderson.py); the convergence checks are the same statistics either way
    evaluation: Evaluation = "sweeps"
    anderson_memory: int = 8
    # > 1: every level's sweeps spread over GPUs 0 .. gpus - 1 of the host (slabs.py; the same bits as one GPU),
    # a level only over as many as keep min_points_per_gpu points each: coarse levels, where the launches and
    # copies would cost more than the split saves, run on fewer or on one
    gpus: int = 1
    min_points_per_gpu: int = MIN_POINTS_PER_GPU

    @classmethod
    def from_params(cls, params: DualControlParams, policy: Policy, tolerance: float, **settings: Any) -> SolveSettings:
        """The settings of a solve of ``policy`` to ``tolerance`` for a job's validated params, copied by name
        (:func:`kernels.spec.settings_from`: the top level and ``acceleration``; the minimiser from
        ``minimizer``); the stopping rule and the precision are named otherwise there; ``settings`` over those."""
        return settings_from(
            cls, params, "acceleration",
            policy=policy,
            tolerance=tolerance,
            criterion=params.convergence,
            dtype=np.float64 if params.precision == "float64" else np.float32,
            minimiser=settings_from(MinimiserSettings, params.minimizer),
            **settings,
        )


@dataclass
class LevelReport:
    shape: tuple[int, int, int]
    iterations: int  # sweeps of T (optimal) or T_u (inert, myopic)
    evaluation_sweeps: int  # modified-policy-iteration sweeps between improvement steps
    converged: bool
    seconds: float
    gpus: int = 1  # the GPUs its sweeps were spread over
    improvement_seconds: float = 0.0  # optimal: seconds in the improvement steps (each until its statistics)


@dataclass
class Solution:
    grid: StateGrid
    value: Any  # grid-shaped, on the solving device
    policy: Any
    converged: bool
    levels: list[LevelReport]
    history: list[dict[str, Any]]

    @property
    def iterations(self) -> int:
        return sum(level.iterations for level in self.levels)


def level_shapes(shape: tuple[int, int, int], coarse_to_fine: bool, coarsest_size: int) -> list[tuple[int, int, int]]:
    """Grid shapes from coarsest to the requested one, each axis halved per level, none below coarsest_size."""
    shapes = [shape]
    if coarse_to_fine:
        k = 1
        while min(-(-n // 2**k) for n in shape) >= coarsest_size:
            shapes.append(tuple(-(-n // 2**k) for n in shape))  # type: ignore[arg-type]
            k += 1
    return shapes[::-1]


def level_operator(
    model: ModelParams, grid: StateGrid, settings: SolveSettings, xp: Any
) -> tuple[BellmanOperator, int]:
    """The level's operator and the GPUs it spreads each sweep over (one: :func:`make_operator`)."""
    gpus = level_gpus(int(np.prod(grid.shape)), settings.gpus, settings.min_points_per_gpu)
    if gpus > 1:
        operator = SlabBellman(
            model,
            grid,
            settings.quadrature_nodes,
            xp,
            settings.dtype,
            settings.minimiser,
            settings.interpolation,
            slabs=gpus,
        )
        return operator, gpus
    operator = make_operator(
        model,
        grid,
        settings.quadrature_nodes,
        xp,
        settings.dtype,
        settings.minimiser,
        settings.fused,
        settings.interpolation,
    )
    return operator, 1


def policy_on_grid(policy: Policy, model: ModelParams, grid: StateGrid, xp: Any, dtype: Any) -> Any:
    """The fixed control of the inert or myopic policy at every grid point."""
    x, mu, sigma = grid.mesh(xp, dtype)
    if policy == "inert":
        return xp.zeros(grid.shape, dtype=dtype)
    if policy == "myopic":
        return xp.ascontiguousarray(myopic_policy(model, x, mu, sigma))
    raise ValueError(f"policy {policy!r} has no fixed control")


def transfer(
    values: Any,
    coarse: StateGrid,
    fine: StateGrid,
    xp: Any,
    dtype: Any,
    baseline: tuple[float, float, float] | None = None,
    quadratic: bool = False,
) -> Any:
    """Interpolation of a coarse-grid array onto the fine grid's nodes (same cuboid), with the operator's
    ``baseline`` or quadratic correction for a value function (see :func:`kernels.dualcontrol.grid.interpolate`)."""
    nodes = coarse.node_arrays(xp, dtype)
    curvature = x_curvature(values, nodes[0], xp) if quadratic else None
    return xp.ascontiguousarray(interpolate(values, coarse, nodes, *fine.mesh(xp, dtype), xp, baseline, curvature))


def value_baseline(model: ModelParams, interpolation: Interpolation) -> tuple[float, float, float] | None:
    """The quadratic in x that value interpolation subtracts and adds back (None: plain trilinear)."""
    return model.inert_coefficients() if interpolation == "residual" else None


class _Tracker:
    """Convergence statistics from device reductions; only three scalars reach the host per sweep."""

    def __init__(self, delta: float, tolerance: float, criterion: Criterion, xp: Any) -> None:
        self.k = delta / (1.0 - delta)
        self.tolerance, self.criterion, self.xp = tolerance, criterion, xp

    def measure(self, new: Any, old: Any) -> dict[str, float]:
        xp = self.xp
        d = new - old
        lo, hi, scale = (float(v) for v in to_host(xp.stack([d.min(), d.max(), xp.abs(new).max()])))
        scale = max(scale, np.finfo(np.float64).tiny)
        width = self.k * (hi - lo) if self.criterion == "macqueen_porteus" else self.k * max(abs(lo), abs(hi))
        return {"criterion": width / scale, "mqp_lower": self.k * lo, "mqp_upper": self.k * hi}


class _LevelReporter:
    """Progress within one level: log-distance of the criterion from its first value to the tolerance."""

    def __init__(
        self,
        checkpoint: Checkpoint | None,
        every_seconds: float,
        settings: SolveSettings,
        shape: tuple[int, int, int],
        done_before: float,
        share: float,
    ) -> None:
        self.checkpoint, self.every_seconds, self.tolerance = checkpoint, every_seconds, settings.tolerance
        self.label = f"{settings.policy} {'x'.join(map(str, shape))}"
        self.done_before, self.share = done_before, share
        self.first: float | None = None
        self.fraction = done_before
        self.last_report = time.perf_counter()

    def heartbeat(self) -> None:
        """Between two criterion values (inside a long sweep): repeat the last fraction, time permitting."""
        now = time.perf_counter()
        if self.checkpoint is not None and now - self.last_report >= self.every_seconds:
            self.checkpoint(self.fraction, f"{self.label}: sweeping")
            self.last_report = now

    def __call__(self, criterion: float, force: bool) -> None:
        self.first = criterion if self.first is None else self.first
        within = 1.0
        if self.first > self.tolerance and criterion > 0.0:
            within = min(max(math.log(self.first / criterion) / math.log(self.first / self.tolerance), 0.0), 1.0)
        # never backwards, though the criterion need not fall monotonically
        self.fraction = max(self.fraction, float(min(self.done_before + self.share * within, 1.0)))
        now = time.perf_counter()
        if self.checkpoint is not None and (force or now - self.last_report >= self.every_seconds):
            self.checkpoint(self.fraction, f"{self.label}: {criterion:.2e}")
            self.last_report = now


def solve(
    model: ModelParams,
    grid: StateGrid,
    settings: SolveSettings,
    xp: Any,
    checkpoint: Checkpoint | None = None,
    checkpoint_seconds: float = 1.0,
    on_level: LevelCallback | None = None,
) -> Solution:
    check_gpus(settings.gpus, xp, settings.fused)  # before any work
    dtype = np.dtype(settings.dtype)
    shapes = level_shapes(grid.shape, settings.coarse_to_fine, settings.coarsest_size)
    weights = np.array([float(np.prod(s)) for s in shapes])
    weights /= weights.sum()
    tracker = _Tracker(model.delta, settings.tolerance, settings.criterion, xp)
    history: list[dict[str, Any]] = []
    levels: list[LevelReport] = []

    values: Any = None
    policy: Any = None
    previous_grid: StateGrid | None = None
    for level_index, shape in enumerate(shapes):
        level_grid = grid.with_shape(shape)
        level_start = time.perf_counter()
        if previous_grid is None:
            values = xp.zeros(shape, dtype=dtype)
            policy = None
        else:
            baseline = value_baseline(model, settings.interpolation)
            quadratic = settings.interpolation == "quadratic"
            values = transfer(values, previous_grid, level_grid, xp, dtype, baseline, quadratic)
            policy = transfer(policy, previous_grid, level_grid, xp, dtype) if policy is not None else None
        operator, gpus = level_operator(model, level_grid, settings, xp)
        if settings.policy != "optimal":
            policy = policy_on_grid(settings.policy, model, level_grid, xp, dtype)
        reporter = _LevelReporter(
            checkpoint, checkpoint_seconds, settings, shape, float(weights[:level_index].sum()), weights[level_index]
        )
        operator.heartbeat = reporter.heartbeat
        iterations = sweeps = 0
        converged = False
        mixer = AndersonMixer(settings.anderson_memory, xp) if settings.evaluation == "anderson" else None
        improvement_seconds = 0.0

        while iterations < settings.max_iterations:
            iterations += 1
            step_start = time.perf_counter()
            if settings.policy == "optimal":
                new_values, policy = operator.improve(values, policy)
            else:
                new_values = operator.evaluate(values, policy)
            stats = tracker.measure(new_values, values)  # on a GPU its three scalars wait for the step
            if settings.policy == "optimal":
                improvement_seconds += time.perf_counter() - step_start
            history.append(
                {
                    "grid": list(shape),
                    "iteration": iterations,
                    "step": "improve" if settings.policy == "optimal" else "evaluate",
                    **stats,
                }
            )
            if stats["criterion"] < settings.tolerance:
                values = new_values + 0.5 * (stats["mqp_lower"] + stats["mqp_upper"])
                converged = True
                break
            reporter(stats["criterion"], force=settings.policy == "optimal")
            if settings.policy == "optimal":
                values, done = _evaluate_policy(operator, new_values, policy, settings, tracker, history, shape, mixer)
                sweeps += done
            else:
                values = new_values if mixer is None else mixer.mix(values, new_values)
        synchronize(xp)
        seconds = time.perf_counter() - level_start
        levels.append(LevelReport(shape, iterations, sweeps, converged, seconds, gpus, improvement_seconds))
        previous_grid = level_grid
        if on_level is not None:
            on_level(level_grid, values, policy)
        if checkpoint is not None:
            checkpoint(float(weights[: level_index + 1].sum()), f"{settings.policy} {'x'.join(map(str, shape))} done")
    return Solution(grid, values, policy, levels[-1].converged, levels, history)


def _evaluate_policy(
    operator: BellmanOperator,
    values: Any,
    policy: Any,
    settings: SolveSettings,
    tracker: _Tracker,
    history: list[dict[str, Any]],
    shape: tuple[int, int, int],
    mixer: AndersonMixer | None,
) -> tuple[Any, int]:
    """Up to ``evaluation_sweeps`` sweeps of ``T_u`` (modified policy iteration); stops once ``T_u``'s own
    criterion is 10x below tol. With a mixer each sweep is applied to the Anderson mix of the previous ones
    (the criterion is still that of the sweep itself, ``T_u x - x``); without, to the last sweep's output."""
    if mixer is not None:
        mixer.reset()  # a new policy is a new map: differences of the old one would mislead
    done = 0
    for _ in range(settings.evaluation_sweeps):
        new_values = operator.evaluate(values, policy)
        stats = tracker.measure(new_values, values)
        done += 1
        if stats["criterion"] < 0.1 * settings.tolerance:
            values = new_values
            break
        values = new_values if mixer is None else mixer.mix(values, new_values)
    if done:
        history.append({"grid": list(shape), "step": "evaluate", "sweeps": done, **stats})
    return values, done
