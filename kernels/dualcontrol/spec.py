"""Parameters and result of the ``dualcontrol_solve`` job kind."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from kernels.dualcontrol import SOLVE_KIND
from kernels.spec import JobParams, ResultModel, ResultPart

DEFAULT_TOLERANCE = {"inert": 1e-6, "myopic": 1e-6, "optimal": 1e-4}
MAX_GRID_POINTS = 1 << 26  # 4 x 256^3: about 0.5 GB per float64 array, a few arrays live at once
MAX_SIMULATED_PATHS = 1 << 20  # paths x report states: a few 8 MB arrays per policy live during the simulation


class _Section(BaseModel):
    model_config = JobParams.model_config


class ModelSpec(_Section):
    """``x' = alpha + beta u + gamma x + eps``, ``beta ~ N(mu, Sigma)`` unknown; loss
    ``(x' - xbar)^2 + omega (u - ubar)^2`` discounted by ``delta``."""

    alpha: float = Field(default=0.0, ge=-1e3, le=1e3, description="constant term")
    gamma: float = Field(default=0.7, gt=-1.0, lt=1.0, description="known persistence")
    sigma_eps: float = Field(default=1.0, gt=0.0, le=1e3, description="shock standard deviation")
    delta: float = Field(default=0.95, ge=0.0, le=0.999, description="discount factor")
    omega: float = Field(default=1.0, ge=0.0, le=1e6, description="weight of control deviations")
    xbar: float = Field(default=1.0, ge=-1e3, le=1e3, description="target of x")
    ubar: float = Field(default=0.0, ge=-1e3, le=1e3, description="costless control")


class AxisSpec(_Section):
    size: int = Field(ge=8, le=512, description="grid nodes on this axis")
    min: float = Field(ge=-1e6, le=1e6)
    max: float = Field(ge=-1e6, le=1e6)

    @model_validator(mode="after")
    def _ordered(self) -> AxisSpec:
        if not self.max > self.min:
            raise ValueError(f"max ({self.max}) must exceed min ({self.min})")
        return self


class GridSpec(_Section):
    x: AxisSpec = AxisSpec(size=64, min=-9.0, max=11.0)
    mu: AxisSpec = AxisSpec(size=64, min=-4.0, max=4.0)
    sigma: AxisSpec = AxisSpec(size=64, min=0.02, max=2.0)
    concentration: float = Field(
        default=2.0,
        ge=0.0,
        le=10.0,
        description="node density near x = xbar and mu = 0: spacing there is 1/cosh(c) of the spacing at the "
        "farther end (0 = uniform); Sigma is always uniform",
    )
    mu_concentration: float | None = Field(
        default=None,
        ge=0.0,
        le=10.0,
        description="node density near mu = 0 alone (default: concentration): the value has a cusp along the "
        "non-learning line mu = 0",
    )
    mu_node_at_zero: bool = Field(
        default=True,
        description="shift the mu nodes (by less than half a step) so that one sits exactly at mu = 0, where "
        "nothing is learnt (when 0 lies inside the mu range)",
    )

    @model_validator(mode="after")
    def _sizes(self) -> GridSpec:
        if self.sigma.min <= 0.0:
            raise ValueError(f"sigma.min must be positive (a variance), not {self.sigma.min}")
        points = self.x.size * self.mu.size * self.sigma.size
        if points > MAX_GRID_POINTS:
            raise ValueError(f"x.size * mu.size * sigma.size = {points} exceeds the limit of {MAX_GRID_POINTS}")
        return self


class AccelerationSpec(_Section):
    evaluation_sweeps: int = Field(
        default=20,
        ge=0,
        le=1000,
        description="modified policy iteration: policy evaluation sweeps between two improvement steps "
        "(optimal policy; 0 = plain value iteration)",
    )
    coarse_to_fine: bool = Field(default=True, description="warm start from grids halved per axis")
    coarsest_size: int = Field(default=16, ge=8, le=512, description="no coarse level has an axis below this")
    evaluation: Literal["sweeps", "anderson"] = Field(
        default="anderson",
        description="policy evaluation (inert and myopic solves, and between two improvement steps): plain "
        "sweeps V <- T_u V, or each sweep applied to the Anderson mix of the last anderson_memory sweeps "
        "(fewer sweeps, the same stopping rule, closer to the fixed point)",
    )
    anderson_memory: int = Field(default=8, ge=1, le=32, description="sweeps the Anderson mix draws on")


class MinimizerSpec(_Section):
    scan_points: int = Field(default=8, ge=2, le=128, description="equally spaced restarts across the bracket")
    golden_iterations: int = Field(
        default=16, ge=0, le=200,
        description="golden-section steps after the scan (16 end as close to the fixed point as 28; "
        "docs/dualcontrol.md)",
    )


class SimulationSpec(_Section):
    """Monte Carlo of each policy's cost from every report state (common random numbers across policies)."""

    paths: int = Field(default=2000, ge=2, le=1_000_000, description="simulated paths per report state")
    horizon: int | None = Field(
        default=None,
        ge=1,
        le=5000,
        description="periods simulated before the tail delta^horizon V(S_T) (default: delta^horizon <= 1e-3)",
    )
    seed: int = Field(default=0, ge=0, lt=2**63, description="Philox key of the draws")


class DualControlParams(JobParams):
    """Learning-and-experimentation dynamic programme (Morozov & Mathur 2011) on a 3-D state grid."""

    model: ModelSpec = ModelSpec()
    grid: GridSpec = GridSpec()
    quadrature_nodes: int = Field(default=32, ge=2, le=128, description="Gauss-Hermite nodes")
    policy: Literal["inert", "myopic", "optimal"] = "optimal"
    tolerance: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description="relative convergence tolerance (default 1e-6 for inert and myopic, 1e-4 for optimal)",
    )
    convergence: Literal["macqueen_porteus", "sup_norm"] = Field(
        default="macqueen_porteus",
        description="stopping rule: width of the MacQueen-Porteus bounds, or the paper's delta/(1-delta) "
        "scaled sup-norm step; both relative to max |V|",
    )
    max_iterations: int = Field(default=2000, ge=1, le=100_000, description="sweeps per grid level")
    acceleration: AccelerationSpec = AccelerationSpec()
    minimizer: MinimizerSpec = MinimizerSpec()
    precision: Literal["float64", "float32"] = "float64"
    gpus: int = Field(
        default=1,
        ge=1,
        le=16,
        description="GPUs of the worker's host each Bellman sweep is spread over (the grid's points in slabs, one "
        "per GPU, every GPU holding the whole value array: the one-GPU result bit for bit); a grid level runs on "
        "fewer where each GPU would get under 2^18 points (coarse levels, small grids); more than 1 needs a GPU "
        "worker with that many devices (docs/dualcontrol.md)",
    )
    interpolation: Literal["quadratic", "trilinear", "residual"] = Field(
        default="quadratic",
        description="quadratic: trilinear plus the correction -(1/2) V_xx (x - x_i)(x_{i+1} - x), V_xx the "
        "three-point second difference in x, exact for V quadratic in x (the inert value); trilinear: V "
        "itself; residual: V - V0 (V0 the inert closed form) plus V0, which undershoots where control pays on "
        "coarse grids. All constant beyond the cuboid (residual: V - V0 constant). docs/dualcontrol.md",
    )
    error_estimate: bool = Field(
        default=True,
        description="also solve on the grid halved per axis and halved again (where no coarse-to-fine level "
        "already did; about 1/7 of the cost) for the discretisation-error estimate of every reported value",
    )
    simulation: SimulationSpec | None = Field(
        default=None, description="Monte Carlo of each policy's cost from the report states (off the grid)"
    )
    report_states: list[list[float]] = Field(
        default_factory=lambda: [[1.0, 0.5, 0.5], [2.0, 0.0, 1.0], [0.0, 1.0, 0.25]],
        min_length=1,
        max_length=10_000,
        description="states [x, mu, Sigma] (inside the grid's cuboid) at which to report value and control",
    )

    @model_validator(mode="after")
    def _states(self) -> DualControlParams:
        axes = (("x", self.grid.x), ("mu", self.grid.mu), ("Sigma", self.grid.sigma))
        for i, state in enumerate(self.report_states):
            if len(state) != 3:
                raise ValueError(f"report_states[{i}] must be [x, mu, Sigma], got {len(state)} numbers")
            for value, (name, axis) in zip(state, axes, strict=True):
                if not axis.min <= value <= axis.max:
                    raise ValueError(
                        f"report_states[{i}]: {name} = {value} lies outside the grid's [{axis.min}, {axis.max}]"
                    )
        return self

    @model_validator(mode="after")
    def _simulation_size(self) -> DualControlParams:
        if self.simulation is not None:
            total = self.simulation.paths * len(self.report_states)
            if total > MAX_SIMULATED_PATHS:
                raise ValueError(
                    f"simulation.paths * len(report_states) = {total} exceeds the limit of {MAX_SIMULATED_PATHS}"
                )
        return self

    @property
    def effective_tolerance(self) -> float:
        return self.tolerance if self.tolerance is not None else DEFAULT_TOLERANCE[self.policy]


