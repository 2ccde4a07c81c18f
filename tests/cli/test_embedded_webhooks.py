"""Webhooks on the embedded stack as real processes (issue 16): `gpuest serve`'s API takes a job with a
callback_url, its worker runs the job and then POSTs the signed body to a receiver on 127.0.0.1; the first
answer is a 503, so the delivery is retried after the backoff; the Python client and `gpuest submit` pass the
callback_url on."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from cli.client import GpuestClient
from cli.serve import embedded_stack
from tests.cli.cli_helpers import TINY_PARAMS, run_gpuest, sqlite_env
from tests.webhook_receiver import Receiver


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.slow
def test_the_embedded_worker_delivers_a_signed_webhook_and_retries_a_failing_receiver(tmp_path: Path) -> None:
    receiver = Receiver([503, 200])
    env = sqlite_env(tmp_path, GPUEST_WEBHOOK_BACKOFF_SECONDS="1", GPUEST_WEBHOOK_INTERVAL_SECONDS="0.2")
    try:
        with embedded_stack(tmp_path, env=env, log_dir=tmp_path / "logs") as stack, GpuestClient(
            stack.base_url
        ) as client:
            job_id = client.submit("crve_montecarlo", TINY_PARAMS, callback_url=receiver.url)["id"]
            client.wait(job_id, timeout=120, poll_interval=0.1)
            wait_for(lambda: client.get_job(job_id)["callback"]["status"] == "delivered", 60, "the delivery")
            job = client.get_job(job_id)
            secret = httpx.get(f"{stack.base_url}/v1/webhooks/secret").json()["secret"]
            # the CLI passes a spec file's callback_url on (a loopback target: no receiver call is awaited)
            spec = tmp_path / "spec.json"
            spec.write_text(json.dumps({"kind": "crve_montecarlo", "params": TINY_PARAMS,
                                        "callback_url": "http://127.0.0.1:9/never"}))
            submitted = run_gpuest("submit", str(spec), "--url", stack.base_url, env=env)
            assert submitted.returncode == 0, submitted.stderr
            cli_job = client.get_job(submitted.stdout.strip())
    finally:
        receiver.close()
    assert cli_job["callback"]["url"] == "http://127.0.0.1:9/never"
    log = job["callback"]["attempt_log"]
    assert [(entry["status_code"], entry["error"]) for entry in log] == [(503, "HTTP 503"), (200, None)]
    gap = (datetime.fromisoformat(log[1]["at"]) - datetime.fromisoformat(log[0]["at"])).total_seconds()
    assert gap >= 1.0
    for _, headers, raw in receiver.requests:
        message = headers["x-gpuest-timestamp"].encode() + b"." + raw
        assert headers["x-gpuest-signature"] == "sha256=" + hmac.new(secret.encode(), message,
                                                                     hashlib.sha256).hexdigest()
    body = json.loads(receiver.requests[-1][2])
    assert (body["id"], body["status"], body["event"]) == (job_id, "succeeded", "job.finished")
