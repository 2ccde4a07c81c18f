"""Parameters and result of the ``ks_solve`` job kind (Krusell-Smith by the KS algorithm, both stages on the GPU)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from kernels.ks import SOLVE_KIND
from kernels.ks.inputs import JEDC_PERIODS
from kernels.ks.model import (
    CALIBRATION_PRESETS,
    DHJJ_TRANSITION,
    PRESET_K_GRID,
    Calibration,
    validate_calibration,
)
from kernels.ks.simulate import MIN_AGENTS_PER_GPU
from kernels.ks.solve import MIN_DEN_HAAN_PERIODS, MIN_REGRESSION_PERIODS
from kernels.spec import JobParams, ResultModel, ResultPart, settings_from

DEFAULT_SEED = 19_980_101


class _Part(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


class IndividualGrid(_Part):
    """k_i = min + (max - min) (i / (size - 1))^spacing_power."""

    size: int = Field(default=100, ge=100, le=1000, description="points of the individual capital grid")
    min: float = Field(default=0.0, ge=0.0, le=1e6, description="borrowing limit (lowest capital)")
    max: float = Field(default=1000.0, gt=0.0, le=1e7)
    spacing_power: float = Field(default=7.0, ge=1.0, le=20.0, description="polynomial spacing exponent theta")

    @model_validator(mode="after")
    def _ordered(self) -> IndividualGrid:
        if not self.max > self.min:
            raise ValueError("k_grid.max must exceed k_grid.min")
        return self


class AggregateGrid(_Part):
    size: int = Field(default=4, ge=4, le=100, description="points of the uniform aggregate capital grid")
    min: float = Field(default=30.0, gt=0.0, le=1e6)
    max: float = Field(default=50.0, gt=0.0, le=1e7)

    @model_validator(mode="after")
    def _ordered(self) -> AggregateGrid:
        if not self.max > self.min:
            raise ValueError("K_grid.max must exceed K_grid.min")
        return self


class CalibrationSpec(_Part):
    """Den Haan, Judd & Juillard (2010) by default; transition rows/columns (bad,u), (bad,e), (good,u), (good,e).

    ``preset`` names a calibration (``model.CALIBRATION_PRESETS``) whose values fill the fields not given."""

    preset: Literal["dhjj2010", "ks1998"] | None = Field(
        default=None,
        description="named calibration: dhjj2010 (the defaults) or ks1998 (mu = 0, l_bar = 0.3271: Krusell-Smith "
        "1998 as in HARK's KrusellSmithEconomy); fields given beside it override it",
    )
    beta: float = Field(default=0.99, gt=0.0, lt=1.0)
    gamma: float = Field(default=1.0, gt=0.0, le=20.0)
    alpha: float = Field(default=0.36, gt=0.0, lt=1.0)
    delta: float = Field(default=0.025, ge=0.0, le=1.0)
    l_bar: float = Field(default=1.0 / 0.9, gt=0.0, le=100.0)
    mu: float = Field(default=0.15, ge=0.0, le=1.0)
    delta_a: float = Field(default=0.01, ge=0.0, lt=1.0)
    u_bad: float = Field(default=0.10, gt=0.0, lt=1.0)
    u_good: float = Field(default=0.04, gt=0.0, lt=1.0)
    transition: list[list[float]] = Field(
        default_factory=lambda: [list(row) for row in DHJJ_TRANSITION], min_length=4, max_length=4
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_preset(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("preset") in CALIBRATION_PRESETS:
            return {**CALIBRATION_PRESETS[data["preset"]], **data}
        return data

    def to_calibration(self) -> Calibration:
        return settings_from(Calibration, self, transition=tuple(tuple(row) for row in self.transition))

    @model_validator(mode="after")
    def _consistent(self) -> CalibrationSpec:
        if any(len(row) != 4 for row in self.transition):
            raise ValueError("calibration.transition must be 4 x 4")
        validate_calibration(self.to_calibration())
        return self


class KSSolveParams(JobParams):
    """Krusell & Smith (1998) in the Den Haan-Judd-Juillard (2010) version, by the KS algorithm with
    Euler-equation iteration (Maliar, Maliar & Valli 2010) and a simulated panel (Hatcher & Scheffel 2014)."""

    n_agents: int = Field(default=10_000, ge=1_000, le=200_000_000, description="agents in the simulated panel")
    periods: int = Field(default=1_100, ge=50, le=100_000, description="T, simulated periods")
    burn_in: int = Field(
        default=100, ge=0, le=99_000, validate_default=True,
        description=f"periods discarded before the regression; at least {MIN_REGRESSION_PERIODS} periods must "
        f"remain",
    )
    k_grid: IndividualGrid = Field(default_factory=IndividualGrid)
    K_grid: AggregateGrid = Field(default_factory=AggregateGrid)
    tolerance: float = Field(default=1e-7, gt=0.0, le=0.1, description="stop when ||B_new - B||_2 < tolerance")
    damping: float = Field(default=0.3, gt=0.0, le=1.0, description="weight of the new regression in the ALM update")
    alm_update: Literal["damped", "anderson", "newton"] = Field(
        default="damped",
        description="outer-loop update of the ALM: damped (B <- damping B_new + (1 - damping) B), anderson (Anderson "
        "acceleration of the same map, fewer iterations), newton (quasi-Newton with the coarse stage's Jacobian: "
        "needs coarse_agents) (docs/ks.md)",
    )
    gpus: int = Field(
        default=1, ge=1, le=16,
        description=f"GPUs of the worker's host the full panel is spread over (agents in slices, K summed on the "
        f"host each period: pays at tens of millions of agents); more than 1 needs a GPU worker with that many "
        f"devices, {MIN_AGENTS_PER_GPU:,} agents per GPU and alm_simulation 'panel' (docs/ks.md)",
    )
    coarse_agents: int = Field(
        default=0, ge=0, le=200_000_000, validate_default=True,
        description="0: off; otherwise solve first on a panel of this many agents (1,000 or more, fewer than "
        "n_agents; to 1e-5), then refine on the full panel from its ALM and ergodic cross-section: the full "
        "panel's own fixed point in a few iterations (the fast path at large n_agents, docs/ks.md)",
    )
    max_iterations: int = Field(default=100, ge=1, le=1000, description="outer (ALM) iterations at most")
    interpolation: Literal["bilinear", "catmull_rom", "cubic"] = Field(
        default="catmull_rom", description="policy interpolation (policy step and panel); 'cubic' is the local "
        "cubic (four-point Lagrange) in physical k and K, the most accurate (docs/ks.md)"
    )
    precision: Literal["float64", "float32"] = Field(
        default="float64", description="panel arithmetic (the policy step is always float64)"
    )
    seed: int = Field(default=DEFAULT_SEED, ge=0, le=2**63 - 1, description="Philox key of every draw")
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)
    policy_tolerance: float = Field(default=1e-8, gt=0.0, le=1e-2, description="max |k'_new - k'| of the policy step")
    policy_method: Literal["time_iteration", "egm"] = Field(
        default="time_iteration",
        description="policy step: Euler-equation time iteration (MMV) or the endogenous grid method (Carroll 2006; "
        "converges undamped, also without unemployment benefit, mu = 0)",
    )
    policy_damping: float | None = Field(
        default=None, gt=0.0, le=1.0,
        description="weight of the new policy per step (default 0.7 for time_iteration, 1 for egm)",
    )
    policy_max_iterations: int = Field(default=20_000, ge=10, le=1_000_000)
    den_haan_periods: int | None = Field(
        default=None, ge=0, le=100_000,
        description=f"length of the fresh accuracy-test path: 0 skips the test, otherwise at least "
        f"{MIN_DEN_HAAN_PERIODS} (default periods)",
    )
    initial_alm: list[float] = Field(
        default_factory=lambda: [0.0, 1.0, 0.0, 1.0], min_length=4, max_length=4,
        description="starting ALM [b0_bad, b1_bad, b0_good, b1_good] (warm start; default ln K' = ln K)",
    )
    initial_distribution: str | None = Field(
        default=None,
        description="dataset id with column k (and optionally employed, 0/1); row i mod rows starts agent i",
    )
    alm_simulation: Literal["panel", "histogram"] = Field(
        default="panel",
        description="what the ALM is fitted to: panel, the mean capital of n_agents simulated agents (Hatcher & "
        "Scheffel); histogram, the mean of a non-stochastic histogram of the cross-section on 2,001 capital nodes "
        "moved along the same aggregate path (Young 2010, MMV's non-stochastic simulation): no sampling noise, "
        "n_agents unused; with interpolation 'cubic' it reaches MMV's published accuracy (docs/ks.md)",
    )
    accuracy_test: Literal["panel", "jedc"] = Field(
        default="panel",
        description="panel: Den Haan's test on a fresh stochastic path of the panel; jedc: the Den Haan-Judd-"
        "Juillard (2010) test, a non-stochastic histogram moved along the comparison's 10,000-period shock path "
        "from its initial cross-section, with Euler-equation errors (docs/ks.md)",
    )
    accuracy_path: str | None = Field(
        default=None, validate_default=True,
        description="jedc test: dataset id with column a (0 bad, 1 good) and optionally employed (0/1, one "
        "agent's path for the Euler errors), replacing the comparison's shock path",
    )
    accuracy_distribution: str | None = Field(
        default=None,
        description="jedc test: dataset id with columns k (increasing nodes), unemployed and employed (masses), "
        "replacing the comparison's initial cross-section",
    )

    @model_validator(mode="before")
    @classmethod
    def _preset_K_grid(cls, data: object) -> object:
        # a calibration preset brings a K grid around its own steady state unless K_grid is given
        if isinstance(data, dict) and "K_grid" not in data and isinstance(data.get("calibration"), dict):
            preset = data["calibration"].get("preset")
            if preset in PRESET_K_GRID:
                low, high = PRESET_K_GRID[preset]
                return {**data, "K_grid": {"min": low, "max": high}}
        return data

    # Field validators see the fields defined before theirs (info.data; absent when those failed): each rule
    # across fields sits on the later field, so the API's 422 names a field the rule is about.
    @field_validator("burn_in")
    @classmethod
    def _panel_long_enough(cls, burn_in: int, info: ValidationInfo) -> int:
        periods = info.data.get("periods")
        if periods is not None and burn_in + MIN_REGRESSION_PERIODS > periods:
            raise ValueError(f"burn_in ({burn_in:,}) must leave at least {MIN_REGRESSION_PERIODS} of the "
                             f"{periods:,} periods for the ALM regression")
        return burn_in

    @field_validator("gpus")
    @classmethod
    def _enough_agents_per_gpu(cls, gpus: int, info: ValidationInfo) -> int:
        n_agents = info.data.get("n_agents")
        if n_agents is not None and gpus > 1 and n_agents < MIN_AGENTS_PER_GPU * gpus:
            raise ValueError(f"gpus = {gpus} needs at least {MIN_AGENTS_PER_GPU:,} agents per GPU: n_agents "
                             f"{n_agents:,} is fewer than {MIN_AGENTS_PER_GPU * gpus:,}")
        return gpus

    @field_validator("coarse_agents")
    @classmethod
    def _staged_solve_consistent(cls, coarse_agents: int, info: ValidationInfo) -> int:
        n_agents = info.data.get("n_agents")
        if coarse_agents and n_agents is not None and not 1_000 <= coarse_agents < n_agents:
            raise ValueError(f"coarse_agents must be 0 (off) or at least 1,000 and fewer than n_agents "
                             f"({n_agents:,}), not {coarse_agents:,}")
        if not coarse_agents and info.data.get("alm_update") == "newton":
            raise ValueError("alm_update 'newton' takes its Jacobian from the coarse stage: set coarse_agents "
                             "(e.g. 100000), or use alm_update 'anderson'")
        return coarse_agents

    @field_validator("alm_simulation")
    @classmethod
    def _histogram_has_no_panel(cls, alm_simulation: str, info: ValidationInfo) -> str:
        if alm_simulation == "histogram":
            if info.data.get("coarse_agents"):
                raise ValueError("coarse_agents stages the panel: it has no meaning with alm_simulation 'histogram'")
            gpus = info.data.get("gpus", 1)
            if gpus > 1:
                raise ValueError(f"alm_simulation 'histogram' moves one histogram on the host: gpus = {gpus} spreads "
                                 f"a panel over GPUs; set gpus to 1 or alm_simulation to 'panel'")
        return alm_simulation

    @field_validator("accuracy_path", "accuracy_distribution")
    @classmethod
    def _accuracy_inputs_need_the_jedc_test(cls, dataset_id: str | None, info: ValidationInfo) -> str | None:
        if dataset_id is not None and info.data.get("accuracy_test", "jedc") != "jedc":
            raise ValueError(f"{info.field_name} is an input of the jedc accuracy test: set accuracy_test to 'jedc'")
        return dataset_id

    @field_validator("accuracy_path")
    @classmethod
    def _jedc_path_long_enough(cls, accuracy_path: str | None, info: ValidationInfo) -> str | None:
        periods = info.data.get("den_haan_periods")
        if (accuracy_path is None and info.data.get("accuracy_test") == "jedc" and periods is not None
                and periods > JEDC_PERIODS):
            raise ValueError(f"den_haan_periods: the jedc test's path has {JEDC_PERIODS} periods, not {periods}; "
                             f"lower den_haan_periods or give a longer path as accuracy_path")
        return accuracy_path

    @field_validator("den_haan_periods")
    @classmethod
    def _den_haan_test_or_none(cls, value: int | None) -> int | None:
        if value is not None and 0 < value < MIN_DEN_HAAN_PERIODS:
            raise ValueError(f"den_haan_periods must be 0 (skip the accuracy test) or at least "
                             f"{MIN_DEN_HAAN_PERIODS}, not {value}")
        return value


class StateALM(ResultPart):
    intercept: float
    slope: float
    r2: float
    se: float = Field(description="standard error of the regression, sqrt(SSR / (n - 2))")
    n_obs: int


class ALM(ResultPart):
    bad: StateALM
    good: StateALM


class DenHaanError(ResultPart):
    max_pct: float = Field(description="max over t of 100 |ln K_t(ALM alone) - ln K_t(panel)| on a fresh path")
    mean_pct: float
    periods: int
    test: str = Field(default="panel", description="panel (the panel on a fresh stochastic path), histogram (the "
                      "solve's histogram on a fresh path) or jedc (a histogram on the JEDC path)")


class EulerErrorStats(ResultPart):
    mean_log10: float = Field(description="log10 of the mean |c / c_Euler - 1| (points at the borrowing limit "
                              "under both left out)")
    max_log10: float
    points: int


class AccuracyStats(ResultPart):
    test: str = Field(description="jedc (the comparison's inputs) or dataset (uploaded path or cross-section)")
    periods: int
    den_haan_max_pct: float
    den_haan_mean_pct: float
    mean_capital: float = Field(description="mean of K_t along the test's histogram path")
    euler_grid: EulerErrorStats = Field(description="on the histogram's k nodes x K on and between the K nodes")
    euler_path: EulerErrorStats | None = Field(description="along one agent's path through the test (idshock)")


class KSSolveResult(ResultModel):
    kind: Literal[SOLVE_KIND] = SOLVE_KIND  # type: ignore[valid-type]
    alm: ALM
    den_haan_error: DenHaanError | None
    iterations: int
    coarse_iterations: int = Field(default=0, description="outer iterations of the coarse stage (coarse_agents)")
    converged: bool
    warnings: list[str] = Field(
        default_factory=list,
        description="what to know about this solution (e.g. the outer loop stopped before converging); a K grid "
        "the simulated K leaves, or a degenerate regression, ends the job failed instead",
    )
    last_change: float = Field(description="||B_new - B||_2 at the last outer iteration")
    policy_iterations: list[int] = Field(description="Euler-equation iterations per outer iteration")
    mean_capital: float = Field(description="mean of K_t after burn_in in the last simulation")
    n_agents: int
    periods: int
    burn_in: int
    k_grid_size: int
    K_grid_size: int
    interpolation: str
    precision: str
    seed: int
    accuracy: AccuracyStats | None = None
