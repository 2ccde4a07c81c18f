"""Where an SCCS cross-validation chunk's time goes against the whole CV's (issue 19), on one GPU.

The tables are ``bench/scaling_bench.py``'s ``sccs_cv`` tables (``kernels.sccs.synthetic``, J = 1,428 drugs, 11-31
eras a case, seed 2013) at ``--n-cases`` (default the paper's largest, 3.6M), generated on the GPU.

* ``--part columns``: seconds of one CCD cycle split by the columns' sizes (blocks of ``BLOCK`` touched cases a
  row: few, some, many) and by kernel (the three kernels of a coordinate, or each alone), at each width R of
  ``--widths``: what a coordinate costs whatever the batch's width.
* ``--part cv``: the 10-fold CV x 10 variances (laplace, Cyclops' grid) as one batch of 10 folds, then as two
  chunks of 5 folds (each on an engine of capacity 5, as a fan-out's chunks), with the batches' set-up, cycles
  and finish seconds, the batch cycles, and the rest (the held-out scoring).

    PYTHONPATH=. python3 bench/sccs_cv_split_bench.py --part columns cv
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
    parser.add_argument("--widths", type=int, nargs="+", default=[5, 10])
    parser.add_argument("--replays", type=int, default=7)
    parser.add_argument("--part", nargs="+", choices=["columns", "cv"], default=["columns", "cv"])
    parser.add_argument("--split", type=int, nargs="+", default=[1, 2], help="chunks of the CV's folds")
    return parser.parse_args()


def _launch(engine, columns, kernels: str) -> None:
    """``BatchEngine._launch_cycle`` restricted to some of the three kernels (``g``, ``s``, ``u``)."""
    d, k, r = engine.data, engine._kernels, engine.capacity
    i64, i32 = np.int64, np.int32
    n_eras, n_cases, n_cov = i64(d.n_eras), i64(d.n_cases), i32(d.n_covariates)
    kind = i32(2)
    for column in columns:
        first, cases, blocks = i64(column.first), i32(column.cases), column.blocks
        if "g" in kernels:
            k.grad_hess((blocks, r), (256,), (first, cases, i32(int(d.binary)), d.touched_case, d.touched_ptr,
                                              d.col_rows, d.col_values, engine.w, engine.sums, engine.weighted_events,
                                              engine.active, engine.partial, i32(engine._max_blocks), n_eras,
                                              n_cases))
        if "s" in kernels:
            k.step((r,), (256,), (i32(column.j), i32(blocks), engine.partial, i32(engine._max_blocks),
                                  engine.numerator, engine.beta, engine.trust, engine.step, engine.active,
                                  engine.fixed, kind, i32(1), engine.variance, n_cov))
        if "u" in kernels:
            k.update((blocks, r), (256,), (first, cases, d.touched_case, d.touched_ptr, d.col_rows, d.col_values,
                                           d.era_length, engine.eta, engine.w, engine.sums, engine.step,
                                           engine.case_weights, n_eras, n_cases))


def _replay_seconds(engine, columns, kernels: str, replays: int) -> float:
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        _launch(engine, columns, kernels)
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    seconds = []
    for _ in range(replays):
        started = time.perf_counter()
        graph.launch(stream)
        stream.synchronize()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def part_columns(data, prior, widths: list[int], replays: int) -> None:
    from kernels.sccs import gpu
    from kernels.sccs.ccd import FitOptions

    print("| width R | columns | count | cases (median) | g+s+u per column | g | s | u |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for width in widths:
        engine = gpu.BatchEngine(data, prior, FitOptions(), width, use_graph=False)
        weights = np.tile((np.arange(data.n_cases) % 10 != 0).astype(np.float64), (width, 1))
        engine._set_up(np.full(width, prior.variance), weights, np.zeros((width, data.n_covariates)), None)
        groups = {
            "1-4 blocks": [c for c in engine._columns if c.blocks <= 4],
            "5-16 blocks": [c for c in engine._columns if 4 < c.blocks <= 16],
            "17-64 blocks": [c for c in engine._columns if 16 < c.blocks <= 64],
            "65+ blocks": [c for c in engine._columns if c.blocks > 64],
            "all": engine._columns,
        }
        for name, columns in groups.items():
            if not columns:
                continue
            whole = _replay_seconds(engine, columns, "gsu", replays)
            parts = [_replay_seconds(engine, columns, kernel, replays) for kernel in "gsu"]
            n = len(columns)
            median_cases = int(statistics.median(c.cases for c in columns))
            print(f"| {width} | {name} | {n} | {median_cases:,} | {whole / n * 1e6:.1f} us ({whole * 1e3:.2f} ms) | "
                  + " | ".join(f"{p / n * 1e6:.1f} us" for p in parts) + " |")
        del engine


def part_cv(data, prior, splits: list[int]) -> None:
    import cupy as cp

    from kernels.ranges import even_ranges
    from kernels.sccs import cv, gpu
    from kernels.sccs.ccd import FitOptions

    grid = cv.variance_grid(cv.DEFAULT_GRID)
    # The process's first launches (the kernels' compiles or disk cache, CuPy's own kernels) before any row is
    # timed, or the first row pays them: one fold at the grid's first variance, fitted and scored.
    cv.fold_fits(data, gpu.batch_fitter(data, prior, FitOptions(), 1), grid[:1], 10, 2013, range(1))
    for chunks in splits:
        parts = even_ranges(10, chunks)
        for folds in parts:
            engine = gpu.BatchEngine(data, prior, FitOptions(), len(folds))
            stages: dict[str, float] = {}
            cycles = [0]

            def fitter(variances, case_weights, beta0, on_cycle, engine=engine, stages=stages, cycles=cycles):
                def count(finished, cycle):
                    cycles[0] += 1
                results = engine.fit_batch(np.asarray(variances), case_weights, beta0, count)
                for name, seconds in engine.last_timings.items():
                    stages[name] = stages.get(name, 0.0) + seconds
                return results

            cp.cuda.Device().synchronize()
            started = time.perf_counter()
            fits = cv.fold_fits(data, fitter, grid, 10, 2013, folds)
            cp.cuda.Device().synchronize()
            total = time.perf_counter() - started
            rest = total - sum(stages.values())
            print(f"| {chunks} | {folds.start}-{folds.stop - 1} | {total:.3f} s | "
                  + " | ".join(f"{stages.get(k, 0.0):.3f}" for k in ("setup", "cycles", "finish"))
                  + f" | {rest:.3f} | {cycles[0]} | {int(fits.iterations.sum())} |")
            del engine


def main() -> None:
    args = parse_args()
    from sccs_cycle_bench import scaling_tables  # this script's folder is on the path

    data, prior, line = scaling_tables(args.n_cases, args.n_drugs)
    print(f"{line}\n")
    if "columns" in args.part:
        part_columns(data, prior, args.widths, args.replays)
        print()
    if "cv" in args.part:
        print("| chunks | folds | seconds | setup | cycles | finish | rest (scoring) | batch cycles | fit cycles |")
        print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        part_cv(data, prior, args.split)


if __name__ == "__main__":
    main()
