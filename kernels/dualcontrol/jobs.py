"""The ``dualcontrol_solve`` job kind, wired to the registry (the model and the algorithms:
docs/dualcontrol.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernels.backend import to_host
from kernels.context import RunContext
from kernels.dualcontrol import SOLVE_KIND
from kernels.dualcontrol.grid import StateGrid, make_state_grid
from kernels.dualcontrol.model import ModelParams
from kernels.dualcontrol.report import (
    ERROR_GRIDS,
    SMALLEST_ERROR_AXIS,
    ExactReport,
    StateEvaluator,
    exact_report,
    halved_shapes,
    richardson,
    simulation_rules,
)
from kernels.dualcontrol.simulate import horizon_for, simulate_costs
from kernels.dualcontrol.solve import Solution, SolveSettings, solve
from kernels.dualcontrol.spec import (
    DualControlParams,
    DualControlResult,
    LevelReport,
    PolicyCost,
    SimulationReport,
    StateReport,
    StateSimulation,
)
from kernels.dualcontrol.work import DEFAULT_CPU_MAX_WORK, solve_work
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
        mu_concentration=g.mu_concentration,
        mu_node_at_zero=g.mu_node_at_zero,
    )


def _settings(
    params: DualControlParams, policy: str, tolerance: float, coarse_to_fine: bool | None = None
) -> SolveSettings:
    overrides = {} if coarse_to_fine is None else {"coarse_to_fine": coarse_to_fine}
    return SolveSettings.from_params(params, policy, tolerance, **overrides)  # type: ignore[arg-type]


def _levels(solution: Solution) -> list[LevelReport]:
    return [
        LevelReport(
            grid=list(level.shape),
            iterations=level.iterations,
            evaluation_sweeps=level.evaluation_sweeps,
            converged=level.converged,
            seconds=level.seconds,
            gpus=level.gpus,
        )
        for level in solution.levels
    ]


@dataclass
class _PolicyRun:
    """One policy's solve and its exact-state reports on every grid solved for it (finest first when read)."""

    policy: str
    solution: Solution | None = None
    reports: dict[tuple[int, int, int], ExactReport] = field(default_factory=dict)
    scale: float = 0.0  # max |V| on the finest grid

    def sequence(self, shapes: list[tuple[int, int, int]], pick: Callable[[ExactReport], np.ndarray]) -> list:
        return [pick(self.reports[s]) for s in shapes if s in self.reports]


def _solve_with_reports(
    params: DualControlParams,
    model: ModelParams,
    grid: StateGrid,
    policy: str,
    tolerance: float,
    states: np.ndarray,
    ctx: RunContext,
    progress: tuple[float, float],
) -> _PolicyRun:
    """Solve ``policy`` on ``grid``, then on the coarser error grids no coarse-to-fine level covered; the exact
    report at the states is taken on every grid (the finest one's arrays stay on the device)."""
    run = _PolicyRun(policy)

    def record(level_grid: StateGrid, values: Any, policy_array: Any) -> None:
        host_values = to_host(values).astype(np.float64)
        run.reports[level_grid.shape] = exact_report(
            model,
            level_grid,
            policy,
            host_values,
            to_host(policy_array),
            states,
            params.quadrature_nodes,
            params.interpolation,
        )
        if level_grid.shape == grid.shape:
            run.scale = float(np.abs(host_values).max())

    extra = halved_shapes(grid.shape, ERROR_GRIDS, SMALLEST_ERROR_AXIS) if params.error_estimate else []
    start, share = progress
    main_share = share * (0.9 if extra else 1.0)
    run.solution = solve(
        model,
        grid,
        _settings(params, policy, tolerance),
        ctx.xp,
        checkpoint=lambda f, stage: ctx.progress(start + main_share * f, stage),
        on_level=record,
    )
    missing = [shape for shape in extra if shape not in run.reports]
    for k, shape in enumerate(missing):
        done = start + main_share + (share - main_share) * k / len(missing)
        solve(
            model,
            grid.with_shape(shape),
            _settings(params, policy, tolerance, False),
            ctx.xp,
            # progress (and so cancellation) also during the error grids' solves
            checkpoint=lambda f, stage, done=done: ctx.progress(
                done + (share - main_share) * f / len(missing), f"error grid {stage}"
            ),
            on_level=record,
        )
    ctx.progress(start + share, f"{policy}: done")
    return run


