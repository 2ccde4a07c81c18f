"""The dashboard end to end in headless Chromium: sign in, upload a dataset, submit from the generated form
(a bad value is shown on its field), watch the job to success, see its plots inline, cancel a running job,
another owner's job answers 404, sign out. Screenshots of the main pages go to the run's temporary directory,
or to docs/screenshots/ (which the README shows) with GPUEST_REFRESH_SCREENSHOTS=1."""

from __future__ import annotations

import csv
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from cli.serve import EmbeddedStack
from tests.cli.cli_helpers import LONG_PARAMS


def wait_for(condition: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except WebDriverException:  # the page reloaded under us (stale or detached element)
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def screenshot(browser: WebDriver, directory: Path, name: str) -> None:
    assert browser.save_screenshot(str(directory / f"{name}.png")), f"no screenshot {name}"


def panel_csv(path: Any) -> None:
    """The README's walk-through data: 30 clusters of 20 rows."""
    rng = np.random.default_rng(7)
    cluster = np.repeat(np.arange(30), 20)
    x1 = rng.normal(size=cluster.size) + rng.normal(size=30)[cluster]
    x2 = rng.normal(size=cluster.size)
    y = 1.0 + 0.5 * x2 + rng.normal(size=30)[cluster] + rng.normal(size=cluster.size)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["y", "x1", "x2", "cluster"])
        writer.writerows(zip(y, x1, x2, cluster, strict=True))


def sign_in(browser: WebDriver, stack: EmbeddedStack, key: str) -> None:
    browser.get(f"{stack.base_url}/ui/signin")
    field = browser.find_element(By.ID, "api_key")
    field.clear()
    field.send_keys(key)
    browser.find_element(By.ID, "signin").click()
    wait_for(lambda: browser.current_url.endswith("/ui/jobs"), 15, "the jobs page after sign-in")


def set_field(browser: WebDriver, name: str, value: str) -> None:
    field = browser.find_element(By.ID, f"param-{name}")
    field.clear()
    field.send_keys(value)


def click_and_load(browser: WebDriver, button_id: str) -> None:
    """Click a form's button and wait until the page it submits to has replaced this one."""
    button = browser.find_element(By.ID, button_id)
    button.click()
    WebDriverWait(browser, 30).until(lambda _: detached(button))


def detached(element: WebElement) -> bool:
    """Whether ``element`` has left the document. Selenium's ``staleness_of`` expects a stale-element error; while
    the next page replaces the document chromedriver may instead answer that the node "does not belong to the
    document" (a WebDriverException): the same fact, seen mid-navigation."""
    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        if "does not belong to the document" in str(exc):
            return True
        raise
    return False


def job_status(browser: WebDriver) -> str:
    return browser.find_element(By.ID, "job-status").text


@pytest.fixture(scope="module")
def signed_in(browser: WebDriver, stack: EmbeddedStack, keys: dict[str, str], screenshots: Path) -> WebDriver:
    browser.get(f"{stack.base_url}/ui/jobs")
    assert browser.current_url.endswith("/ui/signin"), "a visitor without a session is sent to sign in"
    screenshot(browser, screenshots, "signin")
    browser.find_element(By.ID, "api_key").send_keys("gpe_not-a-key")
    click_and_load(browser, "signin")
    assert "not valid" in browser.find_element(By.ID, "api_key-error").text
    sign_in(browser, stack, keys["alice"])
    cookie = browser.get_cookie("gpuest_session")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    return browser


def test_upload_submit_watch_and_plots(signed_in: WebDriver, stack: EmbeddedStack, tmp_path, screenshots: Path) -> None:
    browser = signed_in
    data = tmp_path / "panel.csv"
    panel_csv(data)
    browser.get(f"{stack.base_url}/ui/datasets")
    browser.find_element(By.ID, "upload-file").send_keys(str(data))
    browser.find_element(By.ID, "upload").click()
    section = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "section.dataset"), 30, "the uploaded dataset")[0]
    assert "panel.csv" in section.text and "600 rows" in section.text
    headers = [cell.text for cell in section.find_elements(By.CSS_SELECTOR, "table.preview thead th")]
    assert headers == ["y", "x1", "x2", "cluster"]
    assert len(section.find_elements(By.CSS_SELECTOR, "table.preview tbody tr")) == 10
    screenshot(browser, screenshots, "datasets")

    browser.get(f"{stack.base_url}/ui/submit?kind=crve_bootstrap")
    assert "y ~ x1 + x2 + x3 | fe" in browser.find_element(By.ID, "param-formula").get_attribute("value")
    browser.find_element(By.ID, "param-synthetic").clear()
    Select(browser.find_element(By.ID, "param-dataset_id")).select_by_index(1)
    set_field(browser, "formula", "y ~ x1 + x2")
    set_field(browser, "reps", "-5")
    click_and_load(browser, "submit")
    error = browser.find_element(By.ID, "error-reps")
    assert "greater than" in error.text
    assert "invalid" in browser.find_element(By.ID, "field-reps").get_attribute("class")
    assert browser.find_element(By.ID, "param-formula").get_attribute("value") == "y ~ x1 + x2"  # kept
    screenshot(browser, screenshots, "submit-field-error")

    set_field(browser, "reps", "999")
    click_and_load(browser, "submit")
    wait_for(lambda: "/ui/jobs/" in browser.current_url, 15, "the job page")
    wait_for(
        lambda: browser.find_elements(By.ID, "job-status") and job_status(browser) == "succeeded",
        90,
        "the job to succeed (the page polls and reloads)",
    )
    figure = browser.find_element(By.CSS_SELECTOR, 'figure[data-plot="bootstrap_t"]')
    svg = figure.find_element(By.TAG_NAME, "svg")
    assert svg.size["width"] > 300 and svg.size["height"] > 150
    texts = [node.get_attribute("textContent") for node in svg.find_elements(By.CSS_SELECTOR, "text")]
    assert any("t statistic (standard errors)" in text for text in texts)
    assert any("bootstrap draws (count)" in text for text in texts)
    assert len(svg.find_elements(By.CSS_SELECTOR, "path")) > 20  # bars, axes and ticks drawn
    result_table = browser.find_element(By.ID, "result").text
    assert "p_value" in result_table and "conf_int" in result_table
    screenshot(browser, screenshots, "job")

    browser.get(f"{stack.base_url}/ui/jobs?kind=crve_bootstrap")
    rows = browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr[data-job]")
    assert len(rows) == 1 and "succeeded" in rows[0].text
    screenshot(browser, screenshots, "jobs")


