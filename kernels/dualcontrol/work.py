"""The dualcontrol_solve kind's work measure (``JobKind.work``, capped by ``GPUEST_CPU_MAX_WORK``): grid points
x quadrature nodes x evaluations per point (scan_points + golden_iterations for the optimal policy, 1
otherwise): the cost of one Bellman sweep."""

from __future__ import annotations

from kernels.dualcontrol.spec import DualControlParams
from kernels.registry import DatasetRows, Work


def solve_work(params: DualControlParams, _rows: DatasetRows) -> Work:
    grid = params.grid
    points = grid.x.size * grid.mu.size * grid.sigma.size
    evaluations = params.minimizer.scan_points + params.minimizer.golden_iterations if params.policy == "optimal" else 1
    return Work(float(points) * params.quadrature_nodes * evaluations,
                "grid points x quadrature_nodes x evaluations per point (one Bellman sweep)", "params.grid")
