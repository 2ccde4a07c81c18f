"""What one job-group POST costs the API in this process (embedded SQLite store, auth on): wall seconds and,
under ``--tracemalloc``, the peak of Python allocations, for the amplification body (a crve_montecarlo base
with an n-element ``cluster_sizes``, a grid of seeds x replications) and for the exponential formula
(``y ~ v0*...*v{k-1}`` as one crve_bootstrap job).

    python bench/group_expansion_bench.py --members 1000 2000 --sizes 1000 [--tracemalloc] [--formula 10 12]
        [--phases 1000 4000] [--formula-group 300]

``--phases``: the expansion and the members' checks alone (no store, no broker), with the byte bound lifted, for
n members of the ``--sizes`` base; ``--formula-group``: a group of n crve_bootstrap members sharing the
10-factor formula (1,024 terms) and its restriction.

Runs on any tree of the project (it imports only the API and the store): run it on an older checkout, with
PYTHONPATH pointing there, for the figures before a change."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import tracemalloc
from pathlib import Path


def _client(directory: Path):  # type: ignore[no-untyped-def]
    os.environ.update(
        GPUEST_DATA_DIR=str(directory / "var"),
        GPUEST_AUTH_ENABLED="true",
        GPUEST_BROKER_URL=f"sqla+sqlite:///{directory / 'broker.sqlite3'}",
        GPUEST_MAX_GROUP_JOBS="100000",
    )
    for name in ("DATABASE_URL", "GPUEST_DATABASE_URL", "BROKER_URL", "REDIS_URL"):
        os.environ.pop(name, None)
    from fastapi.testclient import TestClient

    from api.app import create_app
    from store.db import session_scope
    from store.keys import create_key
    from store.migrate import upgrade_to_head

    upgrade_to_head()
    client = TestClient(create_app(), raise_server_exceptions=False)
    client.__enter__()
    with session_scope() as session:
        key = create_key(session, "bench")
    return client, {"Authorization": f"Bearer {key}"}


def group_body(members: int, size: int) -> dict:
    seeds = max(members // 10, 1)
    base = {
        "kind": "crve_montecarlo",
        "params": {
            "n_clusters": size,
            "cluster_size": 5,
            "n_regressors": 2,
            "replications": 20,
            "cluster_sizes": [5] * size,
        },
    }
    return {"base": base, "grid": {"params.seed": list(range(seeds)), "params.replications": list(range(20, 30))}}


def measure(client, headers, body: dict, path: str, traced: bool) -> dict:  # type: ignore[no-untyped-def]
    content = json.dumps(body, separators=(",", ":"))
    if traced:
        tracemalloc.start()
    started = time.perf_counter()
    response = client.post(path, content=content, headers={**headers, "content-type": "application/json"})
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if traced else None
    if traced:
        tracemalloc.stop()
    return {
        "body_bytes": len(content),
        "status": response.status_code,
        "seconds": round(seconds, 3),
        "peak_bytes": peak,
        "detail": response.json().get("detail", "")[:160] if response.status_code >= 400 else None,
    }


def phases(members: int, size: int) -> dict:
    import inspect

    from api.routes.groups import member_adapter
    from api.schemas import JobGroupRequest
    from api.sweeps import MemberChecker, check_members, planned_members
    from core.settings import get_settings
    from store.db import session_scope

    settings = get_settings()
    request = JobGroupRequest.model_validate(group_body(members, size))
    bounds = (settings.max_group_jobs, 2**40)[: len(inspect.signature(planned_members).parameters) - 1]
    tracemalloc.start()
    started = time.perf_counter()
    planned, _ = planned_members(request, *bounds)
    expanded = time.perf_counter()
    with session_scope() as session:
        check_members(MemberChecker(session, "bench", member_adapter(), [], settings), planned)
    checked = time.perf_counter()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"expand_s": round(expanded - started, 3), "check_s": round(checked - expanded, 3), "peak_bytes": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, nargs="*", default=[])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1000], help="cluster_sizes elements")
    parser.add_argument("--formula", type=int, nargs="*", default=[], help="factors of y ~ v0*v1*...")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--phases", type=int, nargs="*", default=[], help="members, expansion and checks alone")
    parser.add_argument("--formula-group", type=int, nargs="*", default=[], help="members sharing a formula")
    arguments = parser.parse_args()
    client, headers = _client(Path(tempfile.mkdtemp(prefix="group-bench-")))
    for members in arguments.phases:
        for size in arguments.sizes:
            row = phases(members, size)
            print(json.dumps({"case": "phases", "members": members, "cluster_sizes": size, **row}), flush=True)
    for members in arguments.formula_group:
        formula = "y ~ " + "*".join(f"v{i}" for i in range(10))
        spec = {
            "kind": "crve_bootstrap",
            "params": {
                "synthetic": {"n_obs": 100, "n_clusters": 10},
                "formula": formula,
                "cluster": "g",
                "param": "v0",
            },
        }
        body = {"base": spec, "grid": {"params.seed": list(range(members))}}
        row = measure(client, headers, body, "/v1/job-groups", arguments.tracemalloc)
        print(json.dumps({"case": "formula-group", "members": members, **row}), flush=True)
    for size in arguments.sizes if arguments.members else []:
        for members in arguments.members:
            row = measure(client, headers, group_body(members, size), "/v1/job-groups", arguments.tracemalloc)
            print(json.dumps({"case": "group", "members": members, "cluster_sizes": size, **row}), flush=True)
    for factors in arguments.formula:
        formula = "y ~ " + "*".join(f"v{i}" for i in range(factors))
        spec = {
            "kind": "crve_bootstrap",
            "params": {
                "synthetic": {"n_obs": 100, "n_clusters": 10},
                "formula": formula,
                "cluster": "g",
                "param": "v0",
            },
        }
        row = measure(client, headers, spec, "/v1/jobs", arguments.tracemalloc)
        print(json.dumps({"case": "formula", "factors": factors, "formula_chars": len(formula), **row}), flush=True)


if __name__ == "__main__":
    main()
