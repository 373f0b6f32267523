"""Every page and action of the dashboard in a real browser: Debian's headless Chromium
(through Debian's chromedriver, nothing downloaded), against ``akadze dashboard`` and an
``akadze worker`` subprocess on a real database. Screenshots of each page are saved (the
folder is printed; ``$AKADZE_ARTIFACTS/dashboard`` when set). Skips with one line where no
browser is installed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest

from akadze_core import Every
from tests.dashboard.dash_app import build_app
from tests.dashboard.support import artifacts_dir, chromium, dashboard, worker
from tests.dashboard.test_http import IMG, SCRIPT, wait_state, with_password

pytestmark = pytest.mark.slow

TOKEN = "tok-" + "x" * 24


def _until(check: Any, what: str, timeout: float = 20.0) -> Any:
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
    )

    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except (NoSuchElementException, StaleElementReferenceException):
            # The page was replaced between finding an element and reading it, or the next
            # page has not rendered its element yet (a redirect still loading).
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_every_page_and_action_in_chromium(
        database_url: str, db: psycopg.Connection, tmp_path: Path) -> None:
    with chromium() as browser:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select

        shots = artifacts_dir(tmp_path)
        print(f"\nscreenshots in {shots}")
        url = with_password(database_url)
        app = build_app(url)
        try:
            echo, boom = app.tasks["echo"], app.tasks["boom"]
            hostile_ok = echo.enqueue(payload={"script": SCRIPT, "img": IMG})
            hostile_failed = boom.enqueue(payload=SCRIPT + IMG)
            bulk_failed = [boom.enqueue(payload=f"bulk {i}") for i in range(3)]
            flow = app.workflow()
            first = flow.add(echo.configure(queue="parked"), payload="step 1")
            second = flow.add(echo.configure(queue="parked"), after=first, payload="step 2")
            flow.enqueue()
            parked_cancel = echo.configure(queue="parked").enqueue(payload="cancel me")
            purged = [echo.configure(queue="purge-me").enqueue(payload=i) for i in range(4)]
            bulk_cancel = [echo.configure(queue="bulk-cancel").enqueue(payload=i)
                           for i in range(5)]
            app.runtime_schedules.add("every-minute", "echo", trigger=Every(60),
                                      args={"payload": "tick"})
        finally:
            app.close()
        with worker(url, tmp_path, "--queue", "default", "--slots", "4"):
            for job_id in (hostile_ok, hostile_failed, *bulk_failed):
                wait_state(db, job_id, "succeeded", "failed")
            enqueuer = build_app(url)
            try:
                slow_id = enqueuer.tasks["slow"].enqueue(seconds=30)
            finally:
                enqueuer.close()
            wait_state(db, slow_id, "running")
            with dashboard(url, tmp_path, "--token", TOKEN, "--app",
                           "tests.dashboard.dash_app:app") as served:
                base = served.base

                def shot(name: str) -> None:
                    browser.save_screenshot(str(shots / f"{name}.png"))

                def notice() -> str:
                    # The redirect after a POST may still be loading.
                    found = _until(lambda: browser.find_elements(By.ID, "notice"),
                                   "the notice of the action", timeout=10)
                    return str(found[0].text)

                # Log in with the token form.
                browser.get(base + "/")
                assert browser.current_url.endswith("/login")
                shot("login")
                browser.find_element(By.ID, "token").send_keys(TOKEN)
                browser.find_element(By.ID, "login").click()
                # The click starts a POST and a redirect: until they end, the login page's
                # own h1 is the one found.
                _until(lambda: browser.find_element(By.TAG_NAME, "h1").text == "Overview",
                       "the overview after logging in", timeout=10)
                queues = browser.find_element(By.ID, "queues").text
                assert "purge-me" in queues and "default" in queues
                assert len(browser.find_elements(By.CSS_SELECTOR, "svg.chart")) == 3
                shot("overview")

                # The hostile job: its payloads are text in the DOM, nothing ran.
                browser.get(f"{base}/jobs/{hostile_failed}")
                traceback = browser.find_element(By.CSS_SELECTOR, "pre.traceback").text
                assert SCRIPT in traceback and IMG in traceback
                assert SCRIPT in browser.find_element(By.ID, "args").text
                assert browser.find_elements(By.TAG_NAME, "img") == []
                assert browser.find_elements(By.CSS_SELECTOR, "main script") == []
                assert browser.execute_script("return window.__xss === undefined")
                shot("job-failed")
                browser.get(f"{base}/jobs/{hostile_ok}")
                shown = json.dumps(IMG)  # inside JSON: its quotes escaped
                assert shown in browser.find_element(By.ID, "result").text
                assert shown in browser.find_element(By.ID, "meta").text  # progress
                assert browser.find_elements(By.TAG_NAME, "img") == []
                assert browser.execute_script("return window.__xss === undefined")
                shot("job-succeeded")

                # Retry a failed job (it runs again and fails again: two attempts).
                browser.get(f"{base}/jobs/{hostile_failed}")
                browser.find_element(By.ID, "retry").click()
                assert f"job {hostile_failed} requeued" in notice()
                _until(lambda: db.execute(
                    "SELECT jsonb_array_length(errors) = 2 AND state = 'failed' FROM akadze.jobs"
                    " WHERE id = %s", (hostile_failed,)).fetchone()[0], "the second attempt")

                # A workflow's relatives.
                browser.get(f"{base}/jobs/{second.id}")
                relatives = browser.find_element(By.ID, "relatives").text
                assert str(first.id) in relatives and "upstream" in relatives
                shot("job-workflow")

                # Cancel a queued job, and a running one.
                browser.get(f"{base}/jobs/{parked_cancel}")
                browser.find_element(By.ID, "cancel").click()
                assert "cancel requested" in notice()
                assert wait_state(db, parked_cancel, "cancelled") == "cancelled"
                browser.get(f"{base}/jobs/{slow_id}")
                browser.find_element(By.ID, "cancel").click()
                assert "cancel requested" in notice()
                assert db.execute("SELECT cancel_requested FROM akadze.jobs WHERE id = %s",
                                  (slow_id,)).fetchone()[0]

                # Workers: the live worker and its running job.
                browser.get(f"{base}/workers")
                workers = browser.find_element(By.ID, "workers").text
                assert "live" in workers and str(slow_id) in workers
                assert "default (4)" in workers  # its queue and slots
                shot("workers")

                # Schedules: the code one (from --app) and the runtime one, with next runs.
                browser.get(f"{base}/schedules")
                schedules = browser.find_element(By.ID, "schedules").text
                assert "nightly-report" in schedules and "every-minute" in schedules
                assert "runtime" in schedules and "code" in schedules
                shot("schedules")

                # Jobs list: filter by state and task in the form, then bulk retry.
                browser.get(f"{base}/jobs")
                shot("jobs")
                Select(browser.find_element(By.ID, "state")).select_by_value("failed")
                browser.find_element(By.ID, "task").send_keys("boom")
                browser.find_element(By.ID, "apply").click()
                # As after logging in: the filtered page replaces the unfiltered one when
                # its load ends.
                _until(lambda: "state=failed" in browser.current_url
                       and {int(link.text) for link in browser.find_elements(
                           By.CSS_SELECTOR, "#jobs td.n a")} == {hostile_failed, *bulk_failed},
                       "the failed boom jobs listed after filtering", timeout=10)
                shot("jobs-failed")
                browser.find_element(By.ID, "bulk-retry").click()
                assert "bulk retry: requeued 4 of 4" in notice()
                for job_id in bulk_failed:
                    _until(lambda job_id=job_id: db.execute(
                        "SELECT jsonb_array_length(errors) FROM akadze.jobs WHERE id = %s",
                        (job_id,)).fetchone()[0] == 2, "the bulk retry's runs")

                # Bulk cancel of a queue's queued jobs.
                browser.get(f"{base}/jobs?{urlencode({'queue': 'bulk-cancel'})}")
                browser.find_element(By.ID, "bulk-cancel").click()
                assert "cancel requested for 5 of 5" in notice()
                assert {wait_state(db, job_id, "cancelled") for job_id in bulk_cancel} == {
                    "cancelled"}

                # Purge a queue from the overview.
                browser.get(f"{base}/")
                row = browser.find_element(
                    By.XPATH, "//table[@id='queues']//tr[td/a[text()='purge-me']]")
                row.find_element(By.CSS_SELECTOR, "button.purge").click()
                assert "queue purge-me purged: 4 queued jobs deleted" in notice()
                assert db.execute("SELECT count(*) FROM akadze.jobs WHERE id = ANY(%s)",
                                  (purged,)).fetchone()[0] == 0
                shot("overview-after-actions")

                # Find by id from the form.
                browser.get(f"{base}/jobs")
                browser.find_element(By.ID, "find").send_keys(str(second.id))
                browser.find_element(By.ID, "find").submit()
                _until(lambda: browser.current_url.endswith(f"/jobs/{second.id}"),
                       "the found job's page", timeout=10)
        for name in ("login", "overview", "job-failed", "jobs", "workers", "schedules"):
            assert (shots / f"{name}.png").stat().st_size > 5_000, name
