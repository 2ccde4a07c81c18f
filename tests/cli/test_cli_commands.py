"""The ``gpuest`` user commands and the Python client against a running embedded stack."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.client import ApiError, GpuestClient
from cli.main import app
from cli.serve import EmbeddedStack, free_port
from tests.cli.cli_helpers import LONG_PARAMS, TINY_PARAMS

runner = CliRunner()


def gpuest(stack: EmbeddedStack, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, [*args, "--url", stack.base_url])
    return result.exit_code, result.stdout, result.stderr


def write_spec(path: Path, params: dict[str, object], kind: str = "crve_montecarlo") -> Path:
    body = {"kind": kind, "params": params}
    path.write_text(yaml.safe_dump(body) if path.suffix in {".yaml", ".yml"} else json.dumps(body))
    return path


def test_submit_wait_status_result_and_list(stack: EmbeddedStack, tmp_path: Path) -> None:
    code, stdout, stderr = gpuest(stack, "submit", str(write_spec(tmp_path / "spec.yaml", TINY_PARAMS)), "--wait")
    assert code == 0, stdout + stderr
    job_id = stdout.splitlines()[0].strip()
    uuid.UUID(job_id)
    assert f"job {job_id} succeeded on cpu" in stdout

    code, stdout, _ = gpuest(stack, "status", job_id)
    job = json.loads(stdout)
    assert code == 0 and (job["status"], job["progress"], job["device"], job["params"]["seed"]) == (
        "succeeded", 1.0, "cpu", TINY_PARAMS["seed"]
    )

    out = tmp_path / "out.json"
    code, _, _ = gpuest(stack, "result", job_id, "-o", str(out))
    result = json.loads(out.read_text())
    assert code == 0 and set(result["rejection_rate"]) == {"0.01", "0.05", "0.10"}
    assert result["replications"] == TINY_PARAMS["replications"]

    code, stdout, _ = gpuest(stack, "jobs", "list", "--kind", "crve_montecarlo", "--status", "succeeded", "--json")
    assert code == 0 and job_id in {item["id"] for item in json.loads(stdout)["items"]}
    code, stdout, _ = gpuest(stack, "jobs", "list", "--status", "failed", "--json")
    assert code == 0 and job_id not in {item["id"] for item in json.loads(stdout)["items"]}
    code, stdout, _ = gpuest(stack, "jobs", "list")
    assert code == 0 and job_id[:8] in stdout


def test_cancel_a_running_job(stack: EmbeddedStack, tmp_path: Path) -> None:
    code, stdout, stderr = gpuest(stack, "submit", str(write_spec(tmp_path / "long.json", LONG_PARAMS)))
    assert code == 0, stdout + stderr
    job_id = stdout.strip()
    with GpuestClient(stack.base_url) as client:
        client.wait(job_id, timeout=120, poll_interval=0.1, until=lambda job: job["status"] != "queued")
        code, stdout, _ = gpuest(stack, "cancel", job_id)
        assert code == 0 and job_id in stdout
        job = client.wait(job_id, timeout=120, poll_interval=0.2)
    assert job["status"] == "cancelled", job


def test_a_bad_spec_exits_1_and_names_the_field(stack: EmbeddedStack, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "bad.json", {**TINY_PARAMS, "n_clusters": -3})
    code, stdout, stderr = gpuest(stack, "submit", str(spec))
    assert code == 1 and stdout == ""
    assert "HTTP 422" in stderr and "n_clusters" in stderr

    unknown = write_spec(tmp_path / "unknown.json", {}, kind="no_such_kind")
    code, _, stderr = gpuest(stack, "submit", str(unknown))
    assert code == 1 and "HTTP 422" in stderr and "kind" in stderr


def test_unknown_job_and_unreachable_service(stack: EmbeddedStack) -> None:
    code, _, stderr = gpuest(stack, "status", str(uuid.uuid4()))
    assert code == 1 and "HTTP 404" in stderr
    result = runner.invoke(app, ["status", "x", "--url", f"http://127.0.0.1:{free_port()}"])
    assert result.exit_code == 1 and "cannot reach" in result.stderr


def test_datasets_upload_list_delete(stack: EmbeddedStack, tmp_path: Path) -> None:
    csv = tmp_path / "panel.csv"
    csv.write_text("y,x1,cluster\n1.5,0.2,1\n2.5,0.1,1\n0.5,-0.3,2\n")
    code, stdout, stderr = gpuest(stack, "datasets", "upload", str(csv))
    assert code == 0, stdout + stderr
    dataset_id = stdout.strip()
    uuid.UUID(dataset_id)

    code, stdout, _ = gpuest(stack, "datasets", "list", "--json")
    (listed,) = [item for item in json.loads(stdout)["items"] if item["id"] == dataset_id]
    assert listed["n_rows"] == 3 and [column["name"] for column in listed["columns"]] == ["y", "x1", "cluster"]

    code, _, _ = gpuest(stack, "datasets", "delete", dataset_id)
    assert code == 0
    with GpuestClient(stack.base_url) as client, pytest.raises(ApiError) as missing:
        client.get_dataset(dataset_id)
    assert missing.value.status_code == 404

    empty = tmp_path / "empty.csv"
    empty.write_text("")
    code, stdout, stderr = gpuest(stack, "datasets", "upload", str(empty))
    assert code == 1 and stdout == "" and "empty" in stderr

    # Not named .csv or .parquet: the client does not claim a format, and the API refuses to guess.
    notes = tmp_path / "notes.yaml"
    notes.write_text("a: 1\nb: 2\n")
    code, stdout, stderr = gpuest(stack, "datasets", "upload", str(notes))
    assert code == 1 and stdout == "" and "cannot tell the format" in stderr


def test_client_idempotency_key_returns_the_same_job(stack: EmbeddedStack) -> None:
    key = str(uuid.uuid4())
    with GpuestClient(stack.base_url) as client:
        first = client.submit("crve_montecarlo", TINY_PARAMS, idempotency_key=key)
        again = client.submit("crve_montecarlo", TINY_PARAMS, idempotency_key=key)
        assert again["id"] == first["id"]
        with pytest.raises(ApiError) as reused:
            client.submit("crve_montecarlo", {**TINY_PARAMS, "seed": 99}, idempotency_key=key)
        assert reused.value.status_code == 422 and reused.value.problem["errors"]
        assert client.wait(first["id"], timeout=120, poll_interval=0.1)["status"] == "succeeded"
