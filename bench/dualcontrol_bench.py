"""Dual-control DP timings: inert, myopic and optimal policies on n^3 grids, with and without acceleration.

Numerics modules only (no pydantic/pandas), so it runs on the bare GPU machine. The model and grid are the
``dualcontrol_solve`` spec defaults (the model and the algorithms: docs/dualcontrol.md). Each row is one full
solve (coarse levels included), timed after device synchronisation. Before the first timed row the GPU run
compiles the CUDA kernels the way a worker does at start (``kernels.cuda.warm_up``: bellman.cu in float64 and
float32, or loads them from CuPy's disk cache) and then runs a tiny warm-up solve per policy for CuPy's own
kernels.

Stopping rule (``--criterion``, printed in the header and in every row): ``macqueen_porteus`` (default, the
service's default) stops when the width of the MacQueen-Porteus bounds, delta/(1-delta) (max d - min d) with
d = V_new - V, falls below the tolerance relative to max |V|; ``sup_norm`` is the paper's rule,
delta/(1-delta) max |d| relative to max |V|. The paper's algorithm is ``--acceleration none --criterion
sup_norm``.

    python3 bench/dualcontrol_bench.py --device gpu --sizes 64 128 256 --policies optimal
    python3 bench/dualcontrol_bench.py --device gpu --sizes 64 128 --policies optimal --acceleration none \
        --criterion sup_norm
    python3 bench/dualcontrol_bench.py --device cpu --sizes 32 --policies inert myopic optimal

Policy evaluation (``--evaluation``): ``sweeps`` is plain V <- T_u V (the reference solver), ``anderson`` the
Anderson-mixed sweeps of kernels/dualcontrol/anderson.py; given both, each (size, policy, acceleration) is
solved with each in turn and the rows after the first say how far their V (and, optimal, u) lie from the first
one's (``dv_rel``: max |V - V_first| / max |V_first|; ``du_max`` and ``du_share``: the largest control gap and
the share of grid points whose control moved by more than 1e-3). ``--fixed-point TOL`` first solves each case to
TOL (Anderson, 300 sweeps per evaluation) and adds each row's distance from that fixed point V*: ``dv_star`` =
max |V - V*| / max |V*| and, optimal, ``q_subopt`` = max (Q(u; V*) - V*) / max |V*| (how far the row's controls
are from optimal under V*, whatever minimum of Q they picked). The H100 timing of issue 13's 256^3 target:

    timeout 150 python3 bench/dualcontrol_bench.py --device gpu --sizes 256 --policies optimal myopic inert \
        --evaluation sweeps anderson --fixed-point 1e-8 --json "$OUT/dc_256_anderson.json"

The improvement step's minimiser (``--golden-iterations N [N ...]``, the job's ``minimizer.golden_iterations``,
default 28): each count is a row, the rows after the first compared with it as above; every optimal row also
gives ``improvement_seconds`` per level (the rest of a level's seconds are its evaluation sweeps). Issue 13's
256^3 target with the default and 16 golden steps, each row's distance from a solve to 1e-8:

    timeout 300 python3 bench/dualcontrol_bench.py --device gpu --sizes 256 --policies optimal \
        --evaluation anderson --golden-iterations 28 16 --fixed-point 1e-8 --json "$OUT/dc_256_golden.json"

Several GPUs of the host (``--gpus N``, issue 19; kernels/dualcontrol/slabs.py): every level of at least 2^18
points per GPU is swept in slabs of grid points over GPUs 0 .. N-1 (the one-GPU result bit for bit; each row's
``levels`` entries end with the level's GPU count). The warm-up then compiles and runs on every one of them:

    python3 bench/dualcontrol_bench.py --device gpu --sizes 256 512 --policies optimal --gpus 2 \
        --json "$OUT/dc_gpus2.json"
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import product
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import cuda
from kernels.backend import device_label, get_namespace, synchronize, to_host
from kernels.dualcontrol.bellman import Interpolation, MinimiserSettings, make_operator
from kernels.dualcontrol.grid import interpolate, make_state_grid, x_curvature
from kernels.dualcontrol.model import ModelParams
from kernels.dualcontrol.slabs import MIN_POINTS_PER_GPU, peer_access
from kernels.dualcontrol.solve import Criterion, Evaluation, Solution, SolveSettings, solve

# spec defaults (kernels/dualcontrol/spec.py)
MODEL = ModelParams(alpha=0.0, gamma=0.7, sigma_eps=1.0, delta=0.95, omega=1.0, xbar=1.0, ubar=0.0)
TOLERANCE = {"inert": 1e-6, "myopic": 1e-6, "optimal": 1e-4}
REPORT_STATES = np.array([[1.0, 0.5, 0.5], [2.0, 0.0, 1.0], [0.0, 1.0, 0.25]])


def grid_of(n: int):
    return make_state_grid((-9.0, 11.0, n), (-4.0, 4.0, n), (0.02, 2.0, n), MODEL.xbar, 2.0)


# acceleration variants: (modified policy iteration sweeps, coarse-to-fine); only the latter applies to the
# inert and myopic policies, which are policy evaluations already
VARIANTS = {"full": (20, True), "mpi": (20, False), "c2f": (0, True), "none": (0, False)}
RULE_TEXT = {
    "macqueen_porteus": "k (max d - min d) / max|V| < tol, k = delta/(1-delta), d = V_new - V",
    "sup_norm": "the paper's k max|d| / max|V| < tol, k = delta/(1-delta), d = V_new - V",
}


CRITERIA = ("macqueen_porteus", "sup_norm")


def fixed_point(
    xp, n: int, policy: str, nodes: int, dtype, interpolation: Interpolation, tolerance: float, gpus: int = 1
):
    """The case solved to ``tolerance`` with Anderson evaluation (300 sweeps per evaluation at most)."""
    settings = SolveSettings(
        policy,  # type: ignore[arg-type]
        tolerance,
        max_iterations=60 if policy == "optimal" else 3000,  # improvements or sweeps per level: a bound in time
        evaluation_sweeps=300,
        coarse_to_fine=True,
        coarsest_size=16,
        quadrature_nodes=nodes,
        dtype=dtype,
        interpolation=interpolation,
        evaluation="anderson",
        gpus=gpus,
    )
    solution = solve(MODEL, grid_of(n), settings, xp)
    if not solution.converged:
        raise RuntimeError(f"the fixed point of n={n} {policy} did not converge to {tolerance}")
    return solution


def distance_to_fixed_point(
    xp, star: Solution, value: np.ndarray, control: np.ndarray, nodes: int, dtype, interpolation
):
    """(dv_star, q_subopt) of a solved (V, u) against the fixed point's V* (see the module text)."""
    star_value = to_host(star.value)
    scale = float(np.abs(star_value).max())
    operator = make_operator(MODEL, star.grid, nodes, xp, dtype, interpolation=interpolation)
    q = to_host(operator.evaluate(star.value, xp.asarray(control, dtype=dtype)))
    return float(np.abs(value - star_value).max() / scale), float((q - star_value).max() / scale)


