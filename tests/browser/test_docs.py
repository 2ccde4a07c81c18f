"""/docs in headless Chromium: Swagger UI renders the service's OpenAPI 3.1 document from the package's local
files (no CDN), every operation of the document is listed, and an operation opened shows a job kind's example
request; no Content-Security-Policy violation on the way (the conftest's check)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from cli.serve import EmbeddedStack

HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def wait_for(condition: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except WebDriverException:
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture(scope="module")
def document(stack: EmbeddedStack) -> dict[str, Any]:
    answer = httpx.get(f"{stack.base_url}/openapi.json", timeout=30)
    assert answer.status_code == 200
    return answer.json()


def operations(document: dict[str, Any]) -> list[tuple[str, str]]:
    return [(method, path) for path, item in document["paths"].items() for method in item if method in HTTP_METHODS]


def test_docs_render_every_operation_of_the_openapi_31_document(
    browser: WebDriver, stack: EmbeddedStack, document: dict[str, Any], screenshots
) -> None:
    assert document["openapi"].startswith("3.1")
    expected = operations(document)
    assert len(expected) > 20
    browser.get(f"{stack.base_url}/docs")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".opblock"), 30, "Swagger UI's operations")
    assert not browser.find_elements(By.CSS_SELECTOR, ".errors-wrapper"), "Swagger UI reports errors"
    assert "Unable to render" not in browser.find_element(By.TAG_NAME, "body").text
    assert document["info"]["title"] in browser.find_element(By.CSS_SELECTOR, ".info .title").text
    rendered = [
        (
            block.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text.lower(),
            block.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path"),
        )
        for block in browser.find_elements(By.CSS_SELECTOR, ".opblock")
    ]
    assert sorted(rendered) == sorted(expected)
    screenshot = screenshots / "docs.png"
    assert browser.save_screenshot(str(screenshot))


def test_an_opened_operation_shows_a_kinds_example_request(browser: WebDriver, stack: EmbeddedStack) -> None:
    browser.get(f"{stack.base_url}/docs")
    operation = "#operations-jobs-create_job_v1_jobs_post"
    summary = wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, f"{operation} .opblock-summary-control"), 30, "POST /v1/jobs"
    )[0]
    assert not browser.find_elements(By.CSS_SELECTOR, f"{operation} .body-param__example")  # closed until clicked
    summary.click()
    example = wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, f"{operation} .body-param__example"),
        30,
        "the example request of POST /v1/jobs",
    )[0]
    text = example.get_attribute("textContent")
    assert '"kind": "crve_bootstrap"' in text and '"formula": "y ~ x1 + x2 + x3 | fe"' in text
