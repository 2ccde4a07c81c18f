"""The ``ks_solve`` job kind, wired to the registry (the model and its conventions: ``docs/ks.md``)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from kernels.backend import to_host
from kernels.context import RunContext
from kernels.ks import SOLVE_KIND
from kernels.ks.accuracy import HistogramTest, histogram_test
from kernels.ks.grids import Grids
from kernels.ks.inputs import AccuracyInputs, distribution_from_frame, jedc_inputs, path_from_frame
from kernels.ks.policy import DEFAULT_DAMPING, PolicySettings
from kernels.ks.solve import Solution, SolveSettings, solve
from kernels.ks.spec import (
    ALM,
    AccuracyStats,
    DenHaanError,
    EulerErrorStats,
    KSSolveParams,
    KSSolveResult,
    StateALM,
)
from kernels.ks.work import DEFAULT_CPU_MAX_WORK, solve_work
from kernels.registry import JobKind, KindExample
from kernels.spec import settings_from

if TYPE_CHECKING:
    import pandas as pd

INITIAL_DISTRIBUTION = "initial_distribution"  # the params field that names the optional dataset
ACCURACY_PATH = "accuracy_path"  # the jedc test's optional datasets (docs/ks.md)
ACCURACY_DISTRIBUTION = "accuracy_distribution"


def _initial_distribution(params: KSSolveParams, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray | None]:
    if "k" not in frame.columns:
        raise ValueError("initial_distribution: the dataset needs a column 'k' (individual capital)")
    k = np.asarray(frame["k"], dtype=np.float64)
    if k.size == 0 or not np.all(np.isfinite(k)):
        raise ValueError("initial_distribution: column 'k' must be non-empty and finite")
    if k.min() < params.k_grid.min or k.max() > params.k_grid.max:
        raise ValueError(f"initial_distribution: column 'k' must lie in [k_grid.min, k_grid.max] = "
                         f"[{params.k_grid.min}, {params.k_grid.max}]")
    employed = None
    if "employed" in frame.columns:
        employed = np.asarray(frame["employed"])
        if not np.isin(employed, (0, 1)).all():
            raise ValueError("initial_distribution: column 'employed' must hold 0 or 1")
    return k, employed


def _grids(params: KSSolveParams) -> Grids:
    return Grids(params.k_grid.size, params.k_grid.min, params.k_grid.max, params.k_grid.spacing_power,
                 params.K_grid.size, params.K_grid.min, params.K_grid.max)


def policy_damping(params: KSSolveParams) -> float:
    """The policy step's damping: the one given, else the method's default (0.7 time iteration, 1 EGM)."""
    return DEFAULT_DAMPING[params.policy_method] if params.policy_damping is None else params.policy_damping


def solve_settings(params: KSSolveParams) -> SolveSettings:
    """The kernel's settings: the params' fields of the same name, the policy step's from ``policy_*``."""
    return settings_from(
        SolveSettings, params,
        policy=settings_from(PolicySettings, params, prefix="policy_", damping=policy_damping(params)),
        den_haan_periods=0 if params.accuracy_test == "jedc" else params.den_haan_periods,  # jedc: after the solve
        initial_alm=tuple(params.initial_alm),
    )


def _save_artifacts(ctx: RunContext, solution: Solution, grids: Grids) -> None:
    ctx.save_artifact("capital_path", {"K": solution.capital_path,
                                       "a": solution.a_path[: solution.capital_path.size].astype(np.int8)})
    ctx.save_artifact("policy", {"policy": to_host(solution.policy), "k_grid": grids.k, "K_grid": grids.K})
    if solution.den_haan_panel is not None:
        ctx.save_artifact("den_haan_path", {"K_panel": solution.den_haan_panel, "K_alm": solution.den_haan_alm,
                                            "a": solution.den_haan_a})


def _accuracy_inputs(params: KSSolveParams, ctx: RunContext) -> AccuracyInputs:
    """The jedc test's inputs: the comparison's file, an uploaded path or cross-section in place of its own."""
    inputs = jedc_inputs()
    if params.accuracy_path is not None:
        a_path, employed = path_from_frame(ctx.dataset(ACCURACY_PATH), ACCURACY_PATH)
        inputs = replace(inputs, a_path=a_path, employed_path=employed, name="dataset")
    if params.accuracy_distribution is not None:
        k, masses = distribution_from_frame(ctx.dataset(ACCURACY_DISTRIBUTION), ACCURACY_DISTRIBUTION,
                                            params.k_grid.min, params.k_grid.max)
        inputs = replace(inputs, k_nodes=k, distribution=masses, name="dataset")
    if params.den_haan_periods is not None and params.den_haan_periods > inputs.periods:
        raise ValueError(f"den_haan_periods: the accuracy test's path has {inputs.periods} periods, "
                         f"not {params.den_haan_periods}")
    return inputs