def _error(run: _PolicyRun, shapes: list[tuple[int, int, int]], tolerance: float) -> np.ndarray:
    """Richardson-type estimate over the grid sequence plus the iteration tolerance (times max |V|)."""
    return richardson(run.sequence(shapes, lambda r: r.value)) + tolerance * run.scale


def _optional(values: np.ndarray | None, i: int) -> float | None:
    if values is None or not np.isfinite(values[i]):
        return None
    return float(values[i])


def _simulate(
    params: DualControlParams,
    model: ModelParams,
    runs: dict[str, _PolicyRun],
    states: np.ndarray,
    ctx: RunContext,
    progress: tuple[float, float],
) -> SimulationReport:
    """Monte Carlo of every solved policy (the main one and the myopic companion) from the report states,
    each with its control at the exact simulated states and its finest grid value for the tail; on the job's
    device (the optimal control is a one-step minimisation at paths x states points every period)."""
    spec = params.simulation
    assert spec is not None
    controls, tails = {}, {}
    for name, run in runs.items():
        assert run.solution is not None
        evaluator = StateEvaluator(model, run.solution.grid, run.solution.value, params.quadrature_nodes,
                                   params.interpolation, ctx.xp)
        controls[name], tails[name] = simulation_rules(model, name, evaluator, run.solution.policy)
    horizon = spec.horizon if spec.horizon is not None else horizon_for(model.delta)
    start, share = progress
    result = simulate_costs(model, states, controls, tails, spec.paths, horizon, spec.seed, ctx.xp,
                            checkpoint=lambda f, stage: ctx.progress(start + share * f, stage))
    voe = result.differences.get(("myopic", "optimal"))
    return SimulationReport(
        paths=spec.paths,
        horizon=horizon,
        seed=spec.seed,
        states=[
            StateSimulation(
                state=[float(v) for v in state],
                costs={
                    name: PolicyCost(mean=float(est.mean[i]), standard_error=float(est.standard_error[i]))
                    for name, est in result.costs.items()
                },
                value_of_experimentation=None
                if voe is None
                else PolicyCost(mean=float(voe.mean[i]), standard_error=float(voe.standard_error[i])),
            )
            for i, state in enumerate(states)
        ],
    )


def _state_reports(
    states: np.ndarray,
    main: _PolicyRun,
    myopic: _PolicyRun | None,
    shapes: list[tuple[int, int, int]],
    tolerances: tuple[float, float],
) -> tuple[list[StateReport], list[float] | None]:
    """The exact-state reports with their error estimates; the value of experimentation (myopic minus optimal
    cost) when there is a companion, its error from the same grid sequence of that difference."""
    finest = main.reports[shapes[0]]
    value_error = _error(main, shapes, tolerances[0])
    has_estimate = len(main.sequence(shapes, lambda r: r.value)) >= 2
    my_report = my_error = voe = voe_error = None
    if myopic is not None:
        my_report = myopic.reports[shapes[0]]
        my_error = _error(myopic, shapes, tolerances[1])
        voe = my_report.value - finest.value
        voe_sequence = [
            myopic.reports[s].value - main.reports[s].value for s in shapes if s in main.reports and s in myopic.reports
        ]
        # The difference's own grid sequence under-covered on coarse grids (at 24 x 12 x 12: 26.6 +- 1.4
        # against a simulated 15.7), so the estimate is at least that of two independent
        # errors, hypot(myopic, optimal).
        voe_error = np.maximum(
            richardson(voe_sequence) + tolerances[0] * main.scale + tolerances[1] * myopic.scale,
            np.hypot(value_error, my_error),
        )
    if not has_estimate:
        value_error = my_error = voe_error = None
    reports = [
        StateReport(
            state=[float(v) for v in state],
            value=float(finest.value[i]),
            control=float(finest.control[i]),
            value_error=_optional(value_error, i),
            interpolated_value=float(finest.interpolated_value[i]),
            interpolated_control=float(finest.interpolated_control[i]),
            myopic_value=None if my_report is None else float(my_report.value[i]),
            myopic_control=None if my_report is None else float(my_report.control[i]),
            myopic_value_error=_optional(my_error, i),
            value_of_experimentation=_optional(voe, i),
            value_of_experimentation_error=_optional(voe_error, i),
        )
        for i, state in enumerate(states)
    ]
    return reports, None if voe is None else [float(v) for v in voe]


