"""Plots over HTTP: each kind's example job (run on NumPy, stored through the store calls the worker makes)
offers its plots, each one renders as SVG (text kept as text: the axis labels are checked) and PNG; unknown
names, another owner's job and a job that has not succeeded are refused with problems."""

from __future__ import annotations

import functools
import xml.etree.ElementTree as ElementTree
from typing import Any

import numpy as np
import pytest
from api_helpers import assert_problem, montecarlo_spec
from fastapi.testclient import TestClient

from core.status import JobStatus
from kernels.context import local_context, run_kind
from kernels.progress import LocalProgress
from kernels.registry import registry
from store import jobs as job_store
from store.artifacts import save_artifact
from store.db import session_scope

SVG_NAMESPACE = "{http://www.w3.org/2000/svg}"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# kind -> plot -> texts its SVG must hold (axis labels with units, and a figure from the job's own result)
EXPECTED: dict[str, dict[str, tuple[str, ...]]] = {
    "crve_bootstrap": {"bootstrap_t": ("t statistic (standard errors)", "bootstrap draws (count)", "observed t = ")},
    "crve_montecarlo": {"rejection_rates": ("nominal level (%)", "rejection rate (%)")},
    "sccs_fit": {
        "forest": ("relative incidence (ratio, log scale) with 95 % interval", "drug 1"),
        "cv_curve": ("prior variance (coefficient units squared, log scale)", "held-out predictive log-likelihood"),
        "bootstrap": ("bootstrap relative incidence (ratio, log scale)",),
    },
    "ks_solve": {
        "den_haan": ("aggregate capital (model units)", "period (quarters)"),
        "alm_scatter": ("ln K today (log model units)", "ln K next period (log model units)"),
        "policy": ("individual capital (model units) k", "next-period capital (model units) k'"),
    },
    "dualcontrol_solve": {"slices": ("state x (units of x)", "value V (expected discounted loss)", "myopic")},
    "sccs_eras": {},
}