def test_cancel_a_running_job(signed_in: WebDriver, stack: EmbeddedStack) -> None:
    browser = signed_in
    browser.get(f"{stack.base_url}/ui/submit?kind=crve_montecarlo")
    for name, value in LONG_PARAMS.items():
        set_field(browser, name, str(value))
    set_field(browser, "replications", "100000")
    click_and_load(browser, "submit")
    wait_for(lambda: "/ui/jobs/" in browser.current_url, 15, "the job page")
    wait_for(lambda: job_status(browser) == "running", 60, "the job to start (live status)")
    click_and_load(browser, "cancel")
    wait_for(
        lambda: browser.find_elements(By.ID, "job-status") and job_status(browser) == "cancelled", 60, "the job to stop"
    )
    assert not browser.find_elements(By.ID, "cancel")


def test_another_owners_job_answers_404(signed_in: WebDriver, stack: EmbeddedStack, keys: dict[str, str]) -> None:
    browser = signed_in
    bobs = httpx.post(
        f"{stack.base_url}/v1/jobs",
        headers={"Authorization": f"Bearer {keys['bob']}"},
        json={
            "kind": "crve_montecarlo",
            "params": {"n_clusters": 10, "cluster_size": 5, "n_regressors": 2, "replications": 20},
        },
    )
    assert bobs.status_code == 202
    url = f"{stack.base_url}/ui/jobs/{bobs.json()['id']}"
    browser.get(url)
    assert browser.find_element(By.TAG_NAME, "h1").text == "Not found"
    as_alice = httpx.get(url, cookies={"gpuest_session": keys["alice"]})
    assert as_alice.status_code == 404
    as_bob = httpx.get(url, cookies={"gpuest_session": keys["bob"]})
    assert as_bob.status_code == 200 and "crve_montecarlo" in as_bob.text


def focused(browser: WebDriver) -> Any:
    return browser.switch_to.active_element


def test_keyboard_only(signed_in: WebDriver, stack: EmbeddedStack) -> None:
    # Tab from the top of a page: the skip link first, then the main navigation, each with a visible focus
    # ring; Enter follows a link and submits a form; no mouse anywhere.
    browser = signed_in
    browser.get(f"{stack.base_url}/ui/jobs")
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.TAB)
    assert focused(browser).text == "Skip to content"
    assert focused(browser).value_of_css_property("outline-style") == "solid"
    order = []
    for _ in range(4):
        focused(browser).send_keys(Keys.TAB)
        order.append(focused(browser).text)
    assert order == ["Jobs", "Submit", "Datasets", "API docs"]
    assert focused(browser).value_of_css_property("outline-style") == "solid"
    focused(browser).send_keys(Keys.SHIFT, Keys.TAB)  # back to Datasets
    focused(browser).send_keys(Keys.SHIFT, Keys.TAB)  # and to Submit
    link = focused(browser)
    link.send_keys(Keys.ENTER)
    WebDriverWait(browser, 30).until(lambda _: detached(link))
    assert browser.current_url.endswith("/ui/submit")
    # the kind chooser and the generated form are reached and sent by keyboard: a bad value comes back on its
    # field, and the field keeps the typed text
    browser.get(f"{stack.base_url}/ui/submit?kind=crve_montecarlo")
    field = browser.find_element(By.ID, "param-replications")
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys("0")
    field.send_keys(Keys.ENTER)  # Enter in a text field submits its form
    WebDriverWait(browser, 30).until(lambda _: detached(field))
    assert "greater than" in browser.find_element(By.ID, "error-replications").text
    assert browser.find_element(By.ID, "param-replications").get_attribute("value") == "0"


def test_sign_out(signed_in: WebDriver, stack: EmbeddedStack) -> None:
    browser = signed_in
    browser.get(f"{stack.base_url}/ui/jobs")
    browser.find_element(By.ID, "signout").click()
    wait_for(lambda: browser.current_url.endswith("/ui/signin"), 15, "the sign-in page")
    assert browser.get_cookie("gpuest_session") is None
    browser.get(f"{stack.base_url}/ui/datasets")
    assert browser.current_url.endswith("/ui/signin")
