"""Snapshot every job kind's results on larger cases than the kinds' examples, and compare two snapshots
leaf by leaf: the check that a refactor left the numbers alone.

    python3 bench/results_snapshot.py write --device cpu before_cpu.json     # before the change
    python3 bench/results_snapshot.py write --device cpu after_cpu.json      # after it
    python3 bench/results_snapshot.py compare before_cpu.json after_cpu.json --tolerance 1e-12

Each case runs through :func:`kernels.context.run_kind` (device, timings and per-level seconds are not
compared). The cases are the former ``bench/gpu_jobs_check.py`` list (its GPU-vs-NumPy role is now the
``gpu`` test ``tests/kernels/test_kinds_examples.py``, on each kind's own example).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from kernels.context import local_context, namespace_for, run_kind
from kernels.registry import get_kind
from kernels.result_diff import compare_leaves
from kernels.sccs.examples import cyclops_frames

CASES: list[tuple[str, dict[str, Any], Any]] = [
    (
        "crve_montecarlo",
        {"n_clusters": 30, "cluster_size": 20, "n_regressors": 4, "replications": 2_000, "seed": 3},
        dict,
    ),
    (
        "crve_montecarlo",
        {
            "n_clusters": 20,
            "cluster_size": 10,
            "n_regressors": 3,
            "replications": 200,
            "seed": 4,
            "test": "wild_bootstrap",
            "bootstrap_reps": 199,
        },
        dict,
    ),
    (
        "crve_bootstrap",
        {
            "synthetic": {"n_obs": 20_000, "n_clusters": 40, "n_regressors": 3, "seed": 1},
            "formula": "y ~ x1 + x2 + x3",
            "cluster": "cluster",
            "param": "x1",
            "reps": 9_999,
            "r": 0.1,
            "seed": 2,
        },
        dict,
    ),
    (
        "crve_bootstrap",
        {
            "synthetic": {"n_obs": 5_000, "n_clusters": 12, "n_regressors": 2, "seed": 3},
            "formula": "y ~ x1 + x2",
            "cluster": "cluster",
            "param": "x2",
            "reps": 9_999,
        },
        dict,
    ),
    (
        "sccs_fit",
        {
            "outcomes_dataset_id": "o",
            "covariates_dataset_id": "c",
            "prior": {"type": "laplace", "variance": 0.5, "exclude": []},
            "cross_validation": {"folds": 5, "grid": [0.01, 0.1, 1.0], "seed": 1},
            "bootstrap": {"replicates": 20, "seed": 2},
        },
        lambda: cyclops_frames(n_cases=3_000, n_drugs=40, seed=5),
    ),
    (
        "ks_solve",
        {
            "n_agents": 10_000,
            "periods": 600,
            "burn_in": 100,
            "max_iterations": 3,
            "k_grid": {"size": 100},
            "K_grid": {"size": 4},
            "seed": 7,
        },
        dict,
    ),
    (
        "dualcontrol_solve",
        {
            "policy": "optimal",
            "quadrature_nodes": 12,
            "tolerance": 1e-4,
            "grid": {
                "x": {"size": 12, "min": -9.0, "max": 11.0},
                "mu": {"size": 12, "min": -4.0, "max": 4.0},
                "sigma": {"size": 12, "min": 0.02, "max": 2.0},
                "concentration": 2.0,
            },
            "report_states": [[1.0, 0.5, 0.5]],
        },
        dict,
    ),
]



def write(device: str, path: Path) -> None:
    snapshot = []
    for kind_name, params, make_data in CASES:
        kind = get_kind(kind_name)
        started = time.perf_counter()
        ctx = local_context(xp=namespace_for(kind, device), datasets=make_data())  # type: ignore[arg-type]
        result = run_kind(kind, params, ctx)
        print(f"{kind_name:<18} {time.perf_counter() - started:8.2f} s  {result['device']}", flush=True)
        snapshot.append({"kind": kind_name, "params": params, "result": result})
    path.write_text(json.dumps(snapshot))


def compare(before: Path, after: Path, tolerance: float) -> int:
    failures = 0
    for old, new in zip(json.loads(before.read_text()), json.loads(after.read_text()), strict=True):
        assert old["kind"] == new["kind"], "the two snapshots hold different cases"
        worst, leaf = max(compare_leaves(old["result"], new["result"], old["kind"]), default=(0.0, "-"))
        failures += worst > tolerance
        print(f"{old['kind']:<18} max relative difference {worst:9.2e}  {leaf}{'' if worst <= tolerance else '  FAIL'}")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    writer = commands.add_parser("write")
    writer.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    writer.add_argument("path", type=Path)
    comparer = commands.add_parser("compare")
    comparer.add_argument("before", type=Path)
    comparer.add_argument("after", type=Path)
    comparer.add_argument("--tolerance", type=float, default=1e-12)
    args = parser.parse_args()
    if args.command == "write":
        write(args.device, args.path)
        return 0
    return compare(args.before, args.after, args.tolerance)


if __name__ == "__main__":
    sys.exit(main())
