"""Strong scaling of a fanned-out crve_montecarlo job over 1, 2, 4, 8 workers (issue 19, item 4's chunked row).

For each worker count W the embedded stack (``cli.serve.embedded_stack``) runs W workers (``--gpus``: one per
GPU, pinned with CUDA_VISIBLE_DEVICES; ``--cpu-workers``: CPU workers, for a dry run without GPU), and one job
is submitted through the HTTP API and timed from submit to ``succeeded`` (best of ``--repeats``). W = 1 is the
single-worker run without fan-out (the baseline); W > 1 fans the job out into W chunks (a Celery chord).
Every run's result must equal the baseline's exactly (timings and device aside), or the script fails.
Efficiency per worker = T(1) / (W T(W)).

By default the stack is SQLite + kombu's SQLAlchemy broker under ``--data-dir`` (runs anywhere the venv
does); export DATABASE_URL and REDIS_URL to run it on PostgreSQL + Redis instead.

    python3 bench/scaling_bench.py --gpus 1 2 4 8                      # R = 10^7, G = 100, m = 32, k = 8
    python3 bench/scaling_bench.py --cpu-workers 1 2 --replications 20000 --n-clusters 50 --cluster-size 30 --k 3
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

from cli.client import GpuestClient
from cli.serve import embedded_stack

IGNORED = ("timings", "device")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--gpus", type=int, nargs="+", help="worker counts, one worker per GPU")
    where.add_argument("--cpu-workers", type=int, nargs="+", help="worker counts, CPU workers")
    parser.add_argument("--replications", type=int, default=10_000_000)
    parser.add_argument("--n-clusters", type=int, default=100)
    parser.add_argument("--cluster-size", type=int, default=32)
    parser.add_argument("--k", type=int, default=8, help="regressors including the intercept")
    parser.add_argument("--test", choices=["crv1", "wild_bootstrap"], default="crv1")
    parser.add_argument("--bootstrap-reps", type=int, default=999)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--repeats", type=int, default=2, help="jobs per worker count (the best is kept)")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per job")
    return parser.parse_args()


def job_params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {"n_clusters": args.n_clusters, "cluster_size": args.cluster_size,
                              "n_regressors": args.k, "replications": args.replications, "seed": args.seed,
                              "test": args.test}
    if args.test == "wild_bootstrap":
        params["bootstrap_reps"] = args.bootstrap_reps
    return params


def time_jobs(
    client: GpuestClient, params: dict[str, Any], repeats: int, timeout: float
) -> tuple[float, dict[str, Any], dict[str, Any]]:
    """The best submit-to-succeeded seconds of ``repeats`` jobs, the last job and its result."""
    best = float("inf")
    job: dict[str, Any] = {}
    result: dict[str, Any] = {}
    for _ in range(repeats):
        started = time.perf_counter()
        job_id = client.submit("crve_montecarlo", params)["id"]
        job = client.wait(job_id, timeout=timeout, poll_interval=0.02)
        seconds = time.perf_counter() - started
        if job["status"] != "succeeded":
            raise SystemExit(f"job {job_id} ended {job['status']}: {job.get('error')}")
        best = min(best, seconds)
        result = client.result(job_id)
    return best, job, result


def wait_until_ready(workers: list[Any], timeout: float) -> None:
    """Every worker has started (schema checked, kernels compiled or loaded): none of that is timed."""
    deadline = time.monotonic() + timeout
    while not all("worker ready" in worker.log_tail(1_000_000) for worker in workers):
        if time.monotonic() > deadline:
            raise SystemExit("the workers did not start:\n" + "\n".join(w.log_tail() for w in workers))
        time.sleep(0.5)


def main() -> None:
    args = parse_args()
    counts = args.gpus or args.cpu_workers
    params = job_params(args)
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="gpuest-scaling-"))
    rows = []
    baseline: dict[str, Any] | None = None
    for workers in counts:
        # One compiled-kernel cache for every stack: only the first start compiles.
        env = {"CUPY_CACHE_DIR": str(data_dir / "cuda-cache")}
        placement = {"gpus": workers} if args.gpus else {"cpu_workers": workers}
        if workers == 1:
            env["GPUEST_FANOUT_CHUNKS"] = "0"  # the baseline: one worker, the job whole
        with embedded_stack(data_dir / f"w{workers}", env=env, log_dir=data_dir / f"logs-w{workers}",
                            say=lambda line: print(line, file=sys.stderr), **placement) as stack, \
                GpuestClient(stack.base_url) as client:  # fmt: skip
            wait_until_ready(stack.workers, args.timeout)
            seconds, job, result = time_jobs(client, params, args.repeats, args.timeout)
        comparable = {key: value for key, value in result.items() if key not in IGNORED}
        if baseline is None:
            baseline = comparable
        elif comparable != baseline:
            raise SystemExit(f"{workers} workers: the result differs from the first run's:\n"
                             f"{json.dumps(comparable, indent=1)}\nvs\n{json.dumps(baseline, indent=1)}")
        rows.append((workers, seconds, (job.get("timings") or {}).get("chunks", 1), result.get("device")))
        print(f"{workers} worker(s): {seconds:.3f} s", file=sys.stderr, flush=True)

    first_workers, first_seconds = rows[0][0], rows[0][1]
    print(f"\nDate {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}; "
          f"`python3 bench/scaling_bench.py {' '.join(sys.argv[1:])}`")
    print(f"crve_montecarlo {json.dumps(params)}; submit to succeeded through the HTTP API, best of {args.repeats}; "
          "every result identical to the first row's.\n")
    print("| workers | chunks (with the lead) | seconds | speed-up | efficiency per worker | device(s) |")
    print("| ---: | ---: | ---: | ---: | ---: | --- |")
    for workers, seconds, chunks, device in rows:
        speedup = first_seconds * first_workers / seconds
        print(f"| {workers} | {chunks} | {seconds:.3f} | {speedup:.2f}x | {100 * speedup / workers:.0f} % | {device} |")


if __name__ == "__main__":
    main()
