"""Krusell-Smith benchmarks: one panel simulation and full solves (GPU when available, else NumPy).

    python bench/ks_bench.py panel --n-agents 10000000 --periods 1000 --interpolation catmull_rom
    python bench/ks_bench.py solve --k-size 500 --K-size 50 --n-agents 10000000
    GPUEST_DEVICE=cpu python bench/ks_bench.py solve --n-agents 10000          # the NumPy path

Prints one JSON object per run (last line) with the device, seconds and the solution's statistics.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from kernels.backend import device_label, get_namespace, synchronize, to_numpy
from kernels.ks.grids import Grids
from kernels.ks.model import Calibration
from kernels.ks.policy import EulerProblem, PolicySettings, initial_policy, solve_policy
from kernels.ks.simulate import aggregate_path, initial_employment, simulate_panel
from kernels.ks.solve import SolveSettings, solve
from kernels.timing import StageTimer

# converged ALM at the standard settings (NumPy, N = 10,000, bilinear): the policy the panel benchmark uses
REFERENCE_ALM = np.array([0.144219, 0.960361, 0.154786, 0.958879])


def bench_panel(args: argparse.Namespace) -> dict:
    xp = get_namespace()
    cal, grids = Calibration(), Grids(args.k_size, 0.0, 1000.0, 7.0, args.K_size, 30.0, 50.0)
    problem = EulerProblem(xp, cal, grids, args.interpolation)
    policy = solve_policy(xp, problem, REFERENCE_ALM, initial_policy(xp, grids), PolicySettings(tolerance=1e-8)).policy
    dtype = np.float64 if args.precision == "float64" else np.float32
    k0 = xp.full(args.n_agents, cal.steady_state_capital, dtype=dtype)
    e0 = initial_employment(xp, cal, args.seed, args.n_agents, 0)
    a_path = aggregate_path(cal, args.seed, args.periods + 1)
    simulate_panel(xp, cal, grids, args.interpolation, policy, k0, e0, a_path[:3], args.seed)  # compile, warm
    times = []
    for _ in range(args.repeats):
        synchronize(xp)
        start = time.perf_counter()
        result = simulate_panel(xp, cal, grids, args.interpolation, policy, k0, e0, a_path, args.seed)
        synchronize(xp)
        times.append(time.perf_counter() - start)
    best = min(times)
    return {"bench": "ks_panel", "device": device_label(xp), "n_agents": args.n_agents, "periods": args.periods,
            "interpolation": args.interpolation, "precision": args.precision, "grid": f"{args.k_size}x{args.K_size}",
            "seconds_best": best, "seconds_all": times,
            "agent_periods_per_second": args.n_agents * args.periods / best,
            "mean_K_after_100": float(np.mean(result.capital_path[100:])) if args.periods > 100 else None}


def bench_solve(args: argparse.Namespace) -> dict:
    xp = get_namespace()
    cal, grids = Calibration(), Grids(args.k_size, 0.0, 1000.0, 7.0, args.K_size, 30.0, 50.0)
    settings = SolveSettings(n_agents=args.n_agents, periods=args.periods, burn_in=args.burn_in,
                             tolerance=args.tolerance, interpolation=args.interpolation, precision=args.precision,
                             seed=args.seed, max_iterations=args.max_iterations)
    timer = StageTimer(xp)
    synchronize(xp)
    start = time.perf_counter()
    solution = solve(xp, cal, grids, settings, timer)
    synchronize(xp)
    seconds = time.perf_counter() - start
    bad, good = solution.regressions
    policy = to_numpy(solution.policy)
    return {"bench": "ks_solve", "device": device_label(xp), "grid": f"{args.k_size}x{args.K_size}",
            "n_agents": args.n_agents, "periods": args.periods, "interpolation": args.interpolation,
            "precision": args.precision, "tolerance": args.tolerance, "seconds_end_to_end": seconds,
            "timings": timer.as_dict(), "iterations": solution.iterations, "converged": solution.converged,
            "policy_iterations_total": int(sum(solution.policy_iterations)),
            "alm": {"bad": [bad.intercept, bad.slope, bad.r2, bad.se], "good": [good.intercept, good.slope, good.r2,
                                                                                good.se]},
            "den_haan_max_pct": solution.den_haan_max, "den_haan_mean_pct": solution.den_haan_mean,
            "policy_at_k40_K40": float(policy[1, 1, np.searchsorted(grids.k, 40.0), 0])}


def summarize(path: str) -> None:
    """One line per benchmark of a log of this script's JSON lines."""
    with open(path) as log:
        rows = [json.loads(line) for line in log if line.startswith("{")]
    for r in rows:
        head = f"{r['bench']:9s} {r['grid']:6s} N={r['n_agents']:>9,d} {r['interpolation']:11s} {r['precision']} " \
               f"[{r['device']}]"
        if r["bench"] == "ks_panel":
            print(f"{head} T={r['periods']}: {r['seconds_best']:.3f} s")
        else:
            bad, good, t = r["alm"]["bad"], r["alm"]["good"], r["timings"]
            print(f"{head} T={r['periods']}: {r['seconds_end_to_end']:.2f} s end to end (policy {t['policy']:.2f}, "
                  f"panel {t['panel']:.2f}), iterations {r['iterations']} converged={r['converged']}, "
                  f"bad {bad[0]:.5f} + {bad[1]:.5f} ln K (R2 {bad[2]:.7f}), "
                  f"good {good[0]:.5f} + {good[1]:.5f} ln K (R2 {good[2]:.7f}), "
                  f"Den Haan max/mean {r['den_haan_max_pct']:.3f}/{r['den_haan_mean_pct']:.3f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["panel", "solve", "summary"])
    parser.add_argument("--log", help="summary: the JSON-lines log to tabulate")
    parser.add_argument("--n-agents", type=int, default=10_000)
    parser.add_argument("--periods", type=int, default=None, help="default: panel 1000, solve 1100")
    parser.add_argument("--burn-in", type=int, default=100)
    parser.add_argument("--k-size", type=int, default=100)
    parser.add_argument("--K-size", dest="K_size", type=int, default=4)
    parser.add_argument("--interpolation", choices=["bilinear", "catmull_rom"], default="catmull_rom")
    parser.add_argument("--precision", choices=["float64", "float32"], default="float64")
    parser.add_argument("--tolerance", type=float, default=1e-7)
    parser.add_argument("--max-iterations", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.what == "summary":
        summarize(args.log)
        return
    if args.periods is None:
        args.periods = 1000 if args.what == "panel" else 1100
    out = bench_panel(args) if args.what == "panel" else bench_solve(args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
