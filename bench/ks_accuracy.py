"""Krusell-Smith accuracy on the Den Haan-Judd-Juillard (2010) standard test (issue 12): solve, then test.

    GPUEST_DEVICE=cpu python bench/ks_accuracy.py                      # default spec: 100 x 4, N = 10,000
    GPUEST_DEVICE=cpu python bench/ks_accuracy.py --interpolation bilinear --seed 2
    python bench/ks_accuracy.py --k-size 500 --K-size 50 --n-agents 10000000   # on a GPU

Solves ``ks_solve``'s default economy (or the grid / N / interpolation given), then runs

* the JEDC test (``kernels/ks/accuracy.py``): the comparison's 10,000-period ``agshock`` path, its initial
  cross-section ``kdist``, a non-stochastic histogram; Den Haan's mean / max of 100 |ln K^ALM - ln K|,
  Euler-equation errors (log10) on the grid and along the ``idshock`` agent, the mean of K;
* the same statistics with the ALM refitted by OLS on the test's own (noise-free) path: the best any
  log-linear ALM can do for this policy, which separates the ALM's estimation error (the panel) from the
  policy's (the interpolation);
* the old stochastic test (a fresh 10,000-period path of the panel) for comparison.

Prints a table and, last, one JSON line. MMV 2010 (KS-sim, 100 x 4, N = 10,000): 0.050 / 0.156.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from kernels.context import local_context
from kernels.ks import alm as alm_mod
from kernels.ks.accuracy import histogram_path, histogram_test
from kernels.ks.grids import Grids
from kernels.ks.inputs import jedc_inputs
from kernels.ks.model import Calibration
from kernels.ks.solve import SolveSettings, solve


def richer_law_errors(capital: np.ndarray, a_path: np.ndarray, form: str) -> tuple[float, float]:
    """Den Haan max / mean (%) of a law of motion richer than the log-linear one, fitted by OLS on the path
    itself and iterated alone from K_0: "quadratic" (ln K' on 1, ln K, (ln K)^2 per a_t) or "two_states" (ln K'
    on 1, ln K per (a_{t-1}, a_t): the employment mix moving with last period's state). What the log-linear
    form cannot express, measured: how far a richer ALM brings the same policy's statistics."""
    log_k = np.log(capital)
    a = np.asarray(a_path[: log_k.size], dtype=np.int64)
    previous = np.concatenate([[a[0]], a[:-1]])
    regime = a if form == "quadratic" else 2 * previous + a
    def regressors(x: np.ndarray) -> np.ndarray:
        columns = [np.ones_like(x), x] + ([x * x] if form == "quadratic" else [])
        return np.stack(columns, axis=-1)
    coef = {}
    for r in np.unique(regime[:-1]):
        rows = np.flatnonzero(regime[:-1] == r)
        coef[int(r)] = np.linalg.lstsq(regressors(log_k[rows]), log_k[rows + 1], rcond=None)[0]
    implied = np.empty_like(log_k)
    implied[0] = log_k[0]
    for t in range(log_k.size - 1):
        implied[t + 1] = regressors(np.array([implied[t]]))[0] @ coef[int(regime[t])]
    gap = 100.0 * np.abs(implied - log_k)
    return float(gap.max()), float(gap.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k-size", type=int, default=100)
    parser.add_argument("--K-size", type=int, default=4)
    parser.add_argument("--n-agents", type=int, default=10_000)
    parser.add_argument("--periods", type=int, default=1_100)
    parser.add_argument("--interpolation", default="catmull_rom", choices=["bilinear", "catmull_rom", "cubic"])
    parser.add_argument("--seed", type=int, default=19_980_101)
    parser.add_argument("--panel-test-periods", type=int, default=10_000, help="0 skips the stochastic test")
    parser.add_argument("--alm-simulation", default="panel", choices=["panel", "histogram"],
                        help="what the solve fits the ALM to (histogram: n_agents unused)")
    args = parser.parse_args()

    ctx = local_context()
    cal = Calibration()
    grids = Grids(args.k_size, 0.0, 1000.0, 7.0, args.K_size, 30.0, 50.0)
    settings = SolveSettings(n_agents=args.n_agents, periods=args.periods, interpolation=args.interpolation,
                             seed=args.seed, den_haan_periods=args.panel_test_periods,
                             alm_simulation=args.alm_simulation)
    started = time.perf_counter()
    solution = solve(ctx.xp, cal, grids, settings)
    solve_seconds = time.perf_counter() - started
    inputs = jedc_inputs()
    started = time.perf_counter()
    test = histogram_test(cal, grids, args.interpolation, solution.policy, solution.alm, inputs)
    test_seconds = time.perf_counter() - started
    path = histogram_path(cal, grids, args.interpolation, solution.policy, inputs)
    refit = alm_mod.coefficients(*alm_mod.regress_alm(path.capital, inputs.a_path, 0))
    refit_max, refit_mean, _ = alm_mod.den_haan_errors(path.capital, inputs.a_path, refit)

    rows = [
        ("ALM of the solve (b0, b1 bad; b0, b1 good)", " ".join(f"{v:.5f}" for v in solution.alm)),
        ("JEDC path: Den Haan mean / max (%)", f"{test.mean_pct:.4f} / {test.max_pct:.4f}"),
        ("JEDC path: mean K", f"{test.mean_capital:.4f}"),
        ("Euler errors on the grid, log10 mean / max",
         f"{test.euler_grid.mean_log10:.2f} / {test.euler_grid.max_log10:.2f}"),
    ]
    if test.euler_path is not None:
        rows.append(("Euler errors along idshock, log10 mean / max",
                     f"{test.euler_path.mean_log10:.2f} / {test.euler_path.max_log10:.2f}"))
    richer = {form: richer_law_errors(path.capital, inputs.a_path, form) for form in ("quadratic", "two_states")}
    rows += [
        ("ALM refitted on the JEDC histogram path", " ".join(f"{v:.5f}" for v in refit)),
        ("  its Den Haan mean / max (%)", f"{refit_mean:.4f} / {refit_max:.4f}"),
        ("quadratic law (ln K^2) refitted on the path: mean / max (%)",
         f"{richer['quadratic'][1]:.4f} / {richer['quadratic'][0]:.4f}"),
        ("law by (a_t-1, a_t) refitted on the path: mean / max (%)",
         f"{richer['two_states'][1]:.4f} / {richer['two_states'][0]:.4f}"),
    ]
    if solution.den_haan_max is not None:
        rows.append((f"stochastic test, fresh {args.panel_test_periods}-period panel path: mean / max (%)",
                     f"{solution.den_haan_mean:.4f} / {solution.den_haan_max:.4f}"))
    rows.append(("MMV 2010 (published): mean / max (%)", "0.050 / 0.156"))
    width = max(len(name) for name, _ in rows)
    print(f"device {ctx.device}, {args.k_size} x {args.K_size}, N = {args.n_agents:,}, T = {args.periods}, "
          f"{args.interpolation}, ALM fitted on the {args.alm_simulation}, seed {args.seed}: "
          f"solve {solve_seconds:.1f} s ({solution.iterations} iterations, "
          f"converged {solution.converged}), JEDC test {test_seconds:.1f} s")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    print(json.dumps({
        "device": str(ctx.device), "k_size": args.k_size, "K_size": args.K_size, "n_agents": args.n_agents,
        "periods": args.periods, "interpolation": args.interpolation, "seed": args.seed,
        "alm_simulation": args.alm_simulation,
        "solve_seconds": solve_seconds, "test_seconds": test_seconds, "alm": solution.alm.tolist(),
        "jedc_den_haan_mean_pct": test.mean_pct, "jedc_den_haan_max_pct": test.max_pct,
        "jedc_mean_capital": test.mean_capital, "euler_grid": vars(test.euler_grid),
        "euler_path": None if test.euler_path is None else vars(test.euler_path),
        "refit_alm": refit.tolist(), "refit_den_haan_mean_pct": refit_mean, "refit_den_haan_max_pct": refit_max,
        "richer_laws_max_mean_pct": richer,
        "panel_den_haan_mean_pct": solution.den_haan_mean, "panel_den_haan_max_pct": solution.den_haan_max,
    }))


if __name__ == "__main__":
    np.seterr(all="ignore")  # log10 of an exact zero error is -inf, reported as such
    main()