@functools.cache
def example_run(kind_name: str, profiled: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """The kind's example run once on NumPy: its result JSON and its artifacts (``profiled``: an SCCS fit with
    profile-likelihood intervals of every covariate)."""
    kind = registry()[kind_name]
    progress = LocalProgress()
    ctx = local_context(device="cpu", datasets=kind.example.frames(), progress=progress)
    params = {**kind.example.params, "profile": {}} if profiled else kind.example.params
    return run_kind(kind, params, ctx), dict(progress.artifacts)


def stored_job(owner: str, kind_name: str, *, skip_artifacts: tuple[str, ...] = (), profiled: bool = False) -> str:
    """A succeeded job of the kind holding its example's result and artifacts, stored as the worker stores
    them; returns its id."""
    result, artifacts = example_run(kind_name, profiled)
    with session_scope() as session:
        job, _ = job_store.create_job(session, owner=owner, kind=kind_name, params={}, dataset_ids={})
        job_id = job.id
    references = {
        name: save_artifact(job_id, name, value) for name, value in artifacts.items() if name not in skip_artifacts
    }
    with session_scope() as session:
        assert job_store.claim(session, job_id, worker="test-worker", device="cpu")
    with session_scope() as session:
        assert job_store.finish(
            session,
            job_id,
            worker="test-worker",
            status=JobStatus.SUCCEEDED,
            result=result,
            timings={"run": 0.01},
            artifacts=references,
        )
    return job_id


def svg_texts(body: bytes) -> list[str]:
    root = ElementTree.fromstring(body)
    assert root.tag == f"{SVG_NAMESPACE}svg"
    return ["".join(element.itertext()) for element in root.iter(f"{SVG_NAMESPACE}text")]


@pytest.mark.parametrize("kind_name", sorted(EXPECTED))
def test_every_plot_of_each_kind_renders_with_labelled_axes(client: TestClient, alice, kind_name: str) -> None:
    job_id = stored_job("alice", kind_name)
    listed = client.get(f"/v1/jobs/{job_id}/plots", headers=alice)
    assert listed.status_code == 200, listed.text
    assert [entry["name"] for entry in listed.json()] == list(EXPECTED[kind_name])
    for entry in listed.json():
        assert entry["href"] == f"/v1/jobs/{job_id}/plots/{entry['name']}" and entry["title"]
        svg = client.get(entry["href"], headers=alice)
        assert svg.status_code == 200, svg.text
        assert svg.headers["content-type"] == "image/svg+xml"
        texts = svg_texts(svg.content)
        for expected in EXPECTED[kind_name][entry["name"]]:
            assert any(expected in text for text in texts), (entry["name"], expected, texts)
        png = client.get(entry["href"], params={"format": "png"}, headers=alice)
        assert png.status_code == 200 and png.headers["content-type"] == "image/png"
        assert png.content.startswith(PNG_SIGNATURE) and len(png.content) > 5_000


def test_bootstrap_plot_shows_this_jobs_statistic_and_p_value(client: TestClient, alice) -> None:
    job_id = stored_job("alice", "crve_bootstrap")
    result, _ = example_run("crve_bootstrap")
    texts = svg_texts(client.get(f"/v1/jobs/{job_id}/plots/bootstrap_t", headers=alice).content)
    assert any(f"observed t = {result['t_stat']:.3f}" in text for text in texts)
    assert any(f"p = {result['p_value']:.4f}" in text for text in texts)
    assert any(f"bootstrap t* ({result['reps_used']:,})" in text for text in texts)


@pytest.mark.slow
def test_an_sccs_fit_with_profile_intervals_draws_its_profiles(client: TestClient, alice) -> None:
    job_id = stored_job("alice", "sccs_fit", profiled=True)
    names = [entry["name"] for entry in client.get(f"/v1/jobs/{job_id}/plots", headers=alice).json()]
    assert names == ["forest", "cv_curve", "bootstrap", "profile"]
    result, _ = example_run("sccs_fit", True)
    texts = svg_texts(client.get(f"/v1/jobs/{job_id}/plots/profile", headers=alice).content)
    assert any("deviance is below 3.84" in text for text in texts)
    assert sum("log relative incidence b" in text for text in texts) == min(
        12, len(result["coefficients"]))
    assert any(result["coefficients"][0]["name"] in text for text in texts)


@pytest.mark.slow
def test_dual_control_slices_at_a_chosen_state_and_refused_options(client: TestClient, alice) -> None:
    job_id = stored_job("alice", "dualcontrol_solve")
    _, artifacts = example_run("dualcontrol_solve")
    mu_nodes, sigma_nodes = np.asarray(artifacts["grid"]["mu"]), np.asarray(artifacts["grid"]["sigma"])
    (entry,) = client.get(f"/v1/jobs/{job_id}/plots", headers=alice).json()
    assert [option["name"] for option in entry["options"]] == ["mu", "sigma"]
    # off the grid's nodes: the slice is at the nearest node, and the title says which
    mu, sigma = 0.3 * mu_nodes[1] + 0.7 * mu_nodes[2], sigma_nodes[-1] - 1e-9
    answer = client.get(entry["href"], params={"mu": mu, "sigma": sigma}, headers=alice)
    assert answer.status_code == 200, answer.text
    title = f"Slices over x at mu = {mu_nodes[2]:.3g}, Sigma = {sigma_nodes[-1]:.3g} (grid node nearest the chosen"
    assert any(title in text for text in svg_texts(answer.content))
    assert answer.content != client.get(entry["href"], headers=alice).content
    refused = {
        "mu": ({"mu": float(mu_nodes.max()) + 1.0}, "outside this job's grid"),
        "sigma": ({"sigma": "nan"}, "must be a finite number"),
        "x": ({"x": "1"}, "has no option 'x' (its options: mu, sigma)"),
    }
    for option, (query, message) in refused.items():
        problem = assert_problem(client.get(entry["href"], params=query, headers=alice), 422)
        assert message in problem["detail"]
        assert problem["errors"][0]["field"] == option and problem["errors"][0]["location"] == "query"
    other = stored_job("alice", "crve_montecarlo")
    problem = assert_problem(
        client.get(f"/v1/jobs/{other}/plots/rejection_rates", params={"mu": 1}, headers=alice), 422
    )
    assert "its options: none" in problem["detail"]


def test_same_job_renders_the_same_svg(client: TestClient, alice) -> None:
    job_id = stored_job("alice", "crve_montecarlo")
    first = client.get(f"/v1/jobs/{job_id}/plots/rejection_rates", headers=alice).content
    assert client.get(f"/v1/jobs/{job_id}/plots/rejection_rates", headers=alice).content == first


def test_a_plot_whose_artifact_was_not_saved_is_not_offered(client: TestClient, alice) -> None:
    job_id = stored_job("alice", "ks_solve", skip_artifacts=("den_haan_path",))
    names = [entry["name"] for entry in client.get(f"/v1/jobs/{job_id}/plots", headers=alice).json()]
    assert names == ["alm_scatter", "policy"]
    problem = assert_problem(client.get(f"/v1/jobs/{job_id}/plots/den_haan", headers=alice), 404)
    assert "den_haan" in problem["detail"]


def test_unknown_plot_another_owner_and_a_bad_format_are_refused(client: TestClient, alice, bob) -> None:
    job_id = stored_job("alice", "crve_montecarlo")
    problem = assert_problem(client.get(f"/v1/jobs/{job_id}/plots/forest", headers=alice), 404)
    assert problem["type"].endswith("plot-not-found") and "forest" in problem["detail"]
    for path in (f"/v1/jobs/{job_id}/plots", f"/v1/jobs/{job_id}/plots/rejection_rates"):
        assert assert_problem(client.get(path, headers=bob), 404)["type"].endswith("job-not-found")
    bad_format = assert_problem(
        client.get(f"/v1/jobs/{job_id}/plots/rejection_rates", params={"format": "gif"}, headers=alice), 422
    )
    assert "format" in str(bad_format["errors"])


def test_a_job_that_has_not_succeeded_has_no_plots_yet(client: TestClient, alice) -> None:
    job = client.post("/v1/jobs", json=montecarlo_spec(), headers=alice).json()
    for path in (f"/v1/jobs/{job['id']}/plots", f"/v1/jobs/{job['id']}/plots/rejection_rates"):
        problem = assert_problem(client.get(path, headers=alice), 409)
        assert problem["job_status"] == "queued" and "queued" in problem["detail"]
