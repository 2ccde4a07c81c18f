"""The ks_solve kind's work measure (``JobKind.work``, capped by ``GPUEST_CPU_MAX_WORK``): n_agents x periods,
the panel simulated in each outer iteration."""

from __future__ import annotations

from kernels.ks.spec import KSSolveParams
from kernels.registry import DatasetRows, Work


def solve_work(params: KSSolveParams, _rows: DatasetRows) -> Work:
    return Work(float(params.n_agents) * params.periods, "n_agents x periods", "params.n_agents")
