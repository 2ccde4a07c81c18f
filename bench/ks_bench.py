"""Krusell-Smith benchmarks: one panel simulation and full solves (GPU when available, else NumPy).

    python bench/ks_bench.py panel --n-agents 10000000 --periods 1000 --interpolation catmull_rom
    python bench/ks_bench.py panel --n-agents 10000 --periods 1000 --no-graph   # the plain per-period loop
    python bench/ks_bench.py solve --k-size 500 --K-size 50 --n-agents 10000000
    python bench/ks_bench.py solve --k-size 500 --K-size 50 --n-agents 10000000 --alm-update anderson
    python bench/ks_bench.py solve --k-size 500 --K-size 50 --n-agents 10000000 --coarse-agents 100000 \\
        --alm-update newton
    python bench/ks_bench.py solve --no-graph --check-every 1   # before: plain panel loop, read-back every step
    GPUEST_DEVICE=cpu python bench/ks_bench.py solve --n-agents 10000          # the NumPy path
    python bench/ks_bench.py rounding --interpolation catmull_rom --seed 2   # ulp sensitivity (NumPy, ~2 min)
    python bench/ks_bench.py example   # the kind's example on NumPy and the default device, worst gap
    python bench/ks_bench.py job --repeats 2 --spec '{"k_grid": {"size": 500}, "K_grid": {"size": 50},
        "n_agents": 10000000, "coarse_agents": 100000, "alm_update": "anderson"}'   # a job spec as the worker runs it

On the GPU the panel benchmark builds one :class:`CudaPanel` (buffers and, unless ``--no-graph``, the period
loop captured as CUDA graphs), simulates once untimed, then times ``--repeats`` replays; the capture time is
reported on its own (``capture_seconds``: engine construction, once per solve).

Prints one JSON object per run (last line) with the device, seconds and the solution's statistics.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from kernels.backend import is_numpy, synchronize, to_host
from kernels.context import local_context
from kernels.ks.grids import Grids
from kernels.ks.model import Calibration
from kernels.ks.policy import DEFAULT_DAMPING, EulerProblem, PolicySettings, initial_policy, solve_policy
from kernels.ks.simulate import CudaPanel, MultiGpuPanel, aggregate_path, initial_employment, simulate_panel
from kernels.ks.solve import SolveSettings, solve

# converged ALM at the standard settings (NumPy, N = 10,000, bilinear): the policy the panel benchmark uses
REFERENCE_ALM = np.array([0.144219, 0.960361, 0.154786, 0.958879])


def bench_panel(args: argparse.Namespace) -> dict:
    ctx = local_context()  # GPUEST_DEVICE picks the backend (default: the GPU when one is usable)
    xp = ctx.xp
    cal, grids = Calibration(), Grids(args.k_size, 0.0, 1000.0, 7.0, args.K_size, 30.0, 50.0)
    problem = EulerProblem(xp, cal, grids, args.interpolation)
    policy = solve_policy(xp, problem, REFERENCE_ALM, initial_policy(xp, grids), PolicySettings(tolerance=1e-8)).policy
    dtype = np.float64 if args.precision == "float64" else np.float32
    k0 = xp.full(args.n_agents, cal.steady_state_capital, dtype=dtype)
    e0 = initial_employment(xp, cal, args.seed, args.n_agents, 0)
    a_path = aggregate_path(cal, args.seed, args.periods + 1)
    engine, capture_seconds = None, 0.0
    if not is_numpy(xp):
        simulate_panel(xp, cal, grids, args.interpolation, policy, k0, e0, a_path[:3], args.seed)  # compile
        synchronize(xp)
        start = time.perf_counter()
        if args.gpus > 1:  # the panel in slices over GPUs 0 .. gpus - 1 (issue 19)
            engine = MultiGpuPanel(xp, cal, grids, args.interpolation, dtype, args.n_agents, a_path, args.seed,
                                   devices=tuple(range(args.gpus)))
        else:
            engine = CudaPanel(xp, cal, grids, args.interpolation, dtype, args.n_agents, a_path, args.seed,
                               use_graph=args.graph)
        synchronize(xp)
        capture_seconds = time.perf_counter() - start
        engine.simulate(policy, k0, e0)  # warm: first replay

    def run():
        if engine is not None:
            return engine.simulate(policy, k0, e0)
        return simulate_panel(xp, cal, grids, args.interpolation, policy, k0, e0, a_path, args.seed)

    times = []
    for _ in range(args.repeats):
        synchronize(xp)
        start = time.perf_counter()
        result = run()
        synchronize(xp)
        times.append(time.perf_counter() - start)
    best = min(times)
    return {"bench": "ks_panel", "device": ctx.device, "n_agents": args.n_agents, "periods": args.periods,
            "interpolation": args.interpolation, "precision": args.precision, "grid": f"{args.k_size}x{args.K_size}",
            "graph": bool(isinstance(engine, CudaPanel) and engine.graph_used), "capture_seconds": capture_seconds,
            "gpus": args.gpus,
            "seconds_best": best, "seconds_all": times,
            "agent_periods_per_second": args.n_agents * args.periods / best,
            "mean_K_after_100": float(np.mean(result.capital_path[100:])) if args.periods > 100 else None}


def bench_solve(args: argparse.Namespace) -> dict:
    ctx = local_context()
    xp = ctx.xp
    cal, grids = Calibration(), Grids(args.k_size, 0.0, 1000.0, 7.0, args.K_size, 30.0, 50.0)
    settings = SolveSettings(n_agents=args.n_agents, periods=args.periods, burn_in=args.burn_in,
                             tolerance=args.tolerance, interpolation=args.interpolation, precision=args.precision,
                             seed=args.seed, max_iterations=args.max_iterations, panel_graph=args.graph,
                             alm_update=args.alm_update, coarse_agents=args.coarse_agents, damping=args.damping,
                             coarse_first_step=args.coarse_first_step,
                             policy=PolicySettings(check_every=args.check_every, method=args.policy_method,
                                                   damping=DEFAULT_DAMPING[args.policy_method]))
    synchronize(xp)
    start = time.perf_counter()
    solution = solve(xp, cal, grids, settings, ctx.timer)
    synchronize(xp)
    seconds = time.perf_counter() - start
    bad, good = solution.regressions
    policy = to_host(solution.policy)
    return {"bench": "ks_solve", "device": ctx.device, "grid": f"{args.k_size}x{args.K_size}",
            "n_agents": args.n_agents, "periods": args.periods, "interpolation": args.interpolation,
            "precision": args.precision, "tolerance": args.tolerance, "seconds_end_to_end": seconds,
            "graph": solution.panel_graph, "check_every": args.check_every, "policy_method": args.policy_method,
            "alm_update": args.alm_update, "mean_K": float(np.mean(solution.capital_path[args.burn_in:])),
            "coarse_agents": args.coarse_agents, "coarse_iterations": solution.coarse_iterations,
            "jacobian_simulations": solution.jacobian_simulations,
            "damping": args.damping, "coarse_first_step": args.coarse_first_step,
            "timings": ctx.timer.as_dict(), "iterations": solution.iterations, "converged": solution.converged,
            "policy_iterations_total": int(sum(solution.policy_iterations)),
            "alm": {"bad": [bad.intercept, bad.slope, bad.r2, bad.se], "good": [good.intercept, good.slope, good.r2,
                                                                                good.se]},
            "den_haan_max_pct": solution.den_haan_max, "den_haan_mean_pct": solution.den_haan_mean,
            "policy_at_k40_K40": float(policy[1, 1, np.searchsorted(grids.k, 40.0), 0])}


def _gpu_order_mean(k, dtype=None) -> np.float64:
    """Mean of k summed in the panel kernel's order: per-thread grid-stride sums over _MAX_BLOCKS x 256
    threads at most, a shared-memory tree per block, then the same over the block partials."""
    from kernels.ks.simulate import _MAX_BLOCKS, _THREADS

    def tree(values: np.ndarray) -> np.ndarray:  # rows of _THREADS values -> their tree sums
        width = _THREADS // 2
        while width:
            values = values[:, :width] + values[:, width:2 * width]
            width //= 2
        return values[:, 0]

    def strided(values: np.ndarray, lanes: int) -> np.ndarray:
        local = np.zeros(lanes)
        for first in range(0, values.size, lanes):
            part = values[first:first + lanes]
            local[:part.size] += part
        return local

    values = np.asarray(k, dtype=np.float64)
    blocks = min((values.size + _THREADS - 1) // _THREADS, _MAX_BLOCKS)
    partial = tree(strided(values, blocks * _THREADS).reshape(blocks, _THREADS))
    return np.float64(tree(strided(partial, _THREADS).reshape(1, _THREADS))[0] / values.size)


def bench_rounding(args: argparse.Namespace) -> dict:
    """How far last-ulp differences carry through a solve (NumPy only): the basis of the GPU-vs-NumPy test
    tolerances in tests/kernels/ks/test_ks_gpu.py. Solves the test's setting twice, the second time with
    +-1 ulp noise (probability 2/3) on every agent's k each period and on every Euler step's policy (the
    GPU's FMA contraction and pow/asinh differ from NumPy's in the last ulp) and with K summed in the panel
    kernel's order, and reports the largest relative gaps."""
    import kernels.ks.policy as policy_mod
    import kernels.ks.simulate as simulate_mod
    import kernels.ks.solve as solve_mod

    noise = np.random.default_rng(args.seed)

    def ulp(a):
        a = np.asarray(a)
        step = noise.integers(-1, 2, a.shape)
        return np.where(step == 0, a, np.nextafter(a, np.where(step > 0, np.inf, -np.inf)))

    settings = SolveSettings(n_agents=10_000, periods=300, burn_in=100, tolerance=1e-5,
                             interpolation=args.interpolation, seed=args.seed, policy=PolicySettings(tolerance=1e-8),
                             den_haan_periods=200, initial_alm=tuple(REFERENCE_ALM), max_iterations=6)
    ref = solve(np, Calibration(), Grids(), settings, use_kernels=False)
    saved = (simulate_mod.interpolate, policy_mod.euler_update, solve_mod.simulate_panel)

    def noisy_update(*a, **kw):
        new, change = saved[1](*a, **kw)
        return ulp(new), change

    def gpu_order_panel(*a, **kw):
        mean, np.mean = np.mean, _gpu_order_mean
        try:
            return saved[2](*a, **kw)
        finally:
            np.mean = mean

    simulate_mod.interpolate = lambda *a, **kw: ulp(saved[0](*a, **kw))
    policy_mod.euler_update = noisy_update
    solve_mod.simulate_panel = gpu_order_panel
    try:
        got = solve(np, Calibration(), Grids(), settings, use_kernels=False)
    finally:
        simulate_mod.interpolate, policy_mod.euler_update, solve_mod.simulate_panel = saved

    def rel(a, b):
        return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300 + np.abs(b).max() * 1e-3)))

    log_k = np.log(np.linspace(30.0, 50.0, 9))
    forecasts = [rel(got.alm[2 * s] + got.alm[2 * s + 1] * log_k, ref.alm[2 * s] + ref.alm[2 * s + 1] * log_k)
                 for s in range(2)]
    return {"bench": "ks_rounding", "interpolation": args.interpolation, "seed": args.seed,
            "same_iterations": got.policy_iterations == ref.policy_iterations,
            "capital_path": rel(got.capital_path, ref.capital_path), "policy": rel(got.policy, ref.policy),
            "slopes": rel(got.alm[[1, 3]], ref.alm[[1, 3]]), "forecasts": max(forecasts),
            "intercepts_abs": float(np.max(np.abs(got.alm[[0, 2]] - ref.alm[[0, 2]]))),
            "den_haan_paths": max(rel(got.den_haan_panel, ref.den_haan_panel), rel(got.den_haan_alm, ref.den_haan_alm)),
            "den_haan_max_abs": abs(got.den_haan_max - ref.den_haan_max),
            "den_haan_mean_abs": abs(got.den_haan_mean - ref.den_haan_mean)}


