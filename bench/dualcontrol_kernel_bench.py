"""Seconds of one improvement step and one policy sweep of the dual-control CUDA kernels at n^3 (issue 13).

The kernels of ``kernels/dualcontrol/bellman.cu`` on their own, without a solve around them: the spec's default
model and grid (x in [-9, 11], mu in [-4, 4], Sigma in [0.02, 2], concentration 2, a node at mu = 0), quadratic
interpolation, 32 Gauss-Hermite nodes, 8 scan points and ``--golden-iterations`` golden steps, on a smooth
stand-in value function (the inert closed form, minus a term in Sigma and mu; a solve's V has the same
magnitudes). Best of ``--repeats`` device-synchronised runs of each. Prints one JSON line.

Usage (on a GPU machine): ``PYTHONPATH=. python3 bench/dualcontrol_kernel_bench.py [--size 256]
[--golden-iterations 28] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kernels.backend import device_label, get_namespace
from kernels.dualcontrol.bellman import CudaBellman, MinimiserSettings
from kernels.dualcontrol.grid import make_state_grid
from kernels.dualcontrol.model import ModelParams

MODEL = ModelParams(alpha=0.0, gamma=0.7, sigma_eps=1.0, delta=0.95, omega=1.0, xbar=1.0, ubar=0.0)


def best_seconds(cp: Any, step: Callable[[], Any], repeats: int) -> float:
    best = np.inf
    for _ in range(repeats):
        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        step()
        cp.cuda.Device().synchronize()
        best = min(best, time.perf_counter() - start)
    return float(best)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--golden-iterations", type=int, default=28)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cp = get_namespace("gpu")
    n = args.size
    grid = make_state_grid((-9.0, 11.0, n), (-4.0, 4.0, n), (0.02, 2.0, n), MODEL.xbar, 2.0)
    operator = CudaBellman(MODEL, grid, 32, cp, np.float64, MinimiserSettings(8, args.golden_iterations),
                           interpolation="quadratic")
    x, mu, sigma = grid.mesh(cp, np.float64)
    a, b, c = MODEL.inert_coefficients()
    values = cp.ascontiguousarray(a * x * x + b * x + c - 2.0 * sigma * cp.exp(-mu * mu) + 0.3 * mu * mu)
    policy = cp.zeros_like(values)
    improve = best_seconds(cp, lambda: operator.improve(values, policy), args.repeats)
    _, policy = operator.improve(values, policy)
    evaluate = best_seconds(cp, lambda: operator.evaluate(values, policy), args.repeats)
    print(json.dumps({"device": device_label(cp), "n": n, "golden_iterations": args.golden_iterations,
                      "quadrature_nodes_used": int(operator.quad_z.size), "improve_seconds": round(improve, 4),
                      "evaluate_seconds": round(evaluate, 4)}))


if __name__ == "__main__":
    main()
