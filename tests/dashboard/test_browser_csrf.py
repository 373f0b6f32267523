"""Cross-site request forgery in a real browser (Debian's headless Chromium): a page on
another port of the same host, and one on a sibling subdomain (``evil.corp.test`` against
``dash.corp.test``, both mapped to 127.0.0.1 with ``--host-resolver-rules``), tosses the
dashboard's CSRF cookie, then posts a requeue and a purge through its own 307 redirect (so
the browser sends ``Origin: null``), with the victim logged in by the token form and by
basic auth. Nothing may change; the victim's own buttons still work afterwards."""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest

from tests.dashboard.support import chromium, dashboard

pytestmark = pytest.mark.slow

TOKEN = "tok-" + "b" * 24
BROWSER_ARGS = ("--host-resolver-rules=MAP *.corp.test 127.0.0.1",
                # The test hosts serve plain http: no https attempt first.
                "--disable-features=HttpsUpgrades,HttpsFirstBalancedModeAutoEnable")


class Attacker:
    """The attacker's site: ``/attack`` tosses the cookie (for the whole parent domain when
    told) and submits a form to its own ``/bounce``, which answers 307 to the target."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        attacker = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                target, domain = query["target"][0], query.get("domain", [""])[0]
                fields = {"csrf": "tossed", "queue": query.get("queue", [""])[0],
                          "next": "/"}
                inputs = "".join(f'<input type="hidden" name="{html.escape(k)}" '
                                 f'value="{html.escape(v)}">' for k, v in fields.items())
                page = (f'<!doctype html><form method="post" action="/bounce?to='
                        f'{html.escape(target)}">{inputs}</form>'
                        "<script>document.forms[0].submit()</script>").encode()
                self.send_response(200)
                scope = f"; Domain={domain}" if domain else ""
                self.send_header("Set-Cookie", f"akadze_csrf=tossed; Path=/{scope}")
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = parse_qs(urlsplit(self.path).query)["to"][0]
                attacker.hits.append(target)
                self.send_response(307)
                self.send_header("Location", target)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Attacker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    """The attacker's server on a port of its own."""
    with Attacker() as running:
        yield running


