"""Strong scaling of a fanned-out job over 1, 2, 4, 8 workers (issue 19, item 4's chunked rows).

For each worker count W the embedded stack (``cli.serve.embedded_stack``) runs W workers (``--gpus``: one per
GPU, pinned with CUDA_VISIBLE_DEVICES; ``--cpu-workers``: CPU workers, for a dry run without GPU), and one job
is submitted through the HTTP API and timed from submit to ``succeeded`` (best of ``--repeats``). W = 1 is the
single-worker run without fan-out (the baseline); W > 1 fans the job out into W chunks (a Celery chord).
Every run's result must equal the baseline's exactly (timings and device aside): the table says so per row,
and the script exits with status 1 after the table if one does not. Efficiency per worker = T(1) / (W T(W)).

``--kind``:

* ``crve_montecarlo`` (default): R = 10^7 replications, G = 100, m = 32, k = 8;
* ``sccs_cv``: ``sccs_fit`` with 10-fold cross-validation over the 10 variances of Cyclops' grid (laplace
  prior), on synthetic tables of the paper's largest size (N = 3.6M cases, J = 1,428 drugs, about 75M eras:
  ``bench/sccs_bench.py``'s ``LARGE``), generated on the GPU when CuPy is there (else NumPy), written as Parquet
  and uploaded through the API once: every worker count's stack shares one data directory (and database), and
  a later run with the same ``--data-dir`` and sizes reuses the upload. Each chunk, and the worker finishing
  the job, reads the tables itself (the time that takes is in the timings: it is part of the fan-out's cost).
* ``sccs_bootstrap``: ``sccs_fit`` at variance 0.1 (laplace) with ``--replicates`` (default 200) bootstrap refits,
  on the same tables (``--n-cases`` etc.): fanned out by ranges of replicates, each chunk fitting its own in
  batches as wide as the single run's;
* ``sccs_analyses``: every one of the J drugs analysed alone (``sccs_analyses``: estimate, 95 % likelihood-ratio
  interval, p, MDRR) on the same tables: fanned out by groups of analyses when the covariates table has at least
  ``GPUEST_FANOUT_MIN_ANALYSIS_ROWS`` rows (default 10^7; the paper's largest tables have 95M);
* ``crve_bootstrap_hc``: ``crve_bootstrap``'s heteroskedastic wild bootstrap (a bootstrap cluster per row),
  y ~ x1 + x2 + x3 with weights, H0: x1 = 0, no interval, on an uploaded Parquet file of ``--n-obs`` rows
  (default 10^7, ``bench/crve_regressions_bench.py``'s hc10m design) with B = ``--draws`` (default 9,999: about
  10 s of draws on an H100). Uploaded once per ``--data-dir``; every part reads and sets up the dataset itself.

By default the stack is SQLite + kombu's SQLAlchemy broker under ``--data-dir`` (runs anywhere the venv
does); export DATABASE_URL and REDIS_URL to run it on PostgreSQL + Redis instead.

    python3 bench/scaling_bench.py --gpus 1 2 4 8                      # R = 10^7, G = 100, m = 32, k = 8
    python3 bench/scaling_bench.py --cpu-workers 1 2 --replications 20000 --n-clusters 50 --cluster-size 30 --k 3
    python3 bench/scaling_bench.py --kind sccs_cv --gpus 1 2 4 --data-dir /tmp/scaling-sccs
    python3 bench/scaling_bench.py --kind sccs_cv --cpu-workers 1 2 --n-cases 20000 --n-drugs 40
    python3 bench/scaling_bench.py --kind sccs_bootstrap --gpus 1 2 --n-cases 1000000 --data-dir /tmp/scaling-sccs
    python3 bench/scaling_bench.py --kind crve_bootstrap_hc --gpus 1 2 4 --data-dir /tmp/scaling-hc
    GPUEST_FANOUT_MIN_BOOTSTRAP_WEIGHTS=1e6 python3 bench/scaling_bench.py --kind crve_bootstrap_hc --cpu-workers 1 2 \
        --n-obs 200000 --draws 1999     # a CPU dry run: below the default 3 x 10^10 weights a job runs whole
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.client import ApiError, GpuestClient
from cli.serve import embedded_stack
from kernels.result_diff import compare_leaves

IGNORED = ("timings", "device")
# The paper's largest SCCS data set (bench/sccs_bench.py LARGE).
SCCS_LARGE = {"n_cases": 3_600_000, "n_drugs": 1428, "min_eras": 11, "max_eras": 31}
SCCS_SEED = 2013
# The upload limits of a stack that takes the paper's largest tables (about 75M and 95M rows).
SCCS_UPLOAD_ENV = {"GPUEST_MAX_UPLOAD_ROWS": "400000000", "GPUEST_MAX_UPLOAD_BYTES": str(32 * 1024**3)}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--gpus", type=int, nargs="+", help="worker counts, one worker per GPU")
    where.add_argument("--cpu-workers", type=int, nargs="+", help="worker counts, CPU workers")
    parser.add_argument("--kind", default="crve_montecarlo",
                        choices=["crve_montecarlo", "sccs_cv", "sccs_bootstrap", "sccs_analyses",
                                 "crve_bootstrap_hc"])  # fmt: skip
    parser.add_argument("--replications", type=int, default=10_000_000)
    parser.add_argument("--n-clusters", type=int, default=100)
    parser.add_argument("--cluster-size", type=int, default=32)
    parser.add_argument("--k", type=int, default=8, help="regressors including the intercept")
    parser.add_argument("--test", choices=["crv1", "wild_bootstrap"], default="crv1")
    parser.add_argument("--bootstrap-reps", type=int, default=999)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--n-cases", type=int, default=SCCS_LARGE["n_cases"], help="sccs_cv: cases")
    parser.add_argument("--n-drugs", type=int, default=SCCS_LARGE["n_drugs"], help="sccs_cv: drugs (covariates)")
    parser.add_argument("--min-eras", type=int, default=SCCS_LARGE["min_eras"], help="sccs_cv: eras per case, least")
    parser.add_argument("--max-eras", type=int, default=SCCS_LARGE["max_eras"], help="sccs_cv: eras per case, most")
    parser.add_argument("--folds", type=int, default=10, help="sccs_cv: cross-validation folds")
    parser.add_argument("--replicates", type=int, default=200, help="sccs_bootstrap: bootstrap replicates")
    parser.add_argument("--n-obs", type=int, default=10_000_000, help="crve_bootstrap_hc: rows")
    parser.add_argument("--draws", type=int, default=9_999, help="crve_bootstrap_hc: bootstrap draws B")
    parser.add_argument("--repeats", type=int, default=2, help="jobs per worker count (the best is kept)")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per job")
    return parser.parse_args()


def job_params(args: argparse.Namespace) -> dict[str, Any]:
    """The crve_montecarlo job of the arguments."""
    params: dict[str, Any] = {"n_clusters": args.n_clusters, "cluster_size": args.cluster_size,
                              "n_regressors": args.k, "replications": args.replications, "seed": args.seed,
                              "test": args.test}
    if args.test == "wild_bootstrap":
        params["bootstrap_reps"] = args.bootstrap_reps
    return params


def sccs_params(args: argparse.Namespace, dataset_ids: dict[str, str]) -> dict[str, Any]:
    """The sccs_fit job: 10-fold CV over Cyclops' 10 variances ("auto"), laplace prior, the paper's criterion;
    or (``sccs_bootstrap``) the fit at variance 0.1 and ``--replicates`` bootstrap refits; or the sccs_analyses job
    of every drug (``sccs_analyses``)."""
    if args.kind == "sccs_analyses":
        return dict(dataset_ids)  # every exposure alone, 95 % likelihood-ratio intervals
    if args.kind == "sccs_bootstrap":
        return {**dataset_ids, "prior": {"type": "laplace", "variance": 0.1},
                "bootstrap": {"replicates": args.replicates, "seed": SCCS_SEED}}
    return {**dataset_ids, "prior": {"type": "laplace", "variance": 0.1},
            "cross_validation": {"folds": args.folds, "grid": "auto", "seed": SCCS_SEED}}


def sccs_tables(args: argparse.Namespace, folder: Path) -> dict[str, Path]:
    """The synthetic interval tables of the arguments' size as Parquet files (written once per size)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kernels.sccs import synthetic

    folder.mkdir(parents=True, exist_ok=True)
    paths = {"outcomes_dataset_id": folder / "outcomes.parquet", "covariates_dataset_id": folder / "covariates.parquet"}
    if all(path.exists() for path in paths.values()):
        return paths
    try:
        import cupy as xp

        xp.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, or no GPU: NumPy draws the same tables (Philox), more slowly
        xp = np
    started = time.perf_counter()
    data = synthetic.generate(xp, args.n_cases, args.n_drugs, seed=SCCS_SEED, min_eras=args.min_eras,
                              max_eras=args.max_eras).data
    tables = synthetic.to_tables(data)
    del data
    if xp is not np:  # give the device memory back before the workers start
        xp.get_default_memory_pool().free_all_blocks()
    pq.write_table(pa.table({"rowId": tables.row_id, "stratumId": tables.stratum_id, "time": tables.time,
                             "y": tables.y}), paths["outcomes_dataset_id"])
    pq.write_table(pa.table({"rowId": tables.cov_row_id, "covariateId": tables.cov_id,
                             "covariateValue": tables.cov_value}), paths["covariates_dataset_id"])
    print(f"tables: {tables.row_id.size:,} eras, {tables.cov_row_id.size:,} nonzeros, written in "
          f"{time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return paths


def sccs_size(args: argparse.Namespace) -> str:
    return f"{args.n_cases}-{args.n_drugs}-{args.min_eras}-{args.max_eras}"


def sccs_datasets(client: GpuestClient, paths: dict[str, Path], args: argparse.Namespace,
                  data_dir: Path) -> dict[str, str]:
    """The tables uploaded through the API once (their ids kept beside the stack's database for later runs)."""
    record = data_dir / f"sccs-datasets-{sccs_size(args)}.json"
    if record.exists():
        ids = json.loads(record.read_text())
        try:
            for dataset_id in ids.values():
                client.get_dataset(dataset_id)
            return ids
        except ApiError:  # gone: upload again
            pass
    started = time.perf_counter()
    ids = {field: client.upload_dataset(path)["id"] for field, path in paths.items()}
    print(f"tables uploaded in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    record.write_text(json.dumps(ids))
    return ids


def hc_params(args: argparse.Namespace, client: GpuestClient, data_dir: Path, stack_dir: Path) -> dict[str, Any]:
    """The crve_bootstrap_hc job on its dataset, written as Parquet once per size and uploaded once per stack."""
    import numpy as np
    import pandas as pd

    path = data_dir / f"hc-{args.n_obs}.parquet"
    if not path.exists():
        rs = np.random.default_rng(args.seed)
        x = rs.standard_normal((args.n_obs, 3))
        y = x @ np.array([0.0, 0.5, 1.0]) + rs.standard_normal(args.n_obs) * np.sqrt(1.0 + x[:, 0] ** 2)
        columns = {"y": y, "x1": x[:, 0], "x2": x[:, 1], "x3": x[:, 2], "w": 0.5 + rs.random(args.n_obs)}
        pd.DataFrame(columns).to_parquet(path, index=False)
    record = stack_dir / f"hc-dataset-{args.n_obs}.json"
    dataset_id = json.loads(record.read_text())["id"] if record.exists() else None
    if dataset_id is None:
        dataset_id = client.upload_dataset(path)["id"]
        record.write_text(json.dumps({"id": dataset_id}))
    return {"dataset_id": dataset_id, "formula": "y ~ x1 + x2 + x3", "cluster": None, "weights": "w", "param": "x1",
            "reps": args.draws, "seed": args.seed, "conf_int": False}  # fmt: skip


def time_jobs(
    client: GpuestClient, kind: str, params: dict[str, Any], repeats: int, timeout: float
) -> tuple[float, dict[str, Any], dict[str, Any]]:
    """The best submit-to-succeeded seconds of ``repeats`` jobs, the last job and its result."""
    best = float("inf")
    job: dict[str, Any] = {}
    result: dict[str, Any] = {}
    for _ in range(repeats):
        started, posted = time.perf_counter(), datetime.datetime.now(datetime.UTC)
        job_id = client.submit(kind, params)["id"]
        submitted = time.perf_counter() - started
        job = client.wait(job_id, timeout=timeout, poll_interval=0.02)
        seconds, seen = time.perf_counter() - started, datetime.datetime.now(datetime.UTC)
        if job["status"] != "succeeded":
            raise SystemExit(f"job {job_id} ended {job['status']}: {job.get('error')}")
        best = min(best, seconds)
        result = client.result(job_id)
        print(f"  a job: {seconds:.3f} s, {timeline(job, posted, submitted, seen)}, stages "
              f"{json.dumps(result.get('timings'))}", file=sys.stderr, flush=True)
    return best, job, result


def timeline(job: dict[str, Any], posted: datetime.datetime, submitted: float, seen: datetime.datetime) -> str:
    """Where a job's seconds went, from the job's own timestamps (API, workers and this client share the host's
    clock): the POST, created to the last start (a fanned-out job's finish starts after its chunks), that start
    to finished (the finish or the whole run, and storing the result), finished to seen by the poll."""
    created, last_start, finished = (datetime.datetime.fromisoformat(job[key]) for key in ("created_at", "started_at",
                                                                                  "finished_at"))
    return (f"timeline: POST {submitted:.3f} s (created {(created - posted).total_seconds():.3f} s after it was "
            f"sent), created to last start {(last_start - created).total_seconds():.3f} s, to finished "
            f"{(finished - last_start).total_seconds():.3f} s, seen {(seen - finished).total_seconds():.3f} s later")


def wait_until_ready(workers: list[Any], timeout: float) -> None:
    """Every worker has started (schema checked, kernels compiled or loaded): none of that is timed."""
    deadline = time.monotonic() + timeout
    while not all("worker ready" in worker.log_tail(1_000_000) for worker in workers):
        if time.monotonic() > deadline:
            raise SystemExit("the workers did not start:\n" + "\n".join(w.log_tail() for w in workers))
        time.sleep(0.5)


def difference(result: dict[str, Any], baseline: dict[str, Any]) -> str:
    """"identical", or the largest relative difference of a numeric leaf (and where)."""
    if result == baseline:
        return "identical"
    try:
        worst = max(compare_leaves(result, baseline), default=(0.0, ""))
    except AssertionError as error:  # another structure or a non-numeric leaf differs
        return f"differs: {error}"
    return f"differs: max rel. {worst[0]:.1e} at {worst[1]}"


def chunk_count(job: dict[str, Any], workers: int) -> int:
    """Chunks of the job with the lead (a job finished by a worker after its chunks does not record them)."""
    return int((job.get("timings") or {}).get("chunks", workers + 1 if workers > 1 else 1))


def main() -> None:
    args = parse_args()
    counts = args.gpus or args.cpu_workers
    kind = {"sccs_cv": "sccs_fit", "sccs_bootstrap": "sccs_fit", "crve_bootstrap_hc": "crve_bootstrap"}.get(
        args.kind, args.kind)
    sccs = args.kind.startswith("sccs")
    params = job_params(args) if args.kind == "crve_montecarlo" else {}
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="gpuest-scaling-"))
    tables = sccs_tables(args, data_dir / f"sccs-tables-{sccs_size(args)}") if sccs else {}
    rows = []
    baseline: dict[str, Any] | None = None
    for workers in counts:
        # One compiled-kernel cache for every stack: only the first start compiles.
        env = {"CUPY_CACHE_DIR": str(data_dir / "cuda-cache")}
        placement = {"gpus": workers} if args.gpus else {"cpu_workers": workers}
        if workers == 1:
            env["GPUEST_FANOUT_CHUNKS"] = "0"  # the baseline: one worker, the job whole
        if sccs:  # one stack directory for every worker count: the tables are uploaded once
            env.update(SCCS_UPLOAD_ENV)
            stack_dir = data_dir / "sccs-stack"
        elif args.kind == "crve_bootstrap_hc":  # likewise: the dataset is uploaded once
            env.update(SCCS_UPLOAD_ENV)
            stack_dir = data_dir / "hc-stack"
        else:
            stack_dir = data_dir / f"w{workers}"
        with embedded_stack(stack_dir, env=env, log_dir=data_dir / f"logs-w{workers}",
                            say=lambda line: print(line, file=sys.stderr), **placement) as stack, \
                GpuestClient(stack.base_url, timeout=max(600.0, args.timeout)) as client:  # fmt: skip
            wait_until_ready(stack.workers, args.timeout)
            if sccs:
                params = sccs_params(args, sccs_datasets(client, tables, args, stack_dir))
            elif args.kind == "crve_bootstrap_hc":
                params = hc_params(args, client, data_dir, stack_dir)
            seconds, job, result = time_jobs(client, kind, params, args.repeats, args.timeout)
        comparable = {key: value for key, value in result.items() if key not in IGNORED}
        baseline = baseline if baseline is not None else comparable
        rows.append((workers, seconds, chunk_count(job, workers), result.get("device"),
                     difference(comparable, baseline)))
        print(f"{workers} worker(s): {seconds:.3f} s, {rows[-1][-1]}", file=sys.stderr, flush=True)
        # Where the seconds went (a fanned-out job sums its chunks' and its finish's stages)
        print(f"{workers} worker(s) stages: {json.dumps(result.get('timings'))}", file=sys.stderr, flush=True)

    first_workers, first_seconds = rows[0][0], rows[0][1]
    print(f"\nDate {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}; "
          f"`python3 bench/scaling_bench.py {' '.join(sys.argv[1:])}`")
    described = {key: value for key, value in params.items() if not key.endswith("dataset_id")}
    sizes = (f" on N = {args.n_cases:,} cases, J = {args.n_drugs:,} drugs, {args.min_eras}-{args.max_eras} eras a case"
             if sccs else f" on N = {args.n_obs:,} rows" if args.kind == "crve_bootstrap_hc" else "")
    print(f"{kind} {json.dumps(described)}{sizes}; submit to succeeded through the HTTP API, best of "
          f"{args.repeats}; each result against the first row's.\n")
    print("| workers | chunks (with the lead) | seconds | speed-up | efficiency per worker | result | device(s) |")
    print("| ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for workers, seconds, chunks, device, same in rows:
        speedup = first_seconds * first_workers / seconds
        print(f"| {workers} | {chunks} | {seconds:.3f} | {speedup:.2f}x | {100 * speedup / workers:.0f} % | {same} "
              f"| {device} |")
    if any(row[-1] != "identical" for row in rows):
        raise SystemExit("a result differs from the first row's (see the table)")


if __name__ == "__main__":
    main()
