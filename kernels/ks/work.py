"""The ks_solve kind's work measure (``JobKind.work``, capped by ``GPUEST_CPU_MAX_WORK`` and
``GPUEST_CPU_MAX_JOB_BYTES``).

Work: every outer (ALM) iteration at its cap, max_iterations, solves the policy, policy_max_iterations Euler
steps at most, each interpolating k'' at the four next states for every one of the 4 x k_grid.size x
K_grid.size grid entries, and simulates the panel, n_agents x periods (or the histogram's nodes x periods);
a staged solve runs the same loop on coarse_agents first; the Den Haan test simulates the panel once more over
its own path (the JEDC test moves a histogram along its 10,000 periods).

Memory: the panel's per-agent arrays (capital, employment, draws and the interpolation's temporaries) and the
policy step's arrays over the grid.
"""

from __future__ import annotations

from kernels.ks.inputs import JEDC_PERIODS
from kernels.ks.solve import SolveSettings
from kernels.ks.spec import KSSolveParams
from kernels.registry import DatasetRows, Work

# The default CPU cap (JobKind.cpu_max_work): the defaults (about 1.4e10 at their caps) pass, a 1,000 x 100
# policy grid at a million Euler steps does not.
DEFAULT_CPU_MAX_WORK = 1e11
# Next states (a', eps') a policy-grid entry interpolates at, and the grid's (a, eps) planes.
_NEXT_STATES, _PLANES = 4, 4
# Bytes per agent of the NumPy panel: capital, employment, the draws, the interpolation's temporaries.
_BYTES_PER_AGENT = 128
# Arrays of the policy grid's size alive during an Euler step (the four next states' intermediates).
_POLICY_ARRAYS = 64


def policy_units(params: KSSolveParams) -> float:
    """One policy step at its cap: Euler steps x grid entries x next states."""
    return float(params.policy_max_iterations) * _PLANES * params.k_grid.size * params.K_grid.size * _NEXT_STATES


def panel_units(params: KSSolveParams, agents: int) -> float:
    """One simulation of the panel of ``agents`` (or of the histogram) over the periods."""
    width = SolveSettings.histogram_nodes * 2 if params.alm_simulation == "histogram" else agents
    return float(width) * params.periods


def accuracy_units(params: KSSolveParams) -> float:
    if params.accuracy_test == "jedc":
        return float(SolveSettings.histogram_nodes) * 2 * JEDC_PERIODS
    periods = params.periods if params.den_haan_periods is None else params.den_haan_periods
    return float(params.n_agents) * periods


def solve_work(params: KSSolveParams, _rows: DatasetRows) -> Work:
    stages = [params.n_agents] + ([params.coarse_agents] if 0 < params.coarse_agents < params.n_agents else [])
    policy = policy_units(params) * params.max_iterations * len(stages)
    panel = sum(panel_units(params, agents) for agents in stages) * params.max_iterations
    policy_bytes = float(_PLANES * params.k_grid.size * params.K_grid.size) * 8 * _POLICY_ARRAYS
    panel_bytes = 0.0 if params.alm_simulation == "histogram" else float(params.n_agents) * _BYTES_PER_AGENT
    return Work(
        policy + panel + accuracy_units(params),
        "max_iterations x (policy_max_iterations x 16 x k_grid.size x K_grid.size + n_agents x periods) "
        "+ the accuracy test's panel",
        "params.policy_max_iterations" if policy > panel else "params.n_agents",
        panel_bytes + policy_bytes,
        f"n_agents x {_BYTES_PER_AGENT} bytes + 4 x k_grid.size x K_grid.size x {_POLICY_ARRAYS} float64s",
        "params.k_grid" if policy_bytes > panel_bytes else "params.n_agents",
    )