def add_fixed_point_distances(xp, n: int, policy: str, case: list, args: argparse.Namespace, dtype) -> None:
    """Solve the case to ``--fixed-point`` and add ``dv_star`` / ``q_subopt`` to each of its rows."""
    start = time.perf_counter()
    try:
        star = fixed_point(xp, n, policy, args.nodes, dtype, args.interpolation, args.fixed_point, args.gpus)
    except RuntimeError as error:
        print(f"no fixed point for n={n} {policy}: {error}", flush=True)
        return
    print(f"fixed point n={n} {policy} to {args.fixed_point}: {time.perf_counter() - start:.2f} s", flush=True)
    for row, (value, control) in case:
        row["dv_star"], row["q_subopt"] = distance_to_fixed_point(
            xp, star, value, control, args.nodes, dtype, args.interpolation
        )
        keys = ("n", "policy", "evaluation", "golden_iterations", "dv_star", "q_subopt")
        print(json.dumps({k: row[k] for k in keys}), flush=True)


def run_one(
    xp,
    n: int,
    policy: str,
    variant: str,
    nodes: int,
    max_iterations: int,
    dtype,
    criterion: Criterion,
    interpolation: Interpolation = "quadratic",
    evaluation: Evaluation = "sweeps",
    anderson_memory: int = 8,
    first: tuple[np.ndarray, np.ndarray] | None = None,
    gpus: int = 1,
    min_points_per_gpu: int = MIN_POINTS_PER_GPU,
    golden_iterations: int = MinimiserSettings.golden_iterations,
) -> tuple[dict, tuple[np.ndarray, np.ndarray]]:
    """One solve's row, and its (V, u) on the host for the rows that compare with it (``first``)."""
    grid = grid_of(n)
    sweeps, coarse_to_fine = VARIANTS[variant]
    settings = SolveSettings(
        policy,  # type: ignore[arg-type]
        TOLERANCE[policy],
        max_iterations=max_iterations,
        evaluation_sweeps=sweeps,
        coarse_to_fine=coarse_to_fine,
        coarsest_size=16,
        criterion=criterion,
        quadrature_nodes=nodes,
        dtype=dtype,
        interpolation=interpolation,
        evaluation=evaluation,
        anderson_memory=anderson_memory,
        gpus=gpus,
        min_points_per_gpu=min_points_per_gpu,
        minimiser=MinimiserSettings(golden_iterations=golden_iterations),
    )
    synchronize(xp)
    start = time.perf_counter()
    solution = solve(MODEL, grid, settings, xp)
    synchronize(xp)
    seconds = time.perf_counter() - start
    value = to_host(solution.value)
    curvature = x_curvature(value, grid.x.nodes(), np) if interpolation == "quadratic" else None
    baseline = MODEL.inert_coefficients() if interpolation == "residual" else None
    at = interpolate(value, grid, grid.node_arrays(np), *REPORT_STATES.T, np, baseline, curvature)
    control = to_host(solution.policy)
    row = {
        "n": n,
        "policy": policy,
        "acceleration": variant if policy == "optimal" else ("c2f" if coarse_to_fine else "none"),
        "criterion": criterion,
        "tolerance": TOLERANCE[policy],
        "nodes": nodes,
        "precision": np.dtype(dtype).name,
        "interpolation": interpolation,
        "evaluation": evaluation,
        "golden_iterations": golden_iterations,
        "gpus": gpus,
        "seconds": round(seconds, 3),
        "converged": solution.converged,
        "iterations": solution.iterations,
        "evaluation_sweeps": sum(level.evaluation_sweeps for level in solution.levels),
        "levels": [
            [list(lv.shape), lv.iterations, lv.evaluation_sweeps, round(lv.seconds, 3), lv.gpus]
            for lv in solution.levels
        ],
        # optimal: per level, the seconds of its improvement steps (the rest of the level's are its sweeps)
        "improvement_seconds": [round(lv.improvement_seconds, 3) for lv in solution.levels],
        "values_at_states": [round(float(v), 6) for v in at],
    }
    if first is not None:
        scale = float(np.abs(first[0]).max())
        row["dv_rel"] = float(np.abs(value - first[0]).max() / scale)
        gap = np.abs(control - first[1])
        row["du_max"], row["du_share"] = float(gap.max()), float(np.mean(gap > 1e-3))
    return row, (value, control)


