"""Dual-control accuracy (issue 13): reported values and their error estimates against the closed forms and a
Monte Carlo of each policy.

For each grid it solves the inert, myopic and optimal policies (with the job's coarse-to-fine levels, and the
grid halved per axis twice for the error estimate, as ``dualcontrol_solve`` does), reports at each state the
exact-state value (one Bellman step at the state), the grid value interpolated there (what the job reported
before), the Richardson-type error estimate, and the simulated cost of each policy from that state (common
random numbers, inert control variate; the optimal control is the one-step minimiser at every simulated
state). Numerics modules only (no pydantic), so it runs on the bare GPU machine; the solves run on
``--device``, the reports on the host, the simulation on ``--device`` (as the job).

Cases: ``issue13`` is the issue's model (gamma 0.9, omega 0.1, sigma_eps 1, delta 0.95, the rest 0) on
x in [-15, 15], mu in [-3, 3], Sigma in [0.01, 2]; ``default`` the spec's defaults.

    python3 bench/dualcontrol_accuracy.py --case issue13 --shapes 48x24x24 --policies inert myopic
    python3 bench/dualcontrol_accuracy.py --case issue13 --shapes 24x12x12 --policies inert myopic optimal \
        --paths 400
    python3 bench/dualcontrol_accuracy.py --device gpu --case default --shapes 128x128x128 --paths 4000
    python3 bench/dualcontrol_accuracy.py --case issue13 --shapes 48x24x24 --interpolation trilinear \
        --no-mu-node   # the grid and interpolation before issue 13
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.backend import device_label, get_namespace, to_host
from kernels.dualcontrol.bellman import MinimiserSettings
from kernels.dualcontrol.grid import StateGrid, make_state_grid
from kernels.dualcontrol.model import ModelParams, inert_value
from kernels.dualcontrol.report import StateEvaluator, exact_report, halved_shapes, richardson, simulation_rules
from kernels.dualcontrol.simulate import horizon_for, simulate_costs
from kernels.dualcontrol.solve import SolveSettings, solve

CASES: dict[str, dict[str, Any]] = {
    "issue13": {
        "model": ModelParams(alpha=0.0, gamma=0.9, sigma_eps=1.0, delta=0.95, omega=0.1, xbar=0.0, ubar=0.0),
        "ranges": ((-15.0, 15.0), (-3.0, 3.0), (0.01, 2.0)),
        "states": [[2.0, 0.0, 1.0], [2.0, 0.5, 1.0], [0.0, 1.0, 0.25], [5.0, -1.0, 0.1], [3.0, 2.0, 0.05]],
    },
    "default": {
        "model": ModelParams(alpha=0.0, gamma=0.7, sigma_eps=1.0, delta=0.95, omega=1.0, xbar=1.0, ubar=0.0),
        "ranges": ((-9.0, 11.0), (-4.0, 4.0), (0.02, 2.0)),
        "states": [[1.0, 0.5, 0.5], [2.0, 0.0, 1.0], [0.0, 1.0, 0.25], [5.0, -1.0, 0.1], [3.0, 2.0, 0.05]],
    },
}
TOLERANCE = {"inert": 1e-6, "myopic": 1e-6, "optimal": 1e-5}


def parse_shape(text: str) -> tuple[int, int, int]:
    parts = [int(p) for p in text.split("x")]
    return (parts[0],) * 3 if len(parts) == 1 else tuple(parts)  # type: ignore[return-value]


def build_grid(case: dict[str, Any], shape: tuple[int, int, int], args: argparse.Namespace) -> StateGrid:
    (x, mu, s), model = case["ranges"], case["model"]
    return make_state_grid(
        (*x, shape[0]),
        (*mu, shape[1]),
        (*s, shape[2]),
        model.xbar,
        args.concentration,
        mu_concentration=args.mu_concentration,
        mu_node_at_zero=args.mu_node,
    )


def solve_policy(xp: Any, model: ModelParams, grid: StateGrid, policy: str, states: np.ndarray, args) -> dict:
    """Solve on the grid (coarse-to-fine) and on the two halved grids; exact reports on each."""
    settings = SolveSettings(
        policy,  # type: ignore[arg-type]
        TOLERANCE[policy],
        evaluation_sweeps=20,
        coarse_to_fine=True,
        quadrature_nodes=args.nodes,
        interpolation=args.interpolation,
        minimiser=MinimiserSettings(golden_iterations=args.golden_iterations),
        evaluation=args.evaluation,
    )
    reports: dict[tuple[int, int, int], Any] = {}

    def record(level_grid: StateGrid, values: Any, policy_array: Any) -> None:
        reports[level_grid.shape] = exact_report(
            model, level_grid, policy, to_host(values), to_host(policy_array), states, args.nodes, args.interpolation
        )

    start = time.perf_counter()
    solution = solve(model, grid, settings, xp, on_level=record)
    seconds = time.perf_counter() - start
    coarse = halved_shapes(grid.shape, 2)
    for shape in coarse:
        if shape not in reports:
            plain = SolveSettings(**{**settings.__dict__, "coarse_to_fine": False})
            solve(model, grid.with_shape(shape), plain, xp, on_level=record)
    sequence = [reports[s] for s in (grid.shape, *coarse)]
    scale = float(np.abs(to_host(solution.value)).max())
    return {
        "solution": solution,
        "reports": sequence,
        "error": richardson([r.value for r in sequence]) + TOLERANCE[policy] * scale,
        "scale": scale,
        "seconds": seconds,
    }


def simulate(xp: Any, model: ModelParams, solved: dict[str, dict], states: np.ndarray, args) -> Any:
    """The Monte Carlo on ``--device`` (as the job runs it)."""
    controls, tails = {}, {}
    for name, run in solved.items():
        solution = run["solution"]
        evaluator = StateEvaluator(model, solution.grid, solution.value, args.nodes, args.interpolation, xp)
        controls[name], tails[name] = simulation_rules(model, name, evaluator, solution.policy)
    horizon = args.horizon or horizon_for(model.delta)
    return simulate_costs(model, states, controls, tails, args.paths, horizon, args.seed, xp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--case", choices=list(CASES), default="issue13")
    parser.add_argument("--shapes", nargs="+", default=["48x24x24"], help="n (cube) or NXxNMUxNS")
    parser.add_argument("--policies", nargs="+", default=["inert", "myopic", "optimal"])
    parser.add_argument("--nodes", type=int, default=32, help="Gauss-Hermite nodes")
    parser.add_argument(
        "--golden-iterations",
        type=int,
        default=MinimiserSettings.golden_iterations,
        help="golden-section steps of the solves' improvement (the job's minimizer.golden_iterations)",
    )
    parser.add_argument("--interpolation", choices=["trilinear", "quadratic", "residual"], default="trilinear")
    parser.add_argument("--evaluation", choices=["sweeps", "anderson"], default="sweeps",
                        help="policy evaluation between improvements (the job's acceleration.evaluation)")
    parser.add_argument("--concentration", type=float, default=2.0)
    parser.add_argument("--mu-concentration", type=float, default=None)
    parser.add_argument("--mu-node", action=argparse.BooleanOptionalAction, default=True, help="node at mu = 0")
    parser.add_argument("--paths", type=int, default=0, help="Monte Carlo paths per state (0: no simulation)")
    parser.add_argument("--horizon", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--states", type=json.loads, default=None,
                        help="report states as JSON, e.g. '[[0, 1, 0.25], [5, -1, 0.1]]' (default: the case's)")
    args = parser.parse_args()

    xp = get_namespace(args.device)
    case = CASES[args.case]
    model, states = case["model"], np.asarray(args.states or case["states"], dtype=np.float64)
    print(
        f"device: {device_label(xp)}; case {args.case}; interpolation {args.interpolation}; "
        f"mu node at 0: {args.mu_node}; concentration {args.concentration} (mu: {args.mu_concentration})"
    )
    rows = []
    for text in args.shapes:
        shape = parse_shape(text)
        grid = build_grid(case, shape, args)
        solved = {p: solve_policy(xp, model, grid, p, states, args) for p in args.policies}
        start = time.perf_counter()
        sim = simulate(xp, model, solved, states, args) if args.paths else None
        sim_seconds = time.perf_counter() - start
        for i, state in enumerate(states):
            row: dict[str, Any] = {
                "shape": list(shape),
                "state": state.tolist(),
                "V0": float(inert_value(model, state[0])),
                "simulation_seconds": round(sim_seconds, 2),
            }
            for policy, run in solved.items():
                finest = run["reports"][0]
                row[policy] = {
                    "value": float(finest.value[i]),
                    "error": float(run["error"][i]),
                    "interpolated": float(finest.interpolated_value[i]),
                    "control": float(finest.control[i]),
                    "levels": [float(r.value[i]) for r in run["reports"]],
                    "seconds": round(run["seconds"], 2),
                }
                if sim is not None:
                    row[policy]["mc"] = [float(sim.costs[policy].mean[i]), float(sim.costs[policy].standard_error[i])]
            if "optimal" in solved and "myopic" in solved:
                voe_levels = [
                    float(m.value[i] - o.value[i])
                    for m, o in zip(solved["myopic"]["reports"], solved["optimal"]["reports"], strict=True)
                ]
                voe_error = max(
                    float(richardson([np.array(v) for v in voe_levels]))
                    + sum(TOLERANCE[p] * solved[p]["scale"] for p in ("myopic", "optimal")),
                    float(np.hypot(solved["myopic"]["error"][i], solved["optimal"]["error"][i])),
                )  # as the job: at least the two errors combined as independent
                row["voe"] = {"value": voe_levels[0], "error": float(voe_error), "levels": voe_levels}
                if sim is not None:
                    d = sim.differences[("myopic", "optimal")]
                    row["voe"]["mc"] = [float(d.mean[i]), float(d.standard_error[i])]
            rows.append(row)
            print(json.dumps(row), flush=True)

    print(
        f"\n{'grid':>10} {'state':>16} {'policy':>8} {'value':>10} {'+-err':>8} {'interp':>10} {'MC':>10} "
        f"{'+-se':>7} {'V0':>9}"
    )
    for row in rows:
        for policy in [p for p in ("inert", "myopic", "optimal") if p in row] + (["voe"] if "voe" in row else []):
            r = row[policy]
            mc = r.get("mc", [float("nan")] * 2)
            print(
                f"{'x'.join(map(str, row['shape'])):>10} {row['state']!s:>16} {policy:>8} {r['value']:>10.4f} "
                f"{r['error']:>8.4f} {r.get('interpolated', float('nan')):>10.4f} {mc[0]:>10.4f} {mc[1]:>7.4f} "
                f"{row['V0']:>9.4f}"
            )
    if args.json:
        args.json.write_text(
            json.dumps({"device": device_label(xp), "args": vars(args) | {"json": None}, "rows": rows})
        )


if __name__ == "__main__":
    main()
