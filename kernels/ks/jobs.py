"""The ``ks_solve`` job kind, wired to the registry (the model and its conventions: ``docs/ks.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kernels.backend import to_host
from kernels.context import RunContext
from kernels.ks.grids import Grids
from kernels.ks.policy import PolicySettings
from kernels.ks.solve import Solution, SolveSettings, solve
from kernels.ks.spec import ALM, DenHaanError, KSSolveParams, KSSolveResult, StateALM
from kernels.registry import JobKind, KindExample

if TYPE_CHECKING:
    import pandas as pd

INITIAL_DISTRIBUTION = "initial_distribution"  # the params field that names the optional dataset


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


def _settings(params: KSSolveParams) -> SolveSettings:
    return SolveSettings(
        n_agents=params.n_agents, periods=params.periods, burn_in=params.burn_in, tolerance=params.tolerance,
        damping=params.damping, max_iterations=params.max_iterations, interpolation=params.interpolation,
        precision=params.precision, seed=params.seed,
        policy=PolicySettings(params.policy_tolerance, params.policy_damping, params.policy_max_iterations),
        den_haan_periods=params.den_haan_periods,
        initial_alm=tuple(params.initial_alm),  # type: ignore[arg-type]
    )


def _save_artifacts(ctx: RunContext, solution: Solution, grids: Grids) -> None:
    ctx.save_artifact("capital_path", {"K": solution.capital_path,
                                       "a": solution.a_path[: solution.capital_path.size].astype(np.int8)})
    ctx.save_artifact("policy", {"policy": to_host(solution.policy), "k_grid": grids.k, "K_grid": grids.K})
    if solution.den_haan_panel is not None:
        ctx.save_artifact("den_haan_path", {"K_panel": solution.den_haan_panel, "K_alm": solution.den_haan_alm,
                                            "a": solution.den_haan_a})


def _result(params: KSSolveParams, solution: Solution) -> KSSolveResult:
    bad, good = solution.regressions
    den_haan = None
    if solution.den_haan_max is not None and solution.den_haan_panel is not None:
        den_haan = DenHaanError(max_pct=solution.den_haan_max, mean_pct=solution.den_haan_mean,
                                periods=int(solution.den_haan_panel.size))
    return KSSolveResult(
        alm=ALM(bad=StateALM(**vars(bad)), good=StateALM(**vars(good))),
        den_haan_error=den_haan,
        iterations=solution.iterations,
        converged=solution.converged,
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
    )


def run_solve(params: KSSolveParams, ctx: RunContext) -> KSSolveResult:
    initial_k = initial_employed = None
    if params.initial_distribution is not None:  # a named dataset the context lacks fails loudly
        initial_k, initial_employed = _initial_distribution(params, ctx.dataset(INITIAL_DISTRIBUTION))
    grids = _grids(params)
    ctx.progress(0.0, "setup")
    solution = solve(ctx.xp, params.calibration.to_calibration(), grids, _settings(params), ctx.timer,
                     report=ctx.progress, initial_k=initial_k, initial_employed=initial_employed)
    with ctx.stage("artifacts"):
        _save_artifacts(ctx, solution, grids)
    return _result(params, solution)


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
    name="ks_solve",
    params_model=KSSolveParams,
    result_model=KSSolveResult,
    run=run_solve,
    example=EXAMPLE,
    dataset_fields=(INITIAL_DISTRIBUTION,),
    summary="Krusell-Smith (1998) economy solved by the KS algorithm: Euler-equation policy step and "
    "panel simulation both on the GPU",
)

KINDS = [KS_SOLVE]
