"""Where a fanned-out ``sccs_cv`` job's chunk and finish spend their time before the fits (issue 19): seconds per
step of reading and building the tables, and the finish's final fit and artifacts.

The tables are ``bench/scaling_bench.py``'s ``sccs_cv`` tables (``kernels.sccs.synthetic``, J = 1,428 drugs, 11-31
eras a case, seed 2013) at ``--n-cases`` (default 300,000: 6.3M eras, 7.9M nonzeros), written as Parquet and
stored the way the API's ingest stores an upload (``store.dataset_ingest.convert_upload``: 64K-row batches, 32 MB row
groups); written once per ``--data-dir`` and size. Each repeat then times, in this process:

* the steps of ``kernels.sccs.fit_plan._load_tables`` one by one: the Parquet read (``pyarrow.parquet.read_table``)
  and the conversion to pandas (what ``store.decoded.load_frame`` did before the decoded copies), the same
  frames as ``load_frame`` reads them from this host's decoded copies (memory-mapped Arrow IPC: what
  ``ctx.dataset`` calls), the columns (``select_outcome`` + ``table_columns``: extraction and validation), the
  copy to the device (GPU only) and ``build_from_tables`` (sorts, lookups, CSC and case index);
* a chunk's whole path to its first CV fit: ``FitPlan.load`` through a run context reading the files (with the
  job's own stage timings ``tables`` and ``build``), then the CV's fitter and folds;
* once, before the repeats, a dataset's first read on a host: ``load_frame`` without a decoded copy (the
  Parquet file decoded), then the wait for the copy its thread writes;
* once, the finish: ``run_fit`` with stand-in CV fits (the finish only reads them), its stage timings (tables,
  build, the final fit) and the artifacts written by the worker's writer (``store.artifacts.save_artifact``).

The table gives the best and the median of ``--repeats`` and the best scaled linearly to 3.6M cases (an
extrapolation: the steps are linear in the rows, but caches and the machine's cores are not).

    PYTHONPATH=. python3 bench/sccs_load_bench.py                         # NumPy, N = 300,000
    PYTHONPATH=. python3 bench/sccs_load_bench.py --device gpu --n-cases 3600000
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

LARGEST_CASES = 3_600_000
SEED = 2013
PARAMS = {"outcomes_dataset_id": "outcomes", "covariates_dataset_id": "covariates",
          "prior": {"type": "laplace", "variance": 0.1},
          "cross_validation": {"folds": 10, "grid": "auto", "seed": SEED}}  # scaling_bench.py's sccs_params


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-cases", type=int, default=300_000)
    parser.add_argument("--n-drugs", type=int, default=1428)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", choices=["numpy", "gpu"], default="numpy")
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "gpuest-sccs-load")
    parser.add_argument("--no-finish", action="store_true", help="skip the finish (its final fit is long on NumPy)")
    return parser.parse_args()


def stored_tables(args: argparse.Namespace) -> dict[str, Path]:
    """The tables as the dataset store keeps an uploaded Parquet file (written once per size)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kernels.sccs import synthetic
    from store.dataset_ingest import UploadLimits, convert_upload

    folder = args.data_dir / f"tables-{args.n_cases}-{args.n_drugs}"
    paths = {"outcomes_dataset_id": folder / "outcomes.parquet", "covariates_dataset_id": folder / "covariates.parquet"}
    if all(path.exists() for path in paths.values()):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    tables = synthetic.to_tables(synthetic.generate(np, args.n_cases, args.n_drugs, seed=SEED, min_eras=11,
                                                    max_eras=31).data)
    uploads = {
        "outcomes_dataset_id": pa.table({"rowId": tables.row_id, "stratumId": tables.stratum_id, "time": tables.time,
                                         "y": tables.y}),
        "covariates_dataset_id": pa.table({"rowId": tables.cov_row_id, "covariateId": tables.cov_id,
                                           "covariateValue": tables.cov_value}),
    }
    limits = UploadLimits(max_bytes=1 << 40, max_rows=1 << 40, max_columns=16)
    for field, table in uploads.items():
        upload = folder / f"{field}.upload.parquet"
        pq.write_table(table, upload)
        convert_upload(upload, "parquet", paths[field], limits)
        upload.unlink()
    return paths


