"""Seconds of one CCD cycle of the GPU batch engine against the batch's width (issue 19): what a narrower batch
(a fan-out chunk's folds) costs per fit.

The tables are ``bench/scaling_bench.py``'s ``sccs_cv`` tables (``kernels.sccs.synthetic``, J = 1,428 drugs,
11-31 eras a case, seed 2013) at ``--n-cases`` (default the paper's largest, 3.6M), generated on the GPU. For each
width R in ``--widths``, an engine of capacity R sets up a batch (laplace prior, variance 0.1,
a CV training fold's case weights in every row) and replays ``--cycles`` cycles (the captured graph); the table
gives the median seconds a cycle, per fit, and the fit of t(R) = a + b R over the widths (a: what a cycle costs
whatever the width).

    PYTHONPATH=. python3 bench/sccs_cycle_bench.py                       # N = 3.6M, R = 1 2 5 10
    PYTHONPATH=. python3 bench/sccs_cycle_bench.py --n-cases 300000 --widths 5 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-cases", type=int, default=3_600_000)
    parser.add_argument("--n-drugs", type=int, default=1428)
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 2, 5, 10])
    parser.add_argument("--cycles", type=int, default=15)
    return parser.parse_args()


def cycle_seconds(data, prior, width: int, cycles: int) -> float:
    import cupy as cp

    from kernels.sccs import gpu
    from kernels.sccs.ccd import FitOptions

    engine = gpu.BatchEngine(data, prior, FitOptions(), width)
    weights = np.tile((np.arange(data.n_cases) % 10 != 0).astype(np.float64), (width, 1))  # fold 0 held out
    active = engine._set_up(np.full(width, prior.variance), weights, np.zeros((width, data.n_covariates)), None)
    assert active[:width].all()
    engine.run_cycle()  # the first replay
    seconds = []
    for _ in range(cycles):
        cp.cuda.Device().synchronize()
        started = time.perf_counter()
        engine.run_cycle()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def scaling_tables(n_cases: int, n_drugs: int):  # type: ignore[no-untyped-def]
    """``scaling_bench.py``'s ``sccs_cv`` tables on the GPU, the laplace prior at variance 0.1, and a line that
    describes them (also ``bench/sccs_cv_split_bench.py``'s)."""
    import cupy as cp

    from kernels.backend import device_label
    from kernels.sccs import synthetic
    from kernels.sccs.model import Prior

    data = synthetic.generate(cp, n_cases, n_drugs, seed=2013, min_eras=11, max_eras=31).data
    prior = Prior("laplace", 0.1, np.ones(data.n_covariates, dtype=bool))
    line = (f"N = {n_cases:,} cases, {data.n_eras:,} eras, {data.nnz:,} nonzeros, J = {data.n_covariates:,}; "
            f"{device_label(cp)}")
    return data, prior, line


def main() -> None:
    args = parse_args()
    data, prior, line = scaling_tables(args.n_cases, args.n_drugs)
    print(f"{line}; median of {args.cycles} cycles\n")
    print("| width R | seconds a cycle | per fit |")
    print("| ---: | ---: | ---: |")
    times = [cycle_seconds(data, prior, width, args.cycles) for width in args.widths]
    for width, seconds in zip(args.widths, times, strict=True):
        print(f"| {width} | {seconds * 1e3:.2f} ms | {seconds / width * 1e3:.2f} ms |")
    if len(args.widths) > 1:
        b, a = np.polyfit(np.asarray(args.widths, dtype=float), np.asarray(times), 1)
        print(f"\nt(R) = a + b R: a = {a * 1e3:.2f} ms, b = {b * 1e3:.2f} ms a fit")


if __name__ == "__main__":
    main()
