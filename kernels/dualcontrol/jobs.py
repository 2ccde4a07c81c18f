"""The ``dualcontrol_solve`` job kind, wired to the registry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kernels.backend import device_label, get_namespace, to_numpy
from kernels.dualcontrol.bellman import MinimiserSettings
from kernels.dualcontrol.grid import StateGrid, interpolate, make_state_grid
from kernels.dualcontrol.model import ModelParams
from kernels.dualcontrol.solve import Solution, SolveSettings, solve
from kernels.dualcontrol.spec import DualControlParams, DualControlResult, LevelReport, StateReport
from kernels.progress import Progress
from kernels.registry import JobKind
from kernels.timing import StageTimer

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


def run_solve(params: DualControlParams, data: Mapping[str, Any], progress: Progress) -> dict[str, Any]:
    states = np.asarray(params.report_states, dtype=np.float64)  # inside the cuboid: the spec checks
    xp = get_namespace()
    timer = StageTimer(xp)
    with timer.stage("setup"):
        model = ModelParams(**params.model.model_dump())
        grid = _grid(params)
        tolerance = params.effective_tolerance
    optimal = params.policy == "optimal"
    main_share = 0.85 if optimal else 0.95
    progress(0.0, f"{params.policy}: solving")

    with timer.stage("solve"):
        solution = solve(
            model,
            grid,
            _settings(params, params.policy, tolerance),
            xp,
            checkpoint=lambda f, stage: progress(main_share * f, stage),
        )
    myopic: Solution | None = None
    if optimal:
        with timer.stage("myopic_companion"):
            myopic = solve(
                model,
                grid,
                _settings(params, "myopic", min(tolerance, _MYOPIC_COMPANION_TOLERANCE)),
                xp,
                checkpoint=lambda f, stage: progress(main_share + 0.1 * f, stage),
            )

    with timer.stage("report"):
        value, policy = to_numpy(solution.value), to_numpy(solution.policy)
        values_at, controls_at = _at_states(value, grid, states), _at_states(policy, grid, states)
        progress.save_artifact("value", value)
        progress.save_artifact("policy", policy)
        progress.save_artifact("grid", {"x": grid.x.nodes(), "mu": grid.mu.nodes(), "sigma": grid.sigma.nodes()})
        artifacts = ["value", "policy", "grid"]
        myopic_values = myopic_controls = None
        if myopic is not None:
            my_value, my_policy = to_numpy(myopic.value), to_numpy(myopic.policy)
            myopic_values, myopic_controls = _at_states(my_value, grid, states), _at_states(my_policy, grid, states)
            progress.save_artifact("myopic_value", my_value)
            artifacts.append("myopic_value")
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
    progress(1.0, f"{params.policy}: done")
    result = DualControlResult(
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
        value_of_experimentation=None
        if myopic_values is None
        else [float(m - v) for m, v in zip(myopic_values, values_at, strict=True)],
        myopic_iterations=None if myopic is None else myopic.iterations,
        artifacts=artifacts,
        device=device_label(xp),
        timings=timer.as_dict(),
    )
    return result.model_dump(mode="json")


KINDS = [
    JobKind(
        name="dualcontrol_solve",
        params_model=DualControlParams,
        run=run_solve,
        summary="Dual control (learning and experimentation) dynamic programme: inert, myopic or optimal policy",
        example={
            "policy": "optimal",
            "grid": {
                "x": {"size": 32, "min": -9.0, "max": 11.0},
                "mu": {"size": 32, "min": -4.0, "max": 4.0},
                "sigma": {"size": 32, "min": 0.02, "max": 2.0},
                "concentration": 2.0,
            },
            "quadrature_nodes": 32,
            "report_states": [[1.0, 0.5, 0.5], [2.0, 0.0, 1.0]],
        },
    ),
]