def bench_example(args: argparse.Namespace) -> dict:
    """The kind's own example (``KS_SOLVE.example``) through ``run_kind`` on NumPy and on the default device,
    with the worst relative gap between the two result JSONs (the cross-backend test holds it to 1e-9)."""
    from kernels.context import run_kind
    from kernels.ks.jobs import KS_SOLVE
    from kernels.result_diff import compare_leaves

    runs = []  # (device, result, seconds): NumPy first, then the default device (NumPy again without a GPU)
    for device in ("cpu", None):
        ctx = local_context(device=device)
        start = time.perf_counter()
        result = run_kind(KS_SOLVE, KS_SOLVE.example.params, ctx)
        runs.append((ctx.device, result, time.perf_counter() - start))
    (cpu_name, cpu, cpu_seconds), (other_name, other, other_seconds) = runs
    worst = max(compare_leaves(cpu, other), default=(0.0, "-"))
    return {"bench": "ks_example", "devices": [cpu_name, other_name], "seconds": [cpu_seconds, other_seconds],
            "worst_relative_gap": worst[0], "worst_leaf": worst[1], "iterations": cpu["iterations"],
            "converged": cpu["converged"], "policy_iterations": cpu["policy_iterations"]}


def bench_job(args: argparse.Namespace) -> dict:
    """A ``ks_solve`` job spec (``--spec`` JSON) through ``run_kind`` on the default device, as the worker runs
    it: the first run in the process (compiles from the disk cache) and then ``--repeats`` more, the best kept."""
    from kernels.context import run_kind
    from kernels.ks.jobs import KS_SOLVE
    from kernels.ks.spec import KSSolveParams

    params = KSSolveParams.model_validate_json(args.spec)
    seconds, result = [], {}
    for _ in range(1 + args.repeats):
        ctx = local_context()
        start = time.perf_counter()
        result = run_kind(KS_SOLVE, params, ctx)
        seconds.append(time.perf_counter() - start)
    return {"bench": "ks_job", "device": result["device"], "spec": json.loads(args.spec),
            "seconds_first": seconds[0], "seconds_best": min(seconds[1:] or seconds), "seconds_all": seconds,
            "timings": result["timings"], "iterations": result["iterations"],
            "coarse_iterations": result["coarse_iterations"], "converged": result["converged"],
            "alm": result["alm"], "den_haan_error": result["den_haan_error"], "mean_capital": result["mean_capital"]}


