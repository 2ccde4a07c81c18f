"""The ``ks_solve`` job kind, wired to the registry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kernels.backend import device_label, get_namespace, to_numpy
from kernels.ks.grids import Grids
from kernels.ks.policy import PolicySettings
from kernels.ks.solve import SolveSettings, solve
from kernels.ks.spec import ALM, DenHaanError, KSSolveParams, KSSolveResult, StateALM
from kernels.progress import Progress
from kernels.registry import JobKind
from kernels.timing import StageTimer


def _initial_distribution(params: KSSolveParams, frame: Any) -> tuple[np.ndarray, np.ndarray | None]:
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


def run_solve(params: KSSolveParams, data: Mapping[str, Any], progress: Progress) -> dict[str, Any]:
    xp = get_namespace()
    timer = StageTimer(xp)
    initial_k = initial_employed = None
    if params.initial_distribution is not None:
        initial_k, initial_employed = _initial_distribution(params, data["initial_distribution"])
    cal = params.calibration.to_calibration()
    grids = Grids(params.k_grid.size, params.k_grid.min, params.k_grid.max, params.k_grid.spacing_power,
                  params.K_grid.size, params.K_grid.min, params.K_grid.max)
    settings = SolveSettings(
        n_agents=params.n_agents, periods=params.periods, burn_in=params.burn_in, tolerance=params.tolerance,
        damping=params.damping, max_iterations=params.max_iterations, interpolation=params.interpolation,
        precision=params.precision, seed=params.seed,
        policy=PolicySettings(params.policy_tolerance, params.policy_damping, params.policy_max_iterations),
        den_haan_periods=params.den_haan_periods,
        initial_alm=tuple(params.initial_alm),  # type: ignore[arg-type]
    )
    progress(0.0, "setup")
    solution = solve(xp, cal, grids, settings, timer, report=progress, initial_k=initial_k,
                     initial_employed=initial_employed)
    with timer.stage("artifacts"):
        progress.save_artifact("capital_path", {"K": solution.capital_path,
                                                "a": solution.a_path[: solution.capital_path.size].astype(np.int8)})
        progress.save_artifact("policy", {"policy": to_numpy(solution.policy), "k_grid": grids.k,
                                          "K_grid": grids.K})
        if solution.den_haan_panel is not None:
            progress.save_artifact("den_haan_path", {"K_panel": solution.den_haan_panel, "K_alm": solution.den_haan_alm,
                                                     "a": solution.den_haan_a})
    bad, good = solution.regressions
    den_haan = None
    if solution.den_haan_max is not None and solution.den_haan_panel is not None:
        den_haan = DenHaanError(max_pct=solution.den_haan_max, mean_pct=solution.den_haan_mean,
                                periods=int(solution.den_haan_panel.size))
    result = KSSolveResult(
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
        device=device_label(xp),
        timings=timer.as_dict(),
    )
    progress(1.0, "done")
    return result.model_dump(mode="json")


KINDS = [
    JobKind(
        name="ks_solve",
        params_model=KSSolveParams,
        run=run_solve,
        dataset_fields=("initial_distribution",),
        summary="Krusell-Smith (1998) economy solved by the KS algorithm: Euler-equation policy step and "
        "panel simulation both on the GPU",
        example={"n_agents": 10_000, "periods": 1_100, "burn_in": 100, "interpolation": "catmull_rom", "seed": 1},
    ),
]