def _until(check: Any, what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def _queued(db: psycopg.Connection, queue: str) -> int:
    return int(db.execute("SELECT count(*) FROM akadze.jobs WHERE queue = %s AND "
                          "state = 'queued'", (queue,)).fetchone()[0])


@pytest.mark.parametrize("mode", ["token", "basic"])
def test_a_sibling_origin_cannot_forge_an_action_in_chromium(
        mode: str, database_url: str, db: psycopg.Connection, tmp_path: Path,
        attacker: Attacker) -> None:
    options = ("--token", TOKEN) if mode == "token" else ("--basic-auth", "admin:pw-admin")
    with chromium(*BROWSER_ARGS) as browser, \
            dashboard(database_url, tmp_path, *options) as served:
        from selenium.webdriver.common.by import By

        port = urlsplit(served.base).port
        victims = {"port": f"http://127.0.0.1:{port}", "host": f"http://dash.corp.test:{port}"}
        evil = {"port": f"http://127.0.0.1:{attacker.port}",
                "host": f"http://evil.corp.test:{attacker.port}"}
        for sibling, base in victims.items():
            queue = f"victim-{sibling}"
            db.execute("INSERT INTO akadze.jobs (task, queue) SELECT 'noop', %s "
                       "FROM generate_series(1, 25)", (queue,))
            failed = db.execute("INSERT INTO akadze.jobs (task, queue, state, finished_at, "
                                "errors) VALUES ('boom', 'other', 'failed', now(), '[]') "
                                "RETURNING id").fetchone()[0]
            # The victim logs in on the dashboard.
            if mode == "token":
                browser.get(base + "/login")
                browser.find_element(By.ID, "token").send_keys(TOKEN)
                browser.find_element(By.ID, "login").click()
            else:
                host = urlsplit(base).netloc
                browser.get(f"http://admin:pw-admin@{host}/")
            _until(lambda: browser.find_elements(By.ID, "queues"), "the overview")
            # The attacker's pages: a requeue, then a purge.
            domain = "corp.test" if sibling == "host" else ""
            for target, extra in ((f"{base}/jobs/{failed}/retry", ""),
                                  (f"{base}/queues/purge", queue)):
                hits = len(attacker.hits)
                browser.get(f"{evil[sibling]}/attack?target={target}&domain={domain}"
                            f"&queue={extra}")
                _until(lambda hits=hits: len(attacker.hits) > hits, "the forged post")
                _until(lambda base=base: browser.current_url.startswith(base)
                       and browser.execute_script("return document.readyState") == "complete",
                       "the redirected post's answer")
                # Nothing changed (the forged post did reach the dashboard: 403 below).
                assert _queued(db, queue) == 25, (mode, sibling, browser.current_url)
                assert db.execute("SELECT state FROM akadze.jobs WHERE id = %s",
                                  (failed,)).fetchone()[0] == "failed", (mode, sibling)
                assert browser.current_url == target
                assert "CSRF check failed" in browser.find_element(By.TAG_NAME, "body").text
            # The victim's own buttons still work in the same browser.
            browser.get(f"{base}/jobs/{failed}")
            browser.find_element(By.ID, "retry").click()
            _until(lambda: browser.find_elements(By.ID, "notice"), "the requeue's notice")
            assert f"job {failed} requeued" in browser.find_element(By.ID, "notice").text
            assert db.execute("SELECT state FROM akadze.jobs WHERE id = %s",
                              (failed,)).fetchone()[0] == "queued"
            browser.delete_all_cookies()
        log = served.process.log()
        assert log.count("POST /queues/purge HTTP/1.1\" 403") == 2, log[-3000:]


def test_another_site_cannot_drive_the_flower_api_in_chromium(
        database_url: str, db: psycopg.Connection, tmp_path: Path,
        attacker: Attacker) -> None:
    """The browser holds the dashboard's basic-auth credentials (as a Flower user's does):
    a page on another port of the same host posts to Flower's API through its own 307
    (``Origin: null``): refused, nothing sent. The victim's jobs list still follows new
    jobs."""
    command = ("-m", "akadze_compat", "-b", database_url, "-A", "tests.dashboard.compat_app",
               "flower", "--address", "127.0.0.1", "--basic-auth", "admin:pw-admin")
    with chromium(*BROWSER_ARGS) as browser, \
            dashboard(database_url, tmp_path, command=command) as served:
        from selenium.webdriver.common.by import By

        host = urlsplit(served.base).netloc
        browser.get(f"http://admin:pw-admin@{host}/")
        _until(lambda: browser.find_elements(By.ID, "queues"), "the overview")
        targets = [f"{served.base}/api/task/send-task/tests.dashboard.compat_app.add",
                   f"{served.base}/api/task/async-apply/tests.dashboard.compat_app.add",
                   f"{served.base}/api/task/revoke/some-task?terminate=true"]
        for target in targets:
            hits = len(attacker.hits)
            browser.get(f"http://127.0.0.1:{attacker.port}/attack?target={target}")
            _until(lambda hits=hits: len(attacker.hits) > hits, "the forged post")
            _until(lambda target=target: browser.current_url == target
                   and browser.execute_script("return document.readyState") == "complete",
                   "the redirected post's answer")
            body = browser.find_element(By.TAG_NAME, "body").text
            assert "another site" in body, (target, body)
        assert db.execute("SELECT count(*) FROM akadze.jobs").fetchone()[0] == 0
        log = served.process.log()
        assert log.count("POST /api/task/") == 3 and log.count('HTTP/1.1" 403') >= 3, \
            log[-3000:]
        # The victim's own page: the jobs list follows new jobs (a meta refresh, no script).
        browser.get(served.base + "/jobs")
        browser.find_element(By.ID, "follow").click()
        _until(lambda: browser.find_elements(By.ID, "unfollow"), "the followed list")
        db.execute("INSERT INTO akadze.jobs (task, queue) VALUES ('noop', 'followed')")
        newest = db.execute("SELECT max(id) FROM akadze.jobs").fetchone()[0]
        _until(lambda: browser.find_elements(By.CSS_SELECTOR, f'a[href="/jobs/{newest}"]'),
               "the new job, after the page reloaded itself", timeout=20)
