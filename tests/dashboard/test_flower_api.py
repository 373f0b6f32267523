"""Flower's API on ``akadze-compat flower``, the parts real Flower's differential does not
cover (``tests/addons/test_flower.py``): it sits behind the dashboard's authentication and
CSRF rules, hostile names and bodies get a clear 4xx, and ``/metrics`` carries Flower's
series beside akadze's, counted from real jobs run by a real worker."""

from __future__ import annotations

import base64
import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.dashboard.support import Client, Process, dashboard

pytestmark = pytest.mark.slow

BASIC = {"Authorization": "Basic " + base64.b64encode(b"admin:pw-admin").decode()}


def flower(url: str) -> tuple[str, ...]:
    """The ``akadze-compat flower`` command line on database ``url``."""
    return ("-m", "akadze_compat", "-b", url, "-A", "tests.dashboard.compat_app", "flower",
            "--address", "127.0.0.1")

TASK = "tests.dashboard.compat_app.add"


def call(method: str, url: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, str]:
    """``method url`` with ``body``: (status, text)."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def apply(base: str, headers: dict[str, str], args: Any = (2, 3)) -> tuple[int, str]:
    """``POST /api/task/async-apply/<add>`` with ``args``."""
    return call("POST", f"{base}/api/task/async-apply/{TASK}",
                json.dumps({"args": list(args)}).encode(),
                {**headers, "Content-Type": "application/json"})


def jobs(db: psycopg.Connection) -> int:
    return int(db.execute("SELECT count(*) FROM akadze.jobs").fetchone()[0])  # type: ignore[index]


def test_the_api_needs_credentials_as_flowers_does(
        database_url: str, db: psycopg.Connection, tmp_path: Path) -> None:
    with dashboard(database_url, tmp_path, command=flower(database_url)) as served:
        status, text = call("GET", served.base + "/api/tasks")
        assert status == 401 and "FLOWER_UNAUTHENTICATED_API" in text
    with dashboard(database_url, tmp_path, command=flower(database_url),
                   env={"FLOWER_UNAUTHENTICATED_API": "true"}) as served:
        assert call("GET", served.base + "/api/tasks") == (200, "{}")
        # Reading is allowed then; acting still needs credentials, as the pages' actions.
        status, text = apply(served.base, {})
        assert status == 403 and "need credentials" in text
        # Flower's switch, not one of its options: no warning about it.
        assert "ignoring unsupported option" not in served.process.log()
    assert jobs(db) == 0


def test_actions_refuse_other_sites_read_only_and_missing_csrf(
        database_url: str, db: psycopg.Connection, tmp_path: Path) -> None:
    with dashboard(database_url, tmp_path, "--basic-auth", "admin:pw-admin",
                   command=flower(database_url)) as served:
        assert call("GET", served.base + "/api/tasks")[0] == 401
        for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"},
                        {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):
            status, text = apply(served.base, {**BASIC, **headers})
            assert status == 403 and "another site" in text, headers
        assert jobs(db) == 0
        # An API client (no Origin), or this dashboard's own page: accepted.
        assert apply(served.base, BASIC)[0] == 200
        own = served.base.split("/", 3)[:3]
        assert apply(served.base, {**BASIC, "Origin": "/".join(own)})[0] == 200
        assert jobs(db) == 2
    with dashboard(database_url, tmp_path, "--basic-auth", "admin:pw-admin", "--read-only",
                   command=flower(database_url)) as served:
        assert call("GET", served.base + "/api/task/types", headers=BASIC)[0] == 200
        status, text = apply(served.base, BASIC)
        assert status == 403 and "read-only" in text
    assert jobs(db) == 2
    # A token: as a bearer header (an API client) it acts; through the login form's session
    # cookie (a browser) it needs the session's CSRF token in X-CSRF-Token.
    with dashboard(database_url, tmp_path, command=flower(database_url),
                   env={"AKADZE_DASHBOARD_TOKEN": "t0ken-abc"}) as served:
        assert apply(served.base, {"Authorization": "Bearer nope"})[0] == 401
        assert apply(served.base, {"Authorization": "Bearer t0ken-abc"})[0] == 200
        browser = Client()
        browser.get(served.base + "/login")
        browser.post(served.base + "/login", {"csrf": browser.csrf(), "token": "t0ken-abc"})
        cookie = "; ".join(f"{c.name}={c.value}" for c in browser.jar)
        status, text = apply(served.base, {"Cookie": cookie})
        assert status == 403 and "CSRF" in text
        browser.get(served.base + "/jobs")
        assert apply(served.base, {"Cookie": cookie, "X-CSRF-Token": browser.csrf()})[0] == 200
    assert jobs(db) == 4


HOSTILE_READS = [
    "/api/task/info/%00abc", "/api/task/info/ab%1bc", "/api/task/info/" + "a" * 300,
    "/api/task/info/", "/api/task/result/%7f", "/api/workers?workername=%0a",
    "/api/tasks?taskname=x%00", "/api/tasks?sort_by=evil", "/api/tasks?limit=ten",
    "/api/tasks?received_start=yesterday", "/api/task/result/x?timeout=nan",
    "/api/task/info/" + "9" * 40, "/api/task/info/" + "1" * 19,
]


@pytest.fixture
def served_basic(database_url: str, tmp_path: Path) -> Any:
    with dashboard(database_url, tmp_path, "--basic-auth", "admin:pw-admin",
                   command=flower(database_url)) as served:
        yield served


def test_hostile_reads_get_a_clear_4xx(served_basic: Any) -> None:
    for path in HOSTILE_READS:
        status, text = call("GET", served_basic.base + path, headers=BASIC)
        assert status in (400, 404), (path, status, text)
        assert "\x00" not in text and "\x1b" not in text


def test_hostile_actions_get_a_clear_4xx_and_send_nothing(
        database_url: str, db: psycopg.Connection, served_basic: Any) -> None:
    base = served_basic.base
    json_headers = {**BASIC, "Content-Type": "application/json"}
    answers = {
        "unregistered name": call("POST", f"{base}/api/task/async-apply/os.system",
                                  b'{"args": ["id"]}', json_headers),
        "control character": call("POST", f"{base}/api/task/send-task/a%01b", b"{}",
                                  json_headers),
        "huge name": call("POST", f"{base}/api/task/send-task/{'n' * 1000}", b"{}",
                          json_headers),
        "not JSON": call("POST", f"{base}/api/task/async-apply/{TASK}", b"{args", json_headers),
        "not an object": call("POST", f"{base}/api/task/async-apply/{TASK}", b"[1]",
                              json_headers),
        "kwargs not an object": call("POST", f"{base}/api/task/async-apply/{TASK}",
                                     b'{"kwargs": [1]}', json_headers),
        "an option not offered": call("POST", f"{base}/api/task/async-apply/{TASK}",
                                      b'{"link": "os.system"}', json_headers),
        "a bad eta": call("POST", f"{base}/api/task/async-apply/{TASK}", b'{"eta": "soon"}',
                          json_headers),
        "a queue with a control character": call(
            "POST", f"{base}/api/task/async-apply/{TASK}", b'{"queue": "q\\u0000"}',
            json_headers),
        "a bad signal": call("POST", f"{base}/api/task/revoke/abc?signal=SIGNOPE", b"", BASIC),
        "an unknown worker": call("POST", f"{base}/api/worker/shutdown/nobody", b"", BASIC),
        "a body over the limit": call("POST", f"{base}/api/task/async-apply/{TASK}",
                                      b'{"args": ["' + b"x" * 70_000 + b'"]}', json_headers),
    }
    wrong = {what: answer for what, answer in answers.items()
             if not 400 <= answer[0] < 500}
    assert wrong == {}
    assert answers["unregistered name"] == (404, "Unknown task 'os.system'")
    assert answers["a body over the limit"][0] == 413
    assert jobs(db) == 0


def _sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(key) == value for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_metrics_carry_flowers_series_beside_akadzes(
        database_url: str, tmp_path: Path, served_basic: Any) -> None:
    base = served_basic.base
    worker = Process(["-m", "akadze_compat", "-b", database_url, "-A",
                      "tests.dashboard.compat_app", "worker",
                      "-P", "threads", "-c", "2", "-n", "w1@metrics", "-l", "INFO"],
                     tmp_path / "compat-worker.log", {"AKADZE_DATABASE_URL": database_url,
                                                      "AKADZE_POLL_INTERVAL": "0.1"})
    try:
        worker.wait_log("w1@metrics ready")
        first = call("GET", base + "/metrics", headers=BASIC)[1]
        assert "akadze_jobs{" in first and "# TYPE flower_events_total counter" in first
        assert _sample(first, "flower_worker_online", worker="w1@metrics") == 1.0
        for _ in range(3):
            assert apply(base, BASIC)[0] == 200
        deadline = time.monotonic() + 30
        while True:
            text = call("GET", base + "/metrics", headers=BASIC)[1]
            done = _sample(text, "flower_events_total", type="task-succeeded", task=TASK)
            if done == 3.0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert done == 3.0, text
        assert _sample(text, "flower_events_total", type="task-received", task=TASK) == 3.0
        assert _sample(text, "flower_task_runtime_seconds_count", task=TASK) == 3.0
        assert _sample(text, "flower_task_runtime_seconds_bucket", task=TASK, le="+Inf") == 3.0
        for declared in ("flower_task_prefetch_time_seconds", "flower_worker_prefetched_tasks",
                         "flower_worker_number_of_currently_executing_tasks"):
            assert f"# TYPE {declared} gauge" in text
        # Counters never go back: a later scrape counts the same jobs once.
        again = call("GET", base + "/metrics", headers=BASIC)[1]
        assert _sample(again, "flower_events_total", type="task-succeeded", task=TASK) == 3.0
    finally:
        worker.stop()


def test_dashboard_terminates_controls_workers_and_follows_new_jobs(
        database_url: str, db: psycopg.Connection, tmp_path: Path,
        served_basic: Any) -> None:
    base = served_basic.base
    worker = Process(["-m", "akadze_compat", "-b", database_url, "-A",
                      "tests.dashboard.compat_app", "worker", "-P", "threads", "-c", "2", "-n",
                      "w1@pages", "-l", "INFO"],
                     tmp_path / "compat-worker.log", {"AKADZE_DATABASE_URL": database_url,
                                                      "AKADZE_POLL_INTERVAL": "0.1"})
    try:
        worker.wait_log("w1@pages ready")
        client = Client(BASIC)
        # Follow: the newest jobs, reloaded; a job sent since shows on the next load.
        page = client.get(base + "/jobs?follow=1")
        assert '<meta http-equiv="refresh" content="5">' in page.text
        assert 'id="unfollow"' in page.text
        status, _ = call("POST", f"{base}/api/task/async-apply/tests.dashboard.compat_app.nap",
                         b'{"args": [30]}', {**BASIC, "Content-Type": "application/json"})
        assert status == 200
        job_id = int(db.execute("SELECT max(id) FROM akadze.jobs").fetchone()[0])  # type: ignore[index]
        assert f'href="/jobs/{job_id}"' in client.get(base + "/jobs?follow=1").text
        assert "http-equiv" not in client.get(base + "/jobs").text
        deadline = time.monotonic() + 20
        while db.execute("SELECT state FROM akadze.jobs WHERE id = %s",
                         (job_id,)).fetchone()[0] != "running":  # type: ignore[index]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # Terminate: offered on a running job; the cancel carries SIGTERM for its process.
        page = client.get(f"{base}/jobs/{job_id}")
        assert 'id="terminate"' in page.text
        done = client.post(f"{base}/jobs/{job_id}/terminate",
                           {"csrf": client.csrf(), "next": f"/jobs/{job_id}"})
        assert f"job {job_id}: terminate requested" in done.text
        row = db.execute("SELECT cancel_requested, cancel_signal FROM akadze.jobs WHERE id = %s",
                         (job_id,)).fetchone()
        assert row is not None and row[0] is True and row[1] in (15, None)
        # Worker controls: grow and shrink the threads pool, add and cancel a consumer.
        page = client.get(base + "/workers")
        worker_id = int(re.search(r'id="grow-(\d+)"', page.text).group(1))  # type: ignore[union-attr]
        control = f"{base}/workers/{worker_id}/control"
        answer = client.post(control, {"csrf": client.csrf(), "action": "pool_grow"})
        assert "worker w1@pages: pool will grow" in answer.text, answer.text[-2000:]
        answer = client.post(control, {"csrf": client.csrf(), "action": "pool_shrink"})
        assert "worker w1@pages: pool will shrink" in answer.text
        answer = client.post(control, {"csrf": client.csrf(), "action": "add_queue",
                                       "queue": "extra"})
        assert "now consuming from extra" in answer.text
        queues = db.execute("SELECT queues FROM akadze.workers WHERE id = %s",
                            (worker_id,)).fetchone()[0]  # type: ignore[index]
        assert "extra" in queues
        answer = client.post(control, {"csrf": client.csrf(), "action": "remove_queue",
                                       "queue": "extra"})
        assert "no longer consuming from extra" in answer.text
        for form in ({"action": "add_queue", "queue": "a\x01b"}, {"action": "add_queue"},
                     {"action": "__import__"}):
            assert client.post(control, {"csrf": client.csrf(), **form}).status == 400
        assert client.post(control, {"csrf": "forged", "action": "shutdown"}).status == 403
        # Shutdown: the worker stops (warm).
        answer = client.post(control, {"csrf": client.csrf(), "action": "shutdown"})
        assert "shutdown requested" in answer.text
        worker.proc.wait(40)
    finally:
        worker.stop()
