"""A fresh GPU worker's first ``sccs_fit`` job at the paper's largest size (issue 10: < 1.5 s including
everything), each measurement in a fresh Python process. Prints ``RESULT {json}`` lines.

Subcommands (``all`` runs the three in order, each in its own process):

* ``prepare``: the Cyclops tables of the paper's largest size (``bench/sccs_bench.py``'s LARGE: N = 3.6M
  cases, J = 1,428 drugs, K about 75M eras, seed 2013), generated on the GPU and saved as ``.npy`` columns
  (not timed; its CuPy cache is a folder of its own, so the measurements start cold).
* ``measure --cache DIR``: in this fresh process, as the worker starts: the disk cache pointed at DIR
  (:func:`kernels.cuda.use_disk_cache`), CuPy imported and the device opened, the SCCS job module imported
  and :func:`kernels.cuda.warm_up` run (its compiles of ``ccd.cu`` and the SCCS warm-up hook's tiny jobs):
  ``warm_up``. The tables are read into DataFrames (not timed: the dataset store's part). Then the first
  ``sccs_fit`` job (laplace prior, sigma^2 = 0.1, the paper's criterion) through ``run_kind``: ``first_job``,
  wall seconds of everything (the tables' columns read on the host: ``tables``; copied to the device:
  ``to_device``; sorted, indexed and checked there: ``build``; engine build with CUDA-graph capture:
  ``engine``; the fit and its final evaluation: ``fit``) and the job's own stage timings. A second identical
  job gives the steady state, and ``profile`` the parts of one job (three ways to copy the tables included).
* ``all``: prepare; measure with an empty disk cache (a); measure again with the cache (a) filled (b).

Usage on the device: ``PYTHONPATH=. python3 bench/sccs_first_fit.py all [--dir /tmp/sccs_first_fit]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from kernels import cuda
from kernels.backend import device_label

LARGE = {"n_cases": 3_600_000, "n_drugs": 1428, "min_eras": 11, "max_eras": 31}  # as bench/sccs_bench.py
SEED = 2013
PARAMS = {
    "outcomes_dataset_id": "outcomes",
    "covariates_dataset_id": "covariates",
    "prior": {"type": "laplace", "variance": 0.1},
}
COLUMNS = {
    "outcomes_dataset_id": {"rowId": "row_id", "stratumId": "stratum_id", "time": "time", "y": "y"},
    "covariates_dataset_id": {"rowId": "cov_row_id", "covariateId": "cov_id", "covariateValue": "cov_value"},
}


def _report(**fields: Any) -> None:
    print("RESULT " + json.dumps(fields), flush=True)


def prepare(folder: Path) -> None:
    cuda.use_disk_cache(folder / "prepare-cache")
    import cupy

    from kernels.sccs import synthetic

    start = time.perf_counter()
    data = synthetic.generate(cupy, LARGE["n_cases"], LARGE["n_drugs"], seed=SEED, min_eras=LARGE["min_eras"],
                              max_eras=LARGE["max_eras"]).data
    tables = synthetic.to_tables(data)
    for name in ("row_id", "stratum_id", "time", "y", "cov_row_id", "cov_id", "cov_value"):
        np.save(folder / f"{name}.npy", getattr(tables, name))
    _report(step="prepare", seconds=time.perf_counter() - start, N=data.n_cases, J=data.n_covariates,
            K=data.n_eras, nnz=data.nnz)


def _frames(folder: Path) -> dict[str, Any]:
    import pandas as pd

    return {
        field: pd.DataFrame({column: np.load(folder / f"{name}.npy") for column, name in columns.items()})
        for field, columns in COLUMNS.items()
    }


def _seconds(function: Any, synchronize: Any) -> tuple[float, Any]:
    synchronize()
    start = time.perf_counter()
    value = function()
    synchronize()
    return time.perf_counter() - start, value


def measure(folder: Path, cache: Path, label: str, parts: bool = True) -> None:
    start = time.perf_counter()
    cuda.use_disk_cache(cache)
    import cupy

    cupy.cuda.Device(0).use()
    cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(1))  # the CUDA context
    opened = time.perf_counter() - start
    from kernels.registry import registry
    from kernels.sccs import jobs

    registry()  # as the worker does: every kind's sources and warm-up hooks are declared before the warm-up
    compiled = cuda.warm_up()
    cupy.cuda.Device().synchronize()
    _report(step="warm_up", cache=label, seconds=time.perf_counter() - start, cupy_import_and_context=opened,
            modules=compiled, device=device_label(cupy), cupy=cupy.__version__)

    from kernels.context import local_context, run_kind

    kind = {k.name: k for k in jobs.KINDS}["sccs_fit"]
    read = time.perf_counter()
    frames = _frames(folder)
    read = time.perf_counter() - read
    pool = cupy.get_default_memory_pool()
    for repeat, name in enumerate(("first_job", "second_job")):
        pool_before = pool.total_bytes()
        seconds, result = _seconds(lambda: run_kind(kind, PARAMS, local_context("gpu", datasets=frames)),
                                   cupy.cuda.Device().synchronize)
        _report(step=name, cache=label, seconds=seconds, stages=result["timings"], iterations=result["iterations"],
                converged=result["converged"], gradient_norm=result["gradient_norm"],
                nonzero=result["nonzero_coefficients"], n_eras=result["n_eras"],
                device_pool_growth_gb=(pool.total_bytes() - pool_before) / 1e9,
                tables_read_seconds=read if repeat == 0 else None)
    if parts:
        profile(frames, label)


def profile(frames: dict[str, Any], label: str) -> None:
    """The parts of one fit on the same data (steady state: everything is compiled and loaded by now)."""
    import cupy

    from kernels.sccs import ccd, gpu, model, transfer
    from kernels.sccs.model import Prior
    from kernels.sccs.tables import load_tables, table_columns

    sync = cupy.cuda.Device().synchronize
    parts: dict[str, float] = {}
    columns = table_columns(frames["outcomes_dataset_id"], frames["covariates_dataset_id"])
    parts["tables_columns"], _ = _seconds(
        lambda: table_columns(frames["outcomes_dataset_id"], frames["covariates_dataset_id"]), sync)
    parts["columns_to_device"], moved = _seconds(lambda: [transfer.to_device(cupy, c) for c in columns.values()],
                                                  sync)
    del moved
    parts["columns_to_device_cupy_asarray"], moved = _seconds(lambda: [cupy.asarray(c) for c in columns.values()],
                                                              sync)
    del moved

    def pageable() -> list[Any]:  # straight from pageable host memory (the driver stages the copy)
        copies = [cupy.empty(c.shape, dtype=c.dtype) for c in columns.values()]
        for copy, c in zip(copies, columns.values(), strict=True):
            copy.set(c)
        return copies

    parts["columns_to_device_pageable"], moved = _seconds(pageable, sync)
    del moved
    parts["tables_to_data_on_device"], built = _seconds(
        lambda: load_tables(frames["outcomes_dataset_id"], frames["covariates_dataset_id"], xp=cupy), sync)
    data = built.data
    prior = Prior("laplace", 0.1, np.ones(data.n_covariates, dtype=bool))
    parts["engine"], engine = _seconds(lambda: gpu.BatchEngine(data, prior, ccd.FitOptions(), capacity=1), sync)
    parts["fit_batch"], results = _seconds(
        lambda: engine.fit_batch(np.asarray([0.1]), cupy.ones((1, data.n_cases)), cupy.zeros((1, data.n_covariates))),
        sync)
    parts.update({f"fit_batch.{k}": v for k, v in engine.last_timings.items()})
    beta = results[0].beta
    weights = cupy.ones(data.n_cases)
    parts["final_log_likelihood_and_gradient"], _ = _seconds(
        lambda: model.log_likelihood_and_gradient(data, beta, weights), sync)
    parts["design_times_beta"], _ = _seconds(lambda: data.design @ cupy.asarray(beta), sync)

    def unflagged_product() -> Any:  # as before this change: a new CSC matrix per product, checked by CuPy
        import cupyx.scipy.sparse as sparse

        matrix = sparse.csc_matrix((data.col_values, data.col_rows, data.col_ptr), shape=data.design.shape)
        return matrix @ cupy.asarray(beta)

    parts["design_times_beta_unflagged_matrix"], _ = _seconds(unflagged_product, sync)
    parts["case_max"], _ = _seconds(lambda: model.case_max(data, data.era_length), sync)
    parts["cycle_replay"], _ = _seconds(engine.run_cycle, sync)
    _report(step="profile", cache=label, **parts)


def run_all(folder: Path, parts: bool = True) -> list[dict[str, Any]]:
    """prepare, then measure with an empty cache and again with it filled, each in a fresh process; returns
    every ``RESULT`` record (each line is also printed as it comes). ``parts``: measure's ``profile`` too."""
    folder.mkdir(parents=True, exist_ok=True)
    cache = folder / "cuda-cache"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    script = [sys.executable, str(Path(__file__).resolve())]
    records = result_records([*script, "prepare", "--dir", str(folder)], env, check=True)
    for label in ("empty", "populated"):  # each in a fresh process; a failed one still lets the next run
        command = [*script, "measure", "--dir", str(folder), "--cache", str(cache), "--label", label]
        records += result_records([*command] if parts else [*command, "--no-profile"], env, check=False)
    return records


def result_records(command: list[str], env: dict[str, str], check: bool) -> list[dict[str, Any]]:
    """Run ``command``, echo its output, and return its ``RESULT`` records (a failure adds one saying so)."""
    done = subprocess.run(command, check=False, env=env, stdout=subprocess.PIPE, text=True)
    print(done.stdout, end="", flush=True)
    records = [json.loads(line[len("RESULT ") :]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode:
        if check:
            raise subprocess.CalledProcessError(done.returncode, command)
        label = command[command.index("--label") + 1] if "--label" in command else ""
        records.append({"step": "measure", "cache": label, "failed": done.returncode})
        _report(**records[-1])
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["prepare", "measure", "all"])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/sccs_first_fit"))
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--label", default="")
    parser.add_argument("--no-profile", action="store_true", help="measure: leave out the parts of one job")
    args = parser.parse_args()
    if args.command == "prepare":
        args.dir.mkdir(parents=True, exist_ok=True)
        prepare(args.dir)
    elif args.command == "measure":
        measure(args.dir, args.cache or args.dir / "cuda-cache", args.label, parts=not args.no_profile)
    else:
        run_all(args.dir)


if __name__ == "__main__":
    main()