def warm_up(
    xp,
    gpus: int = 1,
    evaluations: tuple[Evaluation, ...] | list[Evaluation] = ("anderson",),
    dtype=np.float64,
    criterion: Criterion = "macqueen_porteus",
    interpolation: Interpolation = "quadratic",
) -> int:
    """The worker's start-up compile of every declared variant on each GPU, then a tiny solve per policy and
    evaluation for CuPy's own kernels (reductions, interpolation); returns the CUDA modules compiled or loaded."""
    modules = 0
    for device in range(gpus):
        with xp.cuda.Device(device):
            modules += cuda.warm_up()
    for policy in ("inert", "myopic", "optimal"):
        for evaluation in evaluations:  # on every GPU: a tiny grid spread nonetheless
            warm = {"gpus": gpus, "min_points_per_gpu": 1}
            run_one(xp, 32, policy, "full", 4, 3, dtype, criterion, interpolation, evaluation, **warm)
    return modules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "gpu"], default="gpu")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--policies", nargs="+", default=["inert", "myopic", "optimal"])
    parser.add_argument(
        "--acceleration",
        nargs="+",
        choices=list(VARIANTS),
        default=["full"],
        help="full = modified policy iteration + coarse-to-fine, mpi / c2f = one of them, none = neither (the "
        "paper's algorithm when combined with --criterion sup_norm)",
    )
    parser.add_argument(
        "--criterion",
        choices=CRITERIA,
        default="macqueen_porteus",
        help="stopping rule: macqueen_porteus = width of the MacQueen-Porteus bounds (the service's default), "
        "sup_norm = the paper's delta/(1-delta) scaled sup-norm step; both relative to max |V|",
    )
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument(
        "--interpolation",
        choices=["quadratic", "trilinear", "residual"],
        default="quadratic",
        help="the job's default is quadratic (trilinear plus the x curvature term: 8 more gathers per node)",
    )
    parser.add_argument(
        "--evaluation",
        nargs="+",
        choices=["sweeps", "anderson"],
        default=["sweeps"],
        help="policy evaluation: plain sweeps (the reference) and/or Anderson-mixed sweeps; rows after the "
        "first of a (size, policy, acceleration) report their distance from it",
    )
    parser.add_argument("--anderson-memory", type=int, default=8)
    parser.add_argument(
        "--golden-iterations",
        type=int,
        nargs="+",
        default=[MinimiserSettings.golden_iterations],
        help="golden-section steps of the improvement's minimiser (the job's minimizer.golden_iterations, default "
        "28); given several, each is a row compared with the first",
    )
    parser.add_argument(
        "--fixed-point",
        type=float,
        default=None,
        metavar="TOL",
        help="also solve each case to TOL and report every row's distance from that fixed point",
    )
    parser.add_argument("--precision", choices=["float64", "float32"], default="float64")
    parser.add_argument(
        "--gpus",
        type=int,
        default=1,
        help="spread each level's sweeps over GPUs 0 .. N-1 of the host (levels of 2^18 points per GPU or more)",
    )
    parser.add_argument("--max-iterations", type=int, default=2000)
    parser.add_argument("--budget", type=float, default=float("inf"), help="skip rows once this many s are spent")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    if args.gpus > 1 and args.device != "gpu":
        parser.error(f"--gpus {args.gpus} spreads the sweeps over GPUs: it needs --device gpu")
    xp = get_namespace(args.device)
    dtype = np.float64 if args.precision == "float64" else np.float32
    print(f"device: {device_label(xp)}", flush=True)
    if args.gpus > 1:
        print(f"gpus: {args.gpus}, peer access: {peer_access(tuple(range(args.gpus)), xp)}", flush=True)
    print(
        f"stopping rule: {args.criterion} ({RULE_TEXT[args.criterion]}); tolerances {TOLERANCE}",
        flush=True,
    )
    if args.device == "gpu":
        start = time.perf_counter()
        modules = warm_up(xp, args.gpus, args.evaluation, dtype, args.criterion, args.interpolation)
        print(f"warm-up: {modules} CUDA modules in {time.perf_counter() - start:.2f} s", flush=True)
    rows, spent = [], 0.0
    for n in args.sizes:
        for policy in args.policies:
            done = set()
            for variant in args.acceleration:
                effective = variant if policy == "optimal" else VARIANTS[variant][1]
                if effective in done:
                    continue  # inert/myopic: mpi == none and full == c2f
                done.add(effective)
                first = None
                case: list[tuple[dict, tuple[np.ndarray, np.ndarray]]] = []
                for evaluation, golden in product(args.evaluation, args.golden_iterations):
                    if policy != "optimal" and golden != args.golden_iterations[0]:
                        continue  # no minimiser in a fixed policy's solve
                    if spent > args.budget:
                        print(f"skipped n={n} {policy} {variant} {evaluation} {golden}: budget spent", flush=True)
                        continue
                    row, solved = run_one(
                        xp,
                        n,
                        policy,
                        variant,
                        args.nodes,
                        args.max_iterations,
                        dtype,
                        args.criterion,
                        args.interpolation,
                        evaluation,
                        args.anderson_memory,
                        first,
                        args.gpus,
                        golden_iterations=golden,
                    )
                    first = first or solved
                    spent += row["seconds"]
                    rows.append(row)
                    case.append((row, solved))
                    print(json.dumps(row), flush=True)
                if args.fixed_point is not None and case:  # after the timed rows: a failure here loses none
                    add_fixed_point_distances(xp, n, policy, case, args, dtype)
                # after every case: a timeout keeps the rest
                write_summary(args.json, xp, args.criterion, rows, args.gpus)
    print(f"\nstopping rule: {args.criterion}")
    header = f"{'n^3':>6} {'policy':>8} {'accel':>5} {'eval':>8} {'gold':>4} {'rule':>16} {'seconds':>9} {'iters':>6}"
    header += f" {'sweeps':>6}"
    print(f"{header}  conv  dv_rel   du_share dv_star  q_subopt V(states)")
    for r in rows:
        gaps = f"{r['dv_rel']:.1e} {r['du_share']:.1e}" if "dv_rel" in r else f"{'-':>7} {'-':>7}"
        gaps += f" {r['dv_star']:.1e} {r['q_subopt']:.1e}" if "dv_star" in r else f" {'-':>7} {'-':>7}"
        print(
            f"{r['n']:>6} {r['policy']:>8} {r['acceleration']:>5} {r['evaluation']:>8} {r['golden_iterations']:>4} "
            f"{r['criterion']:>16} "
            f"{r['seconds']:>9.3f} {r['iterations']:>6} {r['evaluation_sweeps']:>6} {r['converged']!s:>5} {gaps} "
            f"{r['values_at_states']}"
        )
    write_summary(args.json, xp, args.criterion, rows, args.gpus)


def write_summary(path: Path | None, xp, criterion: str, rows: list[dict], gpus: int = 1) -> None:
    if path is not None:
        summary = {"device": device_label(xp), "gpus": gpus, "criterion": criterion, "rows": rows}
        if gpus > 1:
            summary["peer_access"] = peer_access(tuple(range(gpus)), xp)
        path.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
