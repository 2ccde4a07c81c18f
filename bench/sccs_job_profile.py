"""Where an ``sccs_fit`` (or ``sccs_analyses``) job's seconds go outside its fits, whole and fanned out, on one
device (issue 19).

The scaling bench (``bench/scaling_bench.py``) times jobs through the HTTP API and reads their stages; the
seconds between the stages (reading the tables into columns, storing artifacts and the result, the finish's
assembly) are not named there. This script runs the same job in this process through the worker's own entry
points (``worker.execute.execute_job``, ``worker.fanout.execute_chunk``) on an embedded store, each run under
``cProfile``, and prints its wall seconds, its stages and the functions of this repository (and CuPy's, NumPy's,
pandas') that took the most cumulative time.

* ``--chunks 1``: the job whole (after a first job that compiles and writes the decoded copies).
* ``--chunks 2``: the job fanned out into two chunks run one after the other, each with an empty job cache (as on
  two workers: each loads the tables), then the finish, which finds the last chunk's tables (as the worker that
  ran it would).

The tables are ``bench/scaling_bench.py``'s (``--n-cases`` etc.). Example (one GPU)::

    PYTHONPATH=. GPUEST_DEVICE=gpu python3 bench/sccs_job_profile.py --kind sccs_bootstrap --chunks 1 2
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import scaling_bench  # bench/ is this script's folder

PACKAGES = ("kernels/", "worker/", "store/", "core/", "cupy", "numpy", "pandas", "pyarrow")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=["sccs_cv", "sccs_bootstrap", "sccs_analyses"], default="sccs_bootstrap")
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--n-cases", type=int, default=scaling_bench.SCCS_LARGE["n_cases"])
    parser.add_argument("--n-drugs", type=int, default=scaling_bench.SCCS_LARGE["n_drugs"])
    parser.add_argument("--min-eras", type=int, default=scaling_bench.SCCS_LARGE["min_eras"])
    parser.add_argument("--max-eras", type=int, default=scaling_bench.SCCS_LARGE["max_eras"])
    parser.add_argument("--folds", type=int, default=10)
    parser.add_argument("--replicates", type=int, default=200)
    parser.add_argument("--top", type=int, default=30, help="functions printed per run")
    parser.add_argument("--data-dir", type=Path, default=None)
    return parser.parse_args()


def profiled(label: str, top: int, call: Any) -> Any:
    """``call()`` under cProfile: its wall seconds and the functions that took the most cumulative time."""
    profile = cProfile.Profile()
    started = time.perf_counter()
    value = profile.runcall(call)
    seconds = time.perf_counter() - started
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text).sort_stats("cumulative")
    stats.print_stats("|".join(PACKAGES), top)
    lines = [line for line in text.getvalue().splitlines() if line.strip()][-top - 1:]
    print(f"\n=== {label}: {seconds:.3f} s ===", flush=True)
    print("\n".join(lines), flush=True)
    return value


def main() -> None:
    args = parse_args()
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="gpuest-sccs-profile-"))
    os.environ.update({"GPUEST_DATA_DIR": str(data_dir / "var"), **scaling_bench.SCCS_UPLOAD_ENV,
                       "CUPY_CACHE_DIR": str(data_dir / "cuda-cache")})
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("REDIS_URL", None)

    from celery import _state as celery_state

    from core.settings import get_settings
    from store import chunks as chunk_store
    from store import jobs as job_store
    from store.dataset_ingest import ingest
    from store.db import session_scope
    from store.migrate import upgrade_to_head
    from worker import fanout
    from worker.device import job_cache
    from worker.execute import execute_job

    celery_state._task_join_will_block = True  # as inside a worker: a chord may be sent from here
    get_settings.cache_clear()
    upgrade_to_head()
    paths = scaling_bench.sccs_tables(args, data_dir / "tables")
    ids = {}
    for field, path in paths.items():
        with session_scope() as session:
            ids[field] = ingest(session, owner="bench", name=path.name, upload=path, source_format="parquet").id
    params = scaling_bench.sccs_params(args, ids)

    def submit() -> str:
        with session_scope() as session:
            kind = "sccs_analyses" if args.kind == "sccs_analyses" else "sccs_fit"
            job, _ = job_store.create_job(session, owner="bench", kind=kind, params=params, dataset_ids=ids,
                                          queue=get_settings().queue)
            return job.id

    def result_of(job_id: str) -> dict[str, Any]:
        with session_scope() as session:
            job = job_store.get_job(session, job_id)
            assert job is not None
            return {"status": job.status, "timings": (job.result or {}).get("timings"), "error": job.error}

    def chunk_rows(job_id: str) -> list[Any]:
        with session_scope() as session:
            rows = chunk_store.chunks_of(session, job_id)
            session.expunge_all()
            return rows

    for chunks in args.chunks:
        os.environ["GPUEST_FANOUT_CHUNKS"] = str(chunks if chunks > 1 else 0)
        get_settings.cache_clear()
        if chunks == 1:
            execute_job(submit(), worker="bench:0:warm-up")  # compiles, writes the decoded copies
            job_id = submit()
            profiled("whole job", args.top, lambda job_id=job_id: execute_job(job_id, worker="bench:0:whole"))
            print(json.dumps(result_of(job_id)), flush=True)
            continue
        job_id = submit()
        profiled("lead (claims, plans, sends the chord)", args.top,
                 lambda job_id=job_id: execute_job(job_id, worker="bench:0:lead"))
        for row in chunk_rows(job_id)[1:]:
            job_cache.clear()  # each chunk on its own worker: it loads the tables
            profiled(f"chunk {row.chunk_index} {row.spec}", args.top,
                     lambda row=row: fanout.execute_chunk(row.id, f"bench:{row.chunk_index}:chunk"))
            for done in chunk_rows(job_id)[1:]:
                if done.id == row.id:
                    print(f"chunk {done.chunk_index} stages {json.dumps(done.timings)}", flush=True)
        profiled("finish (the last chunk's worker: its tables kept)", args.top,
                 lambda job_id=job_id: execute_job(job_id, worker="bench:9:finish"))
        print(json.dumps(result_of(job_id)), flush=True)


if __name__ == "__main__":
    main()
