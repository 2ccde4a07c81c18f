"""sccs_eras -> sccs_fit on the real stack (uvicorn + a Celery worker process) with nothing downloaded:
the eras job's `outcomes` and `covariates` artifacts are registered as datasets
(`POST /v1/datasets/from-artifact`: `outcomes` by the `gpuest datasets from-artifact` command, `covariates` by the
Python client) and the fit job reads them. Its estimates equal the same two jobs run in this process on the same
person-level tables."""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from cli.client import GpuestClient
from cli.serve import EmbeddedStack, embedded_stack
from kernels.context import local_context, run_kind
from kernels.progress import LocalProgress
from kernels.registry import get_kind
from tests.cli.cli_helpers import gpuest_in_process

ERAS = {"risk_window_start": 1, "risk_window_end": 30, "end_anchor": "exposure_start"}
FIT = {"prior": {"type": "none"}}


def _person_tables() -> dict[str, pd.DataFrame]:
    """300 cases observed for a year, 1-3 events each (uniform days), 600 exposures of 5 drugs (seeded)."""
    generator = np.random.default_rng(15)
    n_cases, n_exposures = 300, 600
    case_id = np.arange(1, n_cases + 1)
    exposure_case = generator.integers(1, n_cases + 1, n_exposures)
    exposure_start = generator.integers(0, 330, n_exposures)
    events = generator.integers(1, 4, n_cases)
    return {
        "cases_dataset_id": pd.DataFrame({"caseId": case_id, "observationStart": 0, "observationEnd": 364}),
        "events_dataset_id": pd.DataFrame({"caseId": np.repeat(case_id, events),
                                           "day": generator.integers(0, 365, events.sum())}),
        "exposures_dataset_id": pd.DataFrame({"caseId": exposure_case, "drugId": generator.integers(1, 6, n_exposures),
                                              "start": exposure_start, "end": exposure_start + 20}),
    }


def _local_pipeline(tables: dict[str, pd.DataFrame]) -> dict:
    progress = LocalProgress()
    run_kind(get_kind("sccs_eras"), {"cases_dataset_id": "c", "events_dataset_id": "e", "exposures_dataset_id": "x",
                                     **ERAS}, local_context(device="cpu", datasets=tables, progress=progress))
    frames = {"outcomes_dataset_id": progress.artifacts["outcomes"],
              "covariates_dataset_id": progress.artifacts["covariates"]}
    return run_kind(get_kind("sccs_fit"), {"outcomes_dataset_id": "o", "covariates_dataset_id": "c", **FIT},
                    local_context(device="cpu", datasets=frames))


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[EmbeddedStack]:
    env = {"GPUEST_DATA_DIR": str(tmp_path), "GPUEST_DEVICE": "cpu", "GPUEST_QUEUE": f"test-{uuid.uuid4().hex[:8]}",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'gpuest.sqlite3'}",
           "BROKER_URL": f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}"}
    with embedded_stack(tmp_path, env=env, log_dir=tmp_path / "logs") as running:
        yield running


def _upload(client: httpx.Client, name: str, frame: pd.DataFrame) -> str:
    response = client.post("/v1/datasets", files={"file": (name, frame.to_csv(index=False).encode(), "text/csv")})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _run(client: httpx.Client, stack: EmbeddedStack, spec: dict) -> dict:
    response = client.post("/v1/jobs", json=spec)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    deadline = time.monotonic() + 120
    while (job := client.get(f"/v1/jobs/{job_id}").json())["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, stack.worker.log_tail()
        time.sleep(0.5)
    assert job["status"] == "succeeded", (job, stack.worker.log_tail())
    return job


@pytest.mark.slow
def test_eras_artifacts_feed_the_fit_without_a_download(stack: EmbeddedStack) -> None:
    tables = _person_tables()
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        ids = {field: _upload(client, f"{field}.csv", frame) for field, frame in tables.items()}
        eras = _run(client, stack, {"kind": "sccs_eras", "params": {**ids, **ERAS}})
        command = gpuest_in_process("datasets", "from-artifact", eras["id"], "outcomes", "--url", stack.base_url)
        assert command.returncode == 0, command.stderr
        with GpuestClient(stack.base_url) as python_client:
            covariates = python_client.dataset_from_artifact(eras["id"], "covariates", name="eras covariates")
        assert covariates["name"] == "eras covariates" and covariates["source_format"] == "artifact"
        registered = {"outcomes_dataset_id": command.stdout.strip(), "covariates_dataset_id": covariates["id"]}
        fit = _run(client, stack, {"kind": "sccs_fit", "params": {**registered, **FIT}})
        result = client.get(f"/v1/jobs/{fit['id']}/result").json()
        coefficients = pd.read_parquet(io.BytesIO(client.get(f"/v1/jobs/{fit['id']}/artifacts/coefficients").content))
    reference = _local_pipeline(tables)
    assert result["n_cases"] == reference["n_cases"] == 300 and result["n_covariates"] == 5
    served = np.array([c["estimate"] for c in result["coefficients"]])
    local = np.array([c["estimate"] for c in reference["coefficients"]])
    np.testing.assert_allclose(served, local, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(coefficients["estimate"].to_numpy(), local, rtol=1e-12, atol=1e-14)
