"""The dashboard in a real browser: Debian's chromium and chromedriver driven by Selenium against a real
embedded stack (uvicorn + Celery worker processes, auth on). Skipped, with the reason, without them.

Screenshots go to the run's temporary directory; GPUEST_REFRESH_SCREENSHOTS=1 asks for docs/screenshots/
(the README shows them) to be rewritten instead."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.serve import EmbeddedStack, embedded_stack
from tests.cli.cli_helpers import gpuest_in_process, sqlite_env

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
DOCS_SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    missing = [name for name, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)) if path is None]
    for item in items:
        if "tests/browser/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.browser)
            if missing:
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"{' and '.join(missing)} not installed (apt-get install chromium chromium-driver)"
                    )
                )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    data_dir = tmp_path_factory.mktemp("dashboard")
    env = sqlite_env(data_dir, GPUEST_AUTH_ENABLED="true")
    with embedded_stack(data_dir, env=env, log_dir=data_dir / "logs") as running:
        yield running


@pytest.fixture(scope="module")
def keys(stack: EmbeddedStack) -> dict[str, str]:
    """An API key for each of two owners, made with the admin command a user runs."""
    made = {}
    for owner in ("alice", "bob"):
        answer = gpuest_in_process("keys", "--data-dir", str(stack.data_dir), "create", owner, env=stack.env)
        assert answer.returncode == 0, answer.stderr
        made[owner] = answer.stdout.strip().split()[-1]
    return made


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: docs/screenshots/ only when GPUEST_REFRESH_SCREENSHOTS=1 asks for it."""
    if os.environ.get("GPUEST_REFRESH_SCREENSHOTS") == "1":
        DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        return DOCS_SCREENSHOTS
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1366,900"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, read by no_csp_violation
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def csp_violations(browser: Any) -> list[str]:
    """The console's Content-Security-Policy reports since the last call (reading the log empties it)."""
    return [
        str(entry.get("message", ""))
        for entry in browser.get_log("browser")
        if "Content Security Policy" in str(entry.get("message", ""))
    ]


@pytest.fixture(autouse=True)
def no_csp_violation(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every page a browser test opened ran under the service's Content-Security-Policy without a violation:
    what the pages and Swagger UI load and run is what the policy allows."""
    if "browser" not in request.fixturenames:
        yield
        return
    browser = request.getfixturevalue("browser")
    csp_violations(browser)  # the log so far belongs to earlier tests
    yield
    assert csp_violations(browser) == []