class Steps:
    """Seconds per named step over the repeats (device-synchronised on the GPU), and the process's CPU seconds
    in user and kernel mode during the step (all threads): on a VM the kernel's share (page faults of fresh
    memory) varies from run to run with the allocation history, the user share is the computation."""

    def __init__(self, xp: Any) -> None:
        from kernels.backend import synchronize

        self.synchronize = lambda: synchronize(xp)
        self.seconds: dict[str, list[float]] = {}
        self.cpu: dict[str, list[tuple[float, float]]] = {}

    def add(self, name: str, seconds: float, cpu: tuple[float, float] | None = None) -> None:
        self.seconds.setdefault(name, []).append(seconds)
        if cpu is not None:
            self.cpu.setdefault(name, []).append(cpu)

    def time(self, name: str, work: Callable[[], Any]) -> Any:
        self.synchronize()
        before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        value = work()
        self.synchronize()
        seconds, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
        self.add(name, seconds, (after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime))
        return value

    def cpu_cell(self, name: str) -> str:
        if name not in self.cpu:
            return ""
        user, system = zip(*self.cpu[name], strict=True)
        return f"{statistics.median(user):.3f} / {statistics.median(system):.3f}"


def table_steps(steps: Steps, xp: Any, paths: dict[str, Path]) -> None:
    """The steps of ``_load_tables`` one by one (what they hold is freed on return, before the next measurement)."""
    import pyarrow.parquet as pq

    from kernels.backend import is_numpy
    from kernels.sccs import tables, transfer
    from kernels.sccs.data import build_from_tables
    from kernels.sccs.outcomes import select_outcome
    from store.decoded import load_frame

    arrow = steps.time("Parquet read (pyarrow read_table)", lambda: {f: pq.read_table(p) for f, p in paths.items()})
    steps.time("Arrow -> pandas (to_pandas)", lambda: {f: table.to_pandas() for f, table in arrow.items()})
    arrow.clear()
    frames = steps.time("load_frame from the decoded copies (store.decoded)",
                        lambda: {f: load_frame(p) for f, p in paths.items()})
    columns = steps.time("columns: select_outcome + table_columns", lambda: tables.table_columns(*select_outcome(
        frames["outcomes_dataset_id"], frames["covariates_dataset_id"], None)))
    if not is_numpy(xp):
        columns = steps.time("copy to the device (transfer.to_device)",
                             lambda: {name: transfer.to_device(xp, values) for name, values in columns.items()})
    steps.time("build_from_tables", lambda: build_from_tables(**columns, xp=xp))


def first_read(steps: Steps, paths: dict[str, Path]) -> None:
    """``load_frame`` of a dataset this host has no decoded copy of (the Parquet file decoded), then the wait
    for the copies its thread writes meanwhile."""
    from store.decoded import decoded_path, load_frame, wait_for_decoded_copies

    for path in paths.values():
        decoded_path(path).unlink(missing_ok=True)
    steps.time("load_frame, a host's first read (Parquet decoded; the copy written in a thread)",
               lambda: {f: load_frame(p) for f, p in paths.items()})
    steps.time("  then until that thread has written the decoded copies", wait_for_decoded_copies)