class StateReport(ResultPart):
    state: list[float]
    value: float = Field(
        description="cost-to-go of the solved policy at this exact state: min over u (optimal) or the policy's "
        "control (inert, myopic) of the one-step Bellman right-hand side, V from the grid only one step ahead"
    )
    control: float = Field(description="the policy's control at this exact state (optimal: the minimiser)")
    value_error: float | None = Field(
        default=None,
        description="discretisation-error estimate of value (Richardson-type, from the grids halved per axis) "
        "plus the iteration tolerance; null when no coarser grid was solved",
    )
    interpolated_value: float = Field(description="the grid value interpolated at the state (not the report)")
    interpolated_control: float = Field(description="the grid policy interpolated at the state")
    myopic_value: float | None = Field(default=None, description="optimal policy only: the myopic cost-to-go")
    myopic_control: float | None = None
    myopic_value_error: float | None = None
    value_of_experimentation: float | None = Field(
        default=None, description="optimal policy only: myopic minus optimal cost at this state"
    )
    value_of_experimentation_error: float | None = Field(
        default=None, description="discretisation-error estimate of value_of_experimentation (as value_error)"
    )


class PolicyCost(ResultPart):
    mean: float
    standard_error: float


class StateSimulation(ResultPart):
    state: list[float]
    costs: dict[str, PolicyCost] = Field(description="Monte Carlo cost of each policy (inert control variate)")
    value_of_experimentation: PolicyCost | None = Field(
        default=None, description="optimal policy only: myopic minus optimal cost, common random numbers"
    )


