"""/metrics reports the work running on each device, as the workers advertise it on the job and chunk rows
(issue 19: one worker per GPU; a fanned-out job is counted by its chunks, on the devices they run on)."""

from __future__ import annotations

import pytest
from api_helpers import montecarlo_spec
from prometheus_client.parser import text_string_to_metric_families

from core.settings import get_settings
from store import chunks as chunk_store
from store import jobs as job_store
from store import work
from store.db import session_scope
from store.models import JobChunk

TOKEN = "operator-token-0123456789"
GPU0, GPU1 = "NVIDIA H100 80GB HBM3 (GPU 0)", "NVIDIA H100 80GB HBM3 (GPU 1)"


def running_gauge(client) -> dict[str, float]:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    return {sample.labels["device"]: sample.value for family in text_string_to_metric_families(response.text)
            for sample in family.samples if sample.name == "gpuest_running"}


@pytest.mark.both_backends
def test_metrics_count_running_jobs_and_chunks_by_device(client, alice, monkeypatch) -> None:
    monkeypatch.setenv("GPUEST_METRICS_TOKEN", TOKEN)
    get_settings.cache_clear()
    assert running_gauge(client) == {}
    # A third job stays queued: it runs nowhere yet.
    whole, fanned, _queued = (client.post("/v1/jobs", json=montecarlo_spec(seed=seed), headers=alice).json()["id"]
                              for seed in range(3))
    with session_scope() as session:
        assert job_store.claim(session, whole, worker="w0", device=GPU0)
        assert job_store.claim(session, fanned, worker="w1", device=GPU1)
        plans = [chunk_store.ChunkPlan({"size": 1}, {"done": True}), chunk_store.ChunkPlan({"size": 1}),
                 chunk_store.ChunkPlan({"size": 1})]
        ids = chunk_store.fan_out(session, fanned, worker="w1", group_id="g", device=GPU1, queue="gpu", chunks=plans)
    assert ids is not None
    with session_scope() as session:
        assert work.claim(session, JobChunk, ids[1], worker="w0b", device=GPU0)
        assert work.claim(session, JobChunk, ids[2], worker="w1b", device=GPU1)
    # The fanned-out job is not counted itself (no process holds it); its lead chunk has ended.
    assert running_gauge(client) == {GPU0: 2, GPU1: 1}
    with session_scope() as session:
        assert work.finish(session, JobChunk, ids[2], worker="w1b", status="succeeded", result={})
    assert running_gauge(client) == {GPU0: 2}