def run_solve(params: DualControlParams, ctx: RunContext) -> DualControlResult:
    states = np.asarray(params.report_states, dtype=np.float64)  # inside the cuboid: the spec checks
    with ctx.stage("setup"):
        model = ModelParams(**params.model.model_dump())
        grid = _grid(params)
        tolerance = params.effective_tolerance
    optimal = params.policy == "optimal"
    simulate_share = 0.05 if params.simulation is not None else 0.0
    main_share = (0.85 if optimal else 0.95) - simulate_share
    ctx.progress(0.0, f"{params.policy}: solving")

    with ctx.stage("solve"):
        main = _solve_with_reports(params, model, grid, params.policy, tolerance, states, ctx, (0.0, main_share))
    myopic: _PolicyRun | None = None
    companion_tolerance = min(tolerance, _MYOPIC_COMPANION_TOLERANCE)
    if optimal:
        with ctx.stage("myopic_companion"):
            myopic = _solve_with_reports(
                params, model, grid, "myopic", companion_tolerance, states, ctx, (main_share, 0.1)
            )
    simulation = None
    if params.simulation is not None:
        with ctx.stage("simulation"):
            ctx.progress(0.95 - simulate_share, "simulating the policies' costs")
            simulation = _simulate(params, model, {r.policy: r for r in (main, myopic) if r is not None}, states,
                                   ctx, (0.95 - simulate_share, simulate_share))

    with ctx.stage("report"):
        shapes = [grid.shape, *halved_shapes(grid.shape, ERROR_GRIDS, SMALLEST_ERROR_AXIS)]
        reports, experimentation = _state_reports(states, main, myopic, shapes, (tolerance, companion_tolerance))
        solution = main.solution
        assert solution is not None
        ctx.save_artifact("value", to_host(solution.value))
        ctx.save_artifact("policy", to_host(solution.policy))
        ctx.save_artifact("grid", {"x": grid.x.nodes(), "mu": grid.mu.nodes(), "sigma": grid.sigma.nodes()})
        if myopic is not None and myopic.solution is not None:
            ctx.save_artifact("myopic_value", to_host(myopic.solution.value))
            # the companion's policy too, so the dashboard can set the optimal and myopic controls side by side
            ctx.save_artifact("myopic_policy", to_host(myopic.solution.policy))
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
        gpus=solution.levels[-1].gpus,
        history=solution.history,
        levels=_levels(solution),
        value_of_experimentation=experimentation,
        error_grids=[list(s) for s in shapes[1:] if s in main.reports] if params.error_estimate else [],
        simulation=simulation,
        myopic_iterations=None if myopic is None or myopic.solution is None else myopic.solution.iterations,
        artifacts=["value", "policy", "grid"] + ([] if myopic is None else ["myopic_value", "myopic_policy"]),
    )


# Small enough for NumPy in CI (about 2 s on two idle cores), yet every GPU path runs in the cross-backend
# test: the optimal policy drives the fused improvement kernel, its modified-policy-iteration sweeps and the
# myopic companion the evaluation kernel. Report states keep mu away from 0: there the optimal control is 0
# up to rounding, and a relative comparison of two rounding residues would mean nothing. The grid stays at
# 12^3, where GPU and NumPy results were measured to agree to 7e-12 on every leaf; on a 10^3 grid one
# improvement step lands on a near-tie of the minimiser and its history entry differs at 4e-6.
# The example also runs the quadratic interpolation (the default), the exact-state report and
# one error grid (6^3): every leaf agrees within 2e-10 except the value iteration's stopping
# statistic and bounds (history[].criterion, mqp_upper: small differences of large sums, 1.2e-8 and 6.6e-9
# relative; tests/kernels/test_kinds_examples.py holds them to the sums' scale).
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
        name=SOLVE_KIND,
        params_model=DualControlParams,
        result_model=DualControlResult,
        run=run_solve,
        example=KindExample(EXAMPLE_PARAMS),
        summary="Dual control (learning and experimentation) dynamic programme: inert, myopic or optimal policy",
        work=solve_work,
        cpu_max_work=DEFAULT_CPU_MAX_WORK,
        plots_module="plots.dualcontrol",
    ),
]