class SimulationReport(ResultPart):
    paths: int
    horizon: int
    seed: int
    states: list[StateSimulation]


class LevelReport(ResultPart):
    grid: list[int]
    iterations: int
    evaluation_sweeps: int
    converged: bool
    seconds: float
    gpus: int = Field(default=1, description="GPUs this level's sweeps were spread over")


class DualControlResult(ResultModel):
    kind: Literal[SOLVE_KIND] = SOLVE_KIND  # type: ignore[valid-type]
    policy: str
    tolerance: float
    convergence: str
    precision: str
    quadrature_nodes: int
    grid: list[int]
    states: list[StateReport]
    iterations: int = Field(description="sweeps of the Bellman (optimal) or policy operator over all levels")
    evaluation_sweeps: int = Field(description="modified-policy-iteration sweeps over all levels")
    converged: bool
    gpus: int = Field(
        default=1,
        description="GPUs the finest grid's sweeps were spread over (params gpus, or fewer on a grid of under 2^18 "
        "points per GPU)",
    )
    history: list[dict[str, Any]]
    levels: list[LevelReport]
    value_of_experimentation: list[float] | None = Field(
        default=None, description="optimal policy only: myopic cost minus optimal cost at each report state"
    )
    error_grids: list[list[int]] = Field(
        default_factory=list, description="the coarser grids whose exact-state values give the error estimates"
    )
    simulation: SimulationReport | None = None
    myopic_iterations: int | None = None
    artifacts: list[str]