def summarize(path: str) -> None:
    """One line per benchmark of a log of this script's JSON lines."""
    with open(path) as log:
        rows = [json.loads(line) for line in log if line.startswith("{")]
    for r in rows:
        if r["bench"] in ("ks_rounding", "ks_example", "ks_job"):
            print(r)
            continue
        loop = "graph" if r.get("graph") else "plain loop"
        head = f"{r['bench']:9s} {r['grid']:6s} N={r['n_agents']:>9,d} {r['interpolation']:11s} {r['precision']} " \
               f"[{r['device']}, {loop}]"
        if r["bench"] == "ks_panel":
            print(f"{head} T={r['periods']}: {r['seconds_best']:.3f} s (capture {r.get('capture_seconds', 0):.3f} s)")
        else:
            head += f" check_every={r.get('check_every', 1)} Euler steps {r['policy_iterations_total']}"
            bad, good, t = r["alm"]["bad"], r["alm"]["good"], r["timings"]
            print(f"{head} T={r['periods']}: {r['seconds_end_to_end']:.2f} s end to end (policy {t['policy']:.2f}, "
                  f"panel {t['panel']:.2f}), iterations {r['iterations']} converged={r['converged']}, "
                  f"bad {bad[0]:.5f} + {bad[1]:.5f} ln K (R2 {bad[2]:.7f}), "
                  f"good {good[0]:.5f} + {good[1]:.5f} ln K (R2 {good[2]:.7f}), "
                  f"Den Haan max/mean {r['den_haan_max_pct']:.3f}/{r['den_haan_mean_pct']:.3f} %")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["panel", "solve", "rounding", "example", "job", "summary"])
    parser.add_argument("--spec", default="{}", help="job: the ks_solve params as JSON")
    parser.add_argument("--gpus", type=int, default=1, help="panel: spread over GPUs 0 .. gpus - 1")
    parser.add_argument("--log", help="summary: the JSON-lines log to tabulate")
    parser.add_argument("--n-agents", type=int, default=10_000)
    parser.add_argument("--periods", type=int, default=None, help="default: panel 1000, solve 1100")
    parser.add_argument("--burn-in", type=int, default=100)
    parser.add_argument("--k-size", type=int, default=100)
    parser.add_argument("--K-size", dest="K_size", type=int, default=4)
    parser.add_argument("--interpolation", choices=["bilinear", "catmull_rom", "cubic"], default="catmull_rom")
    parser.add_argument("--precision", choices=["float64", "float32"], default="float64")
    parser.add_argument("--tolerance", type=float, default=1e-7)
    parser.add_argument("--max-iterations", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--graph", action=argparse.BooleanOptionalAction, default=True,
                        help="GPU: replay the panel's period loop as captured CUDA graphs (--no-graph: the plain "
                        "per-period launches)")
    parser.add_argument("--policy-method", choices=["time_iteration", "egm"], default="time_iteration")
    parser.add_argument("--alm-update", choices=["damped", "anderson", "newton"], default="damped",
                        help="newton: quasi-Newton steps on the full panel with the coarse stage's Jacobian "
                        "(needs --coarse-agents)")
    parser.add_argument("--coarse-agents", type=int, default=0, help="solve on this many agents first (0: off)")
    parser.add_argument("--damping", type=float, default=SolveSettings().damping)
    parser.add_argument("--coarse-first-step", type=float, default=None,
                        help="Anderson's first full-panel step after the coarse stage (default: damping)")
    parser.add_argument("--check-every", type=int, default=PolicySettings().check_every,
                        help="Euler steps between convergence tests (1 = a max-change read-back every step)")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's arguments (``argv``: the words after the script's name; None: ``sys.argv``), with the
    per-benchmark default of ``--periods`` filled in: other scripts build a benchmark's arguments here."""
    args = build_parser().parse_args(argv)
    if args.periods is None:
        args.periods = 1000 if args.what == "panel" else 1100
    return args


def main() -> None:
    args = parse_args()
    if args.what == "summary":
        summarize(args.log)
        return
    benches = {"panel": bench_panel, "solve": bench_solve, "rounding": bench_rounding, "example": bench_example,
               "job": bench_job}
    out = benches[args.what](args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
