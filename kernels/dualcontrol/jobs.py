"""The ``dualcontrol_solve`` job kind, wired to the registry (the model and the algorithms:
docs/dualcontrol.md)."""

from __future__ import annotations

import numpy as np

from kernels.backend import to_host
from kernels.context import RunContext
from kernels.dualcontrol.bellman import MinimiserSettings
from kernels.dualcontrol.grid import StateGrid, interpolate, make_state_grid
from kernels.dualcontrol.model import ModelParams
from kernels.dualcontrol.solve import Solution, SolveSettings, solve
from kernels.dualcontrol.spec import DualControlParams, DualControlResult, LevelReport, StateReport
from kernels.registry import JobKind, KindExample

# Tolerance of the myopic solve that accompanies an optimal one: its own default, or tighter if asked.
_MYOPIC_COMPANION_TOLERANCE = 1e-6


def _grid(params: DualControlParams) -> StateGrid:
    g = params.grid
    return make_state_grid(
        (g.x.min, g.x.max, g.x.size),
        (g.mu.min, g.mu.max, g.mu.size),
        (g.sigma.min, g.sigma.max, g.sigma.size),
        params.model.xbar,
        g.concentration,
    )


def _at_states(array: np.ndarray, grid: StateGrid, states: np.ndarray) -> np.ndarray:
    nodes = grid.node_arrays(np)
    return interpolate(array, grid, nodes, states[:, 0], states[:, 1], states[:, 2], np)


def _settings(params: DualControlParams, policy: str, tolerance: float) -> SolveSettings:
    acc = params.acceleration
    return SolveSettings(
        policy=policy,  # type: ignore[arg-type]
        tolerance=tolerance,
        max_iterations=params.max_iterations,
        evaluation_sweeps=acc.evaluation_sweeps,
        coarse_to_fine=acc.coarse_to_fine,
        coarsest_size=acc.coarsest_size,
        criterion=params.convergence,
        quadrature_nodes=params.quadrature_nodes,
        dtype=np.float64 if params.precision == "float64" else np.float32,
        minimiser=MinimiserSettings(params.minimizer.scan_points, params.minimizer.golden_iterations),
    )


def _levels(solution: Solution) -> list[LevelReport]:
    return [
        LevelReport(
            grid=list(level.shape),
            iterations=level.iterations,
            evaluation_sweeps=level.evaluation_sweeps,
            converged=level.converged,
            seconds=level.seconds,
        )
        for level in solution.levels
    ]


def _state_reports(
    states: np.ndarray, solution: Solution, myopic: Solution | None, grid: StateGrid, ctx: RunContext
) -> tuple[list[StateReport], list[float] | None]:
    """Value and control at each report state (and the myopic companion's), saving the grid arrays as
    artifacts; the value of experimentation (myopic minus optimal cost) when there is a companion."""
    value, policy = to_host(solution.value), to_host(solution.policy)
    values_at, controls_at = _at_states(value, grid, states), _at_states(policy, grid, states)
    ctx.save_artifact("value", value)
    ctx.save_artifact("policy", policy)
    ctx.save_artifact("grid", {"x": grid.x.nodes(), "mu": grid.mu.nodes(), "sigma": grid.sigma.nodes()})
    myopic_values = myopic_controls = None
    if myopic is not None:
        my_value, my_policy = to_host(myopic.value), to_host(myopic.policy)
        myopic_values, myopic_controls = _at_states(my_value, grid, states), _at_states(my_policy, grid, states)
        ctx.save_artifact("myopic_value", my_value)
    reports = [
        StateReport(
            state=[float(v) for v in state],
            value=float(values_at[i]),
            control=float(controls_at[i]),
            myopic_value=None if myopic_values is None else float(myopic_values[i]),
            myopic_control=None if myopic_controls is None else float(myopic_controls[i]),
        )
        for i, state in enumerate(states)
    ]
    experimentation = (
        None if myopic_values is None else [float(m - v) for m, v in zip(myopic_values, values_at, strict=True)]
    )
    return reports, experimentation


def run_solve(params: DualControlParams, ctx: RunContext) -> DualControlResult:
    states = np.asarray(params.report_states, dtype=np.float64)  # inside the cuboid: the spec checks
    with ctx.stage("setup"):
        model = ModelParams(**params.model.model_dump())
        grid = _grid(params)
        tolerance = params.effective_tolerance
    optimal = params.policy == "optimal"
    main_share = 0.85 if optimal else 0.95
    ctx.progress(0.0, f"{params.policy}: solving")

    with ctx.stage("solve"):
        solution = solve(
            model,
            grid,
            _settings(params, params.policy, tolerance),
            ctx.xp,
            checkpoint=lambda f, stage: ctx.progress(main_share * f, stage),
        )
    myopic: Solution | None = None
    if optimal:
        with ctx.stage("myopic_companion"):
            myopic = solve(
                model,
                grid,
                _settings(params, "myopic", min(tolerance, _MYOPIC_COMPANION_TOLERANCE)),
                ctx.xp,
                checkpoint=lambda f, stage: ctx.progress(main_share + 0.1 * f, stage),
            )

    with ctx.stage("report"):
        reports, experimentation = _state_reports(states, solution, myopic, grid, ctx)
    return DualControlResult(
        policy=params.policy,
        tolerance=tolerance,
        convergence=params.convergence,
        precision=params.precision,
        quadrature_nodes=params.quadrature_nodes,
        grid=list(grid.shape),
        states=reports,
        iterations=solution.iterations,
        evaluation_sweeps=sum(level.evaluation_sweeps for level in solution.levels),
        converged=solution.converged,
        history=solution.history,
        levels=_levels(solution),
        value_of_experimentation=experimentation,
        myopic_iterations=None if myopic is None else myopic.iterations,
        artifacts=["value", "policy", "grid"] + ([] if myopic is None else ["myopic_value"]),
    )


# Small enough for NumPy in CI (about 2 s on two idle cores), yet every GPU path runs in the cross-backend
# test: the optimal policy drives the fused improvement kernel, its modified-policy-iteration sweeps and the
# myopic companion the evaluation kernel. Report states keep mu away from 0: there the optimal control is 0
# up to rounding, and a relative comparison of two rounding residues would mean nothing. The grid stays at
# 12^3, where GPU and NumPy results were measured to agree to 7e-12 on every leaf; on a 10^3 grid one
# improvement step lands on a near-tie of the minimiser and its history entry differs at 4e-6.
EXAMPLE_PARAMS = {
    "policy": "optimal",
    "grid": {
        "x": {"size": 12, "min": -9.0, "max": 11.0},
        "mu": {"size": 12, "min": -4.0, "max": 4.0},
        "sigma": {"size": 12, "min": 0.02, "max": 2.0},
        "concentration": 2.0,
    },
    "quadrature_nodes": 12,
    "tolerance": 1e-4,
    "report_states": [[1.0, 0.5, 0.5], [0.0, 1.0, 0.25]],
}

KINDS = [
    JobKind(
        name="dualcontrol_solve",
        params_model=DualControlParams,
        result_model=DualControlResult,
        run=run_solve,
        example=KindExample(EXAMPLE_PARAMS),
        summary="Dual control (learning and experimentation) dynamic programme: inert, myopic or optimal policy",
    ),
]