def _accuracy_stats(test: HistogramTest) -> AccuracyStats:
    path = None if test.euler_path is None else EulerErrorStats(**vars(test.euler_path))
    return AccuracyStats(test=test.name, periods=int(test.capital.size), den_haan_max_pct=test.max_pct,
                         den_haan_mean_pct=test.mean_pct, mean_capital=test.mean_capital,
                         euler_grid=EulerErrorStats(**vars(test.euler_grid)), euler_path=path)


def _result(params: KSSolveParams, solution: Solution, accuracy: HistogramTest | None = None) -> KSSolveResult:
    bad, good = solution.regressions
    den_haan = None
    if solution.den_haan_max is not None and solution.den_haan_panel is not None:
        den_haan = DenHaanError(max_pct=solution.den_haan_max, mean_pct=solution.den_haan_mean,
                                periods=int(solution.den_haan_panel.size),
                                test="histogram" if params.alm_simulation == "histogram" else "panel")
    if accuracy is not None:
        den_haan = DenHaanError(max_pct=accuracy.max_pct, mean_pct=accuracy.mean_pct,
                                periods=int(accuracy.capital.size), test="jedc")
    return KSSolveResult(
        alm=ALM(bad=StateALM(**vars(bad)), good=StateALM(**vars(good))),
        den_haan_error=den_haan,
        iterations=solution.iterations,
        coarse_iterations=solution.coarse_iterations,
        converged=solution.converged,
        warnings=solution.warnings,
        last_change=solution.last_change,
        policy_iterations=solution.policy_iterations,
        mean_capital=float(np.mean(solution.capital_path[params.burn_in:])),
        n_agents=params.n_agents,
        periods=params.periods,
        burn_in=params.burn_in,
        k_grid_size=params.k_grid.size,
        K_grid_size=params.K_grid.size,
        interpolation=params.interpolation,
        precision=params.precision,
        seed=params.seed,
        accuracy=None if accuracy is None else _accuracy_stats(accuracy),
    )


def run_solve(params: KSSolveParams, ctx: RunContext) -> KSSolveResult:
    initial_k = initial_employed = None
    if params.initial_distribution is not None:  # a named dataset the context lacks fails loudly
        initial_k, initial_employed = _initial_distribution(params, ctx.dataset(INITIAL_DISTRIBUTION))
    jedc = params.accuracy_test == "jedc" and params.den_haan_periods != 0
    inputs = _accuracy_inputs(params, ctx) if jedc else None  # bad inputs fail before the solve
    grids = _grids(params)
    cal = params.calibration.to_calibration()
    ctx.progress(0.0, "setup")
    solution = solve(ctx.xp, cal, grids, solve_settings(params), ctx.timer,
                     report=ctx.progress, initial_k=initial_k, initial_employed=initial_employed)
    accuracy = None
    if inputs is not None:
        ctx.progress(0.95, "JEDC accuracy test")
        with ctx.stage("accuracy_test"):
            accuracy = histogram_test(cal, grids, params.interpolation, solution.policy, solution.alm, inputs,
                                      params.den_haan_periods,
                                      lambda t: ctx.progress(0.95, f"JEDC accuracy test: period {t}"))
    with ctx.stage("artifacts"):
        _save_artifacts(ctx, solution, grids)
        if accuracy is not None:
            individual = {} if accuracy.individual_k is None else {"k_individual": accuracy.individual_k}
            ctx.save_artifact("accuracy_path", {"K": accuracy.capital, "K_alm": accuracy.capital_alm,
                                                "a": accuracy.a_path, **individual})
    return _result(params, solution, accuracy)


# Small enough for NumPy in CI (~2-3 s on two cores), yet both GPU kernels run: a cold start (ln K' = ln K)
# stopped after two outer iterations, so the ALM change and the Den Haan gaps are far from zero and the
# NumPy and GPU results agree to well within the cross-backend test's 1e-9 (bilinear: the least rounding
# amplification, see tests/kernels/ks/test_ks_gpu.py).
EXAMPLE = KindExample({
    "n_agents": 4_000, "periods": 400, "burn_in": 100, "k_grid": {"size": 100}, "K_grid": {"size": 4},
    "max_iterations": 2, "interpolation": "bilinear", "policy_tolerance": 1e-4, "den_haan_periods": 200,
    "seed": 1,
})

KS_SOLVE = JobKind(
    name=SOLVE_KIND,
    params_model=KSSolveParams,
    result_model=KSSolveResult,
    run=run_solve,
    example=EXAMPLE,
    dataset_fields=(INITIAL_DISTRIBUTION, ACCURACY_PATH, ACCURACY_DISTRIBUTION),
    summary="Krusell-Smith (1998) economy solved by the KS algorithm: Euler-equation or EGM policy step and "
    "panel simulation on the GPU (or the ALM fitted on a non-stochastic histogram), the JEDC 2010 accuracy test",
    work=solve_work,
    cpu_max_work=DEFAULT_CPU_MAX_WORK,
    plots_module="plots.ks",
)

KINDS = [KS_SOLVE]
