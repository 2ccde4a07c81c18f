"""A database restart as a client sees it, end to end: a real uvicorn in front of a PostgreSQL of this test's
own. While it is down the API answers 503 with Retry-After (never 500), ``GpuestClient.wait`` keeps polling
through it, and the job it waits for is found intact afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session

from cli.client import ApiError, GpuestClient
from cli.serve import free_port
from tests.cli.cli_helpers import TINY_PARAMS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.servers
def test_wait_rides_out_a_database_restart(tmp_path) -> None:
    throwaway = pytest.importorskip("tests.reliability.throwaway")
    if throwaway.missing_binaries():
        pytest.skip(throwaway.missing_binaries())
    from store import jobs as job_store
    from store.db import engine_for
    from store.migrate import upgrade_to_head

    database = throwaway.ThrowawayPostgres()
    port = free_port()
    api = None
    try:
        url = database.create_database("gpuest_client")
        upgrade_to_head(url)
        env = {**os.environ, "DATABASE_URL": url, "GPUEST_DATABASE_URL": url, "GPUEST_DATA_DIR": str(tmp_path),
               "BROKER_URL": f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}", "GPUEST_AUTH_ENABLED": "false"}
        env.pop("REDIS_URL", None)
        env.pop("GPUEST_BROKER_URL", None)
        api = subprocess.Popen([sys.executable, "-m", "uvicorn", "api.app:app", "--port", str(port),
                                "--log-level", "warning"], cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "uvicorn did not start"
                time.sleep(0.2)

        with GpuestClient(base) as client:
            job = client.submit("crve_montecarlo", TINY_PARAMS)
            database.stop("fast")
            with pytest.raises(ApiError) as refused:
                client.get_job(job["id"])
            assert refused.value.status_code == 503 and refused.value.retry_after and refused.value.retry_after > 0

            def restart_and_finish() -> None:
                time.sleep(2.0)
                database.start()
                engine = engine_for(url)
                with Session(engine) as session, session.begin():
                    assert job_store.claim(session, job["id"], worker="w", device="cpu")
                with Session(engine) as session, session.begin():
                    assert job_store.finish(session, job["id"], worker="w", status="succeeded", result={})

            helper = threading.Thread(target=restart_and_finish)
            started = time.monotonic()
            helper.start()
            finished = client.wait(job["id"], poll_interval=0.2, timeout=120)
            helper.join()
        assert finished["status"] == "succeeded" and time.monotonic() - started >= 2.0
    finally:
        if api is not None:
            api.terminate()
            api.wait(timeout=20)
        engine_for.cache_clear()
        database.close()
