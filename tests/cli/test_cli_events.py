"""`gpuest events JOB_ID` (issue 16): a job's log from GET /v1/jobs/{id}/events, one line per event oldest
first, or the API's objects with --json; an unknown job exits 1 with the API's problem."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from cli.serve import EmbeddedStack
from tests.cli.cli_helpers import TINY_PARAMS

runner = CliRunner()


def gpuest(stack: EmbeddedStack, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, [*args, "--url", stack.base_url])
    return result.exit_code, result.stdout, result.stderr


def test_events_print_the_jobs_log_in_order(stack: EmbeddedStack, tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"kind": "crve_montecarlo", "params": TINY_PARAMS}))
    code, stdout, stderr = gpuest(stack, "submit", str(spec), "--wait")
    assert code == 0, stdout + stderr
    job_id = stdout.splitlines()[0].strip()

    code, stdout, _ = gpuest(stack, "events", job_id, "--json")
    events = json.loads(stdout)
    assert code == 0 and events[0]["type"] == "submitted" and events[-1]["type"] == "succeeded"
    assert [event["id"] for event in events] == sorted(event["id"] for event in events)

    code, stdout, _ = gpuest(stack, "events", job_id)
    lines = stdout.splitlines()
    assert code == 0 and len(lines) == len(events)
    assert [line.split()[3] for line in lines] == [event["type"] for event in events]  # date, time, level, type
    assert lines[1].endswith("started on cpu (attempt 1)") and lines[-1].split()[2] == "info"


def test_events_of_an_unknown_job_exit_1(stack: EmbeddedStack) -> None:
    code, _, stderr = gpuest(stack, "events", "no-such-job")
    assert code == 1 and "no job with id 'no-such-job'" in stderr