def chunk_path(steps: Steps, xp: Any, paths: dict[str, Path], params: Any) -> None:
    """A CV chunk's path to its first fit, as the job runs it."""
    from kernels.context import RunContext
    from kernels.progress import LocalProgress
    from kernels.sccs import cv, fit_plan
    from store.decoded import load_frame

    ctx = RunContext(xp, LocalProgress(), lambda field: load_frame(paths[field]), dataset_fields=tuple(paths))
    plan = steps.time("chunk: FitPlan.load (all of the above, as the job runs it)",
                      lambda: fit_plan.FitPlan.load(params, ctx))
    for stage, seconds in ctx.timer.as_dict().items():
        if stage != "total":
            steps.add(f"  chunk: of which the job's stage {stage!r}", seconds)
    spec = params.cross_validation
    steps.time("chunk: CV fitter and folds (then the first fit)",
               lambda: (plan.fitter(spec.folds), cv.fold_of_case(plan.data.n_cases, spec.folds, spec.seed)))


def finish(steps: Steps, xp: Any, paths: dict[str, Path], params: Any) -> None:
    """The finish's run_fit once, with stand-in CV fits and the worker's artifact writer."""
    from kernels.context import RunContext
    from kernels.progress import LocalProgress
    from kernels.sccs import cv, fit_job
    from store.artifacts import save_artifact
    from store.decoded import load_frame

    class WorkerArtifacts(LocalProgress):
        seconds = 0.0

        def save_artifact(self, name: str, value: Any) -> None:
            started = time.perf_counter()
            save_artifact("sccs-load-bench", name, value)
            WorkerArtifacts.seconds += time.perf_counter() - started

    spec = params.cross_validation
    grid = cv.variance_grid(spec.variances())
    scores = np.full((spec.folds, grid.size), -1e3)
    scores[:, grid.size // 2] += 1.0  # the chosen variance: the grid's middle
    n_covariates = 1428
    stand_in = cv.FoldFits(scores, np.ones(scores.shape, dtype=np.int64), np.ones(scores.shape, dtype=bool),
                           np.zeros((*scores.shape, n_covariates)), np.zeros(scores.shape))
    computed = fit_job.ComputedFits(cross_validation=cv.summarise(grid, stand_in))
    ctx = RunContext(xp, WorkerArtifacts(), lambda field: load_frame(paths[field]), dataset_fields=tuple(paths))
    steps.time("finish: run_fit (all)", lambda: fit_job.run_fit(params, ctx, computed))
    for stage, seconds in ctx.timer.as_dict().items():
        if stage != "total":
            steps.add(f"  finish: of which the job's stage {stage!r}", seconds)
    steps.add("  finish: of which the artifacts (store.artifacts.save_artifact)", WorkerArtifacts.seconds)


def main() -> None:
    args = parse_args()
    os.environ["GPUEST_DATA_DIR"] = str(args.data_dir / "var")  # the finish's artifacts: before any settings read
    from kernels.backend import device_label, get_namespace
    from kernels.sccs.spec import SccsParams

    xp = get_namespace(args.device)
    paths = stored_tables(args)
    params = SccsParams.model_validate(PARAMS)
    steps = Steps(xp)
    first_read(steps, paths)
    for _ in range(args.repeats):
        table_steps(steps, xp, paths)
        chunk_path(steps, xp, paths, params)
    if not args.no_finish:
        finish(steps, xp, paths, params)
    scale = LARGEST_CASES / args.n_cases
    sizes = {field: path.stat().st_size / 1e6 for field, path in paths.items()}
    print(f"sccs_cv tables, N = {args.n_cases:,} cases, J = {args.n_drugs:,}; stored Parquet "
          f"{sizes['outcomes_dataset_id']:.0f} + {sizes['covariates_dataset_id']:.0f} MB; {device_label(xp)}; "
          f"{os.cpu_count()} CPU cores; best and median of {args.repeats} (the finish: once)\n")
    print(f"| step | best s | median s | CPU user / kernel s (median) | best x {scale:g} (extrapolated to "
          f"{LARGEST_CASES:,} cases) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, seconds in steps.seconds.items():
        print(f"| {name} | {min(seconds):.3f} | {statistics.median(seconds):.3f} | {steps.cpu_cell(name)} | "
              f"{scale * min(seconds):.2f} |")


if __name__ == "__main__":
    main()
