"""The dualcontrol_solve kind's work measure (``JobKind.work``, capped by ``GPUEST_CPU_MAX_WORK`` and
``GPUEST_CPU_MAX_JOB_BYTES``).

Work: every Bellman sweep the solve may take, at its caps, plus the Monte Carlo. A sweep costs grid points x
quadrature nodes x evaluations per point (the optimal improvement step scan_points + golden_iterations, then
evaluation_sweeps policy sweeps of one evaluation each; inert and myopic one evaluation); each grid level,
coarse-to-fine and error grid alike, sweeps at most max_iterations times; an optimal solve brings its myopic
companion (as many sweeps of one evaluation). The simulation costs paths x report states x horizon x the
policies' evaluations per simulated step (the optimal control's one-step minimisation, 1 for the others).

Memory: the finest grid's arrays (value, policy, the new sweep, the Anderson mix's memory) plus the operator's
chunk of temporaries and the simulation's arrays over paths x report states.
"""

from __future__ import annotations

from kernels.dualcontrol.bellman import CHUNK_ENTRIES
from kernels.dualcontrol.report import ERROR_GRIDS, SIMULATION_MINIMISER, SMALLEST_ERROR_AXIS, halved_shapes
from kernels.dualcontrol.simulate import horizon_for
from kernels.dualcontrol.solve import level_shapes
from kernels.dualcontrol.spec import DualControlParams
from kernels.registry import DatasetRows, Work

# The default CPU cap (JobKind.cpu_max_work): a 32^3 grid with the other defaults passes, the 64^3 default
# (about 9e11 at its iteration caps) does not.
DEFAULT_CPU_MAX_WORK = 2e11
# Arrays of grid size alive during a solve besides the Anderson mix's two per remembered sweep.
_GRID_ARRAYS = 10
# Temporaries of the NumPy operator per (point, node) entry of its chunk, and of the simulation per path.
_CHUNK_TEMPORARIES = 25
_SIMULATION_ARRAYS = 24


def solved_points(params: DualControlParams) -> int:
    """Grid points over every level a solve of one policy sweeps: coarse-to-fine levels and error grids."""
    shape = (params.grid.x.size, params.grid.mu.size, params.grid.sigma.size)
    acceleration = params.acceleration
    shapes = set(level_shapes(shape, acceleration.coarse_to_fine, acceleration.coarsest_size))
    if params.error_estimate:
        shapes.update(halved_shapes(shape, ERROR_GRIDS, SMALLEST_ERROR_AXIS))
    return sum(x * mu * sigma for x, mu, sigma in shapes)


def simulation_units(params: DualControlParams) -> float:
    spec = params.simulation
    if spec is None:
        return 0.0
    horizon = spec.horizon if spec.horizon is not None else horizon_for(params.model.delta)
    per_step = 2.0  # the inert control variate and the myopic (or inert) policy's closed form
    if params.policy == "optimal":
        minimiser = SIMULATION_MINIMISER
        per_step += params.quadrature_nodes * (minimiser.scan_points + minimiser.golden_iterations)
    return float(spec.paths) * len(params.report_states) * horizon * per_step


def solve_work(params: DualControlParams, _rows: DatasetRows) -> Work:
    points = solved_points(params)
    nodes, cap = params.quadrature_nodes, params.max_iterations
    if params.policy == "optimal":
        per_sweep = params.minimizer.scan_points + params.minimizer.golden_iterations
        per_sweep += params.acceleration.evaluation_sweeps
        solve = float(points) * nodes * per_sweep * cap + float(points) * nodes * cap  # + the myopic companion
    else:
        solve = float(points) * nodes * cap
    simulation = simulation_units(params)
    finest = params.grid.x.size * params.grid.mu.size * params.grid.sigma.size
    itemsize = 8 if params.precision == "float64" else 4
    grid_bytes = float(finest) * itemsize * (_GRID_ARRAYS + 2 * params.acceleration.anderson_memory)
    chunk_bytes = float(CHUNK_ENTRIES) * 8 * _CHUNK_TEMPORARIES
    paths = 0 if params.simulation is None else params.simulation.paths * len(params.report_states)
    simulation_bytes = float(paths) * 8 * _SIMULATION_ARRAYS
    big_simulation = simulation > solve
    return Work(
        solve + simulation,
        "sweeps at their caps (grid points over all levels x quadrature_nodes x evaluations per sweep x "
        "max_iterations, with the myopic companion) + simulation paths x report states x horizon x evaluations "
        "per step",
        "params.simulation" if big_simulation else "params.grid",
        grid_bytes + chunk_bytes + simulation_bytes,
        "grid points x bytes per value x arrays alive + the sweep's chunk + simulated paths x arrays",
        "params.simulation.paths" if simulation_bytes > grid_bytes else "params.grid",
    )
