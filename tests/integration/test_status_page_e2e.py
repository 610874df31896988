"""The live status page in a real browser: headless Chromium (Debian's), driven by Selenium,
looking at a real orchestrator while real clients use it — what a person would see.

``REACTOR_FABRIC_SCREENSHOT=PATH`` keeps the page's screenshot there (docs/status-page.png
was made this way).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from tests.integration.harness import (
    Orchestrator,
    orchestrator_fixture,
    python2_client,
    python_client,
)

pytestmark = pytest.mark.integration

WAIT_SECONDS = 30


fabric = orchestrator_fixture(
    scope="module", service_fields={"everything": {"container_strategy": "fresh_per_call"}}
)


def wait_for(driver: webdriver.Chrome, condition: Any, what: str) -> Any:
    def attempt(driver: webdriver.Chrome) -> Any:
        try:
            return condition(driver)
        except StaleElementReferenceException:
            return False  # the page redrew the table meanwhile: look again

    return WebDriverWait(driver, WAIT_SECONDS, poll_frequency=0.2).until(attempt, what)


def rows(driver: webdriver.Chrome, table: str, **data: str) -> list[Any]:
    selector = f"#{table} tbody tr" + "".join(
        f'[data-{key}="{value}"]' for key, value in data.items()
    )
    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def console(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    """What the page logged since the last look (Selenium's get_log is untyped)."""
    entries: list[dict[str, Any]] = driver.get_log("browser")  # type: ignore[no-untyped-call]
    return entries


def problems_in_console(driver: webdriver.Chrome) -> list[str]:
    return [e["message"] for e in console(driver) if e["level"] == "SEVERE"]


def test_the_page_needs_the_token(fabric: Orchestrator, browser: webdriver.Chrome) -> None:
    browser.get(f"{fabric.http_url}/")
    assert "no token" in browser.find_element(By.TAG_NAME, "body").text
    browser.get(f"{fabric.http_url}/?token=wrong")
    assert "the token is wrong" in browser.find_element(By.TAG_NAME, "body").text


def test_a_session_appears_with_its_container_its_calls_show_with_their_outcome_and_it_goes(
    fabric: Orchestrator, browser: webdriver.Chrome
) -> None:
    console(browser)  # what earlier tests left
    browser.get(f"{fabric.http_url}/?token={fabric.token}")
    wait_for(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute(
        "data-refreshed"
    ), "the first refresh")  # fmt: skip
    assert "Reactor-Fabric" in browser.title
    client = python_client(f"{fabric.ws_url}/mcp/time", "--register", "[]")
    try:
        session = client.read_json()["result"]["sessionId"]
        [row] = wait_for(browser, lambda d: rows(d, "sessions", session=session), "the session")
        container = wait_for(
            browser,
            lambda d: d.find_elements(
                By.CSS_SELECTOR, f'#sessions tr[data-session="{session}"] [data-container]'
            ),
            "the session's container",
        )[0]
        assert container.text.startswith("time ")
        assert client.ask({"op": "initialize"})["ok"]
        answer = client.ask(
            {"op": "call", "name": "get_current_time", "arguments": {"timezone": "UTC"}}
        )
        assert answer["ok"], answer
        failed = client.ask(
            {"op": "call", "name": "get_current_time", "arguments": {"timezone": "Nowhere/Bad"}}
        )
        assert not failed["ok"]
        [ok] = wait_for(
            browser,
            lambda d: rows(d, "calls", session=session, tool="get_current_time", outcome="ok"),
            "the successful call",
        )
        cells = [cell.text for cell in ok.find_elements(By.TAG_NAME, "td")]
        assert cells[2:5] == ["time", "get_current_time", "ok"]
        outcome = ok.find_elements(By.TAG_NAME, "td")[4]
        assert outcome.get_attribute("class") == "outcome-ok"
        assert outcome.value_of_css_property("color") == "rgba(26, 127, 55, 1)"  # green
        wait_for(
            browser,
            lambda d: rows(d, "calls", session=session, outcome="error"),
            "the failed call",
        )
        # Filtering by tool hides what does not match, then shows it again.
        tool_filter = browser.find_element(By.ID, "filter-tool")
        tool_filter.send_keys("no_such_tool")
        wait_for(browser, lambda d: not rows(d, "calls", session=session), "the filter")
        tool_filter.clear()
        tool_filter.send_keys(" ")  # an input event, with nothing left to filter on
        wait_for(browser, lambda d: rows(d, "calls", session=session), "the filter cleared")
        # The charts have drawn the calls and the container start.
        wait_for(
            browser,
            lambda d: (
                d.find_elements(By.CSS_SELECTOR, "#chart-rate path")
                and d.find_elements(By.CSS_SELECTOR, "#chart-starts rect")
                and d.find_elements(By.CSS_SELECTOR, "#chart-latency circle")
            ),
            "the charts",
        )
        screenshot = os.environ.get("REACTOR_FABRIC_SCREENSHOT")
        if screenshot:
            browser.save_screenshot(screenshot)
    finally:
        assert client.close() == 0
    wait_for(browser, lambda d: not rows(d, "sessions", session=session), "the session's end")
    assert row is not None
    assert problems_in_console(browser) == []  # nothing the content security policy blocked


def test_the_page_shows_which_container_served_each_call_of_a_per_call_service(
    fabric: Orchestrator, browser: webdriver.Chrome
) -> None:
    console(browser)  # what earlier tests left
    browser.get(f"{fabric.http_url}/?token={fabric.token}")
    client = python2_client(f"{fabric.http_url}/mcp?tools=all", "legacy")
    try:
        assert client.ask({"op": "initialize"})["server"] == "reactor-fabric"
        status = client.ask({"op": "call", "name": "get_status", "arguments": {}})
        session = status["structured"]["session_id"]
        for n in range(2):
            echo = {"op": "call", "name": "everything__echo", "arguments": {"message": f"m{n}"}}
            assert client.ask(echo)["ok"]

        def served(driver: webdriver.Chrome) -> list[str]:
            selector = f'#sessions tr[data-session="{session}"] [data-served]'
            shown = [e.text for e in driver.find_elements(By.CSS_SELECTOR, selector)]
            return shown if len(shown) == 2 and all("call_done" in t for t in shown) else []

        first, second = wait_for(browser, served, "two per-call containers, each ended")
        for sequence, line in ((1, first), (2, second)):
            # "everything #1 rf-everything-… ended (call_done): echo #2"
            assert line.startswith(f"everything #{sequence} rf-everything-"), line
            assert "ended (call_done): echo #" in line, line
        assert first.split()[2] != second.split()[2]  # two containers
    finally:
        client.close()
    assert problems_in_console(browser) == []


def test_an_operator_ends_a_session_from_the_page(
    fabric: Orchestrator, browser: webdriver.Chrome
) -> None:
    console(browser)  # what earlier tests left
    browser.get(f"{fabric.http_url}/?token={fabric.token}")
    client = python2_client(f"{fabric.http_url}/mcp", "legacy")
    try:
        assert client.ask({"op": "initialize"})["ok"]
        status = client.ask({"op": "call", "name": "get_status", "arguments": {}})
        session = str(status["structured"]["session_id"])
        [row] = wait_for(browser, lambda d: rows(d, "sessions", session=session), "the session")
        assert "fabric" in row.text
        row.find_element(By.TAG_NAME, "button").click()
        browser.switch_to.alert.accept()
        wait_for(browser, lambda d: not rows(d, "sessions", session=session), "its end")
    finally:
        client.close()
    assert problems_in_console(browser) == []


def test_the_screenshot_in_the_docs_exists() -> None:
    shot = Path(__file__).resolve().parents[2] / "docs" / "status-page.png"
    assert shot.exists()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
