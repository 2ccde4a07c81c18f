"""The dashboard and /docs over HTTP: security headers on every answer, the datasets page's alert only from a
fixed set of codes, the CSRF cookie renewed at sign-in and cleared at sign-out with the session, cookies Secure as
GPUEST_COOKIE_SECURE says, and a job page whose plot cannot be drawn still shown (with "Plot unavailable")."""

from __future__ import annotations

import re
from http.cookies import SimpleCookie
from typing import Any

import httpx
import pytest
from api_helpers import assert_problem
from fastapi.testclient import TestClient

import api.routes.plots as plot_routes
from core.settings import get_settings
from core.status import JobStatus
from store import jobs as job_store
from store.db import session_scope

ATTACK_NAME = "$\\foo$ drug"


def key_of(headers: dict[str, str]) -> str:
    return headers["Authorization"].removeprefix("Bearer ")


def set_cookies(response: httpx.Response) -> dict[str, Any]:
    """The response's Set-Cookie headers by cookie name (value and attributes)."""
    jar: dict[str, Any] = {}
    for header in response.headers.get_list("set-cookie"):
        parsed = SimpleCookie()
        parsed.load(header)
        for name, morsel in parsed.items():
            jar[name] = morsel
    return jar


def signed_in_client(client: TestClient, key: str) -> TestClient:
    client.cookies.set("gpuest_session", key)
    return client


@pytest.mark.parametrize("path", ["/ui/signin", "/docs", "/v1/jobs", "/static/dashboard.css", "/openapi.json"])
def test_every_answer_carries_the_security_headers(client: TestClient, path: str) -> None:
    answer = client.get(path)
    assert answer.status_code in (200, 401), answer.text
    policy = {
        directive.split()[0]: directive.split()[1:]
        for directive in answer.headers["content-security-policy"].split("; ")
    }
    assert policy["frame-ancestors"] == ["'none'"] and policy["script-src"] == ["'self'"]
    assert policy["object-src"] == ["'none'"] and policy["default-src"] == ["'self'"]
    assert answer.headers["x-frame-options"] == "DENY"
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["referrer-policy"] == "same-origin"


def test_docs_page_has_no_inline_script(client: TestClient) -> None:
    page = client.get("/docs").text
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page, flags=re.S)
    assert scripts and all('src="/static/' in attributes and not body.strip() for attributes, body in scripts)
    assert client.get("/static/docs.js").status_code == 200
    assert client.get("/static/swagger/swagger-ui-bundle.js").status_code == 200


def test_the_datasets_alert_is_a_fixed_message_never_the_links_text(client: TestClient, alice) -> None:
    client = signed_in_client(client, key_of(alice))
    planted = client.get("/ui/datasets", params={"error": "Your key expired: sign in again at evil.example"})
    assert planted.status_code == 200
    assert "evil.example" not in planted.text and 'id="datasets-error"' not in planted.text
    known = client.get("/ui/datasets", params={"error": "dataset-in-use"})
    assert 'id="datasets-error"' in known.text and "used by a queued or running job" in known.text


def test_sign_in_renews_the_csrf_cookie_and_sign_out_clears_both(client: TestClient, alice) -> None:
    first = client.get("/ui/signin")
    before = set_cookies(first)["gpuest_csrf"].value
    signed = client.post("/ui/signin", data={"api_key": key_of(alice), "csrf_token": before}, follow_redirects=False)
    assert signed.status_code == 303, signed.text
    cookies = set_cookies(signed)
    after = cookies["gpuest_csrf"].value
    assert cookies["gpuest_session"].value == key_of(alice)
    assert after and after != before
    assert cookies["gpuest_csrf"]["httponly"] and cookies["gpuest_csrf"]["samesite"] == "strict"
    client.cookies.set("gpuest_csrf", after)
    out = client.post("/ui/signout", data={"csrf_token": after}, follow_redirects=False)
    assert out.status_code == 303
    cleared = set_cookies(out)
    for name in ("gpuest_session", "gpuest_csrf"):
        assert cleared[name].value == "" and cleared[name]["max-age"] == "0", name


@pytest.mark.parametrize(
    ("setting", "scheme", "secure"),
    [("auto", "http", False), ("auto", "https", True), ("true", "http", True), ("false", "https", False)],
)
def test_cookies_are_secure_as_the_setting_says(
    app, monkeypatch: pytest.MonkeyPatch, setting: str, scheme: str, secure: bool
) -> None:
    monkeypatch.setenv("GPUEST_COOKIE_SECURE", setting)
    get_settings.cache_clear()
    with TestClient(app, base_url=f"{scheme}://testserver", raise_server_exceptions=False) as client:
        answer = client.get("/ui/signin")
    assert bool(set_cookies(answer)["gpuest_csrf"]["secure"]) is secure


def stored_sccs_fit(owner: str) -> str:
    """A succeeded sccs_fit job whose names table named a covariate with mathtext syntax."""
    result = {
        "kind": "sccs_fit",
        "coefficients": [
            {
                "covariate_id": 1,
                "name": ATTACK_NAME,
                "relative_incidence": 1.8,
                "relative_incidence_ci_lower": 1.2,
                "relative_incidence_ci_upper": 2.6,
            },
            {"covariate_id": 2, "name": "drug 2", "relative_incidence": 0.9},
        ],
    }
    with session_scope() as session:
        job, _ = job_store.create_job(session, owner=owner, kind="sccs_fit", params={}, dataset_ids={})
        job_id = job.id
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
            artifacts={},
        )
    return job_id


def test_a_mathtext_covariate_name_is_drawn_and_the_job_page_shows_it(client: TestClient, alice) -> None:
    job_id = stored_sccs_fit("alice")
    for fmt in ("svg", "png"):
        answer = client.get(f"/v1/jobs/{job_id}/plots/forest", params={"format": fmt}, headers=alice)
        assert answer.status_code == 200, answer.text
    assert ATTACK_NAME in client.get(f"/v1/jobs/{job_id}/plots/forest", headers=alice).text
    page = signed_in_client(client, key_of(alice)).get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200 and 'data-plot="forest"' in page.text and "Plot unavailable" not in page.text


def test_a_plot_that_fails_is_a_problem_and_the_page_says_plot_unavailable(
    client: TestClient, alice, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = stored_sccs_fit("alice")

    def failing(*_: Any, **__: Any) -> bytes:
        raise RuntimeError("matplotlib could not lay this figure out")

    monkeypatch.setattr(plot_routes, "render", failing)
    problem = assert_problem(client.get(f"/v1/jobs/{job_id}/plots/forest", headers=alice), 422)
    assert problem["type"].endswith("plot-unavailable") and "forest" in problem["detail"]
    assert "matplotlib" not in problem["detail"]
    page = signed_in_client(client, key_of(alice)).get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200
    assert 'id="plot-unavailable-forest"' in page.text and "Plot unavailable" in page.text
