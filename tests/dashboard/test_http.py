"""The dashboard over HTTP, served by the real ``akadze dashboard`` command (and the
compat ``flower`` command), against a real worker and database: authentication, CSRF,
read-only mode and role, escaping, no password anywhere, keyset pages, find by id."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlencode

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from akadze_core.dashboard.server import normalize_prefix, parse_basic_auth
from akadze_core.model.task_ids import TaskIds
from tests.dashboard.dash_app import build_app
from tests.dashboard.support import PROJECT_ROOT, Client, dashboard, worker

pytestmark = pytest.mark.slow

PASSWORD = "Sup3r-S3cret-pw"  # the local server trusts 127.0.0.1: any password connects
SCRIPT = "<script>window.__xss = 1</script>"
IMG = '"><img src=x onerror="window.__xss = 2">'
BASIC = {"Authorization": "Basic " + base64.b64encode(b"admin:pw-admin").decode()}
PAGES = ("/", "/jobs", "/workers", "/schedules")


def with_password(url: str, password: str = PASSWORD, user: str | None = None) -> str:
    """``url`` as a URL carrying a password (a trusting server ignores it; it must never be
    shown)."""
    params = conninfo_to_dict(url)
    return "postgresql://{user}:{password}@{host}:{port}/{dbname}".format(
        user=user or params.get("user", "postgres"), password=password,
        host=params.get("host", "127.0.0.1"), port=params.get("port", 5432),
        dbname=params["dbname"])


def wait_state(db: psycopg.Connection, job_id: int, *states: str, timeout: float = 20) -> str:
    """Wait until job ``job_id`` is in one of ``states``; returns it."""
    deadline = time.monotonic() + timeout
    while True:
        row = db.execute("SELECT state FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone()
        if row and row[0] in states:
            return str(row[0])
        assert time.monotonic() < deadline, f"job {job_id} is {row}, not {states}"
        time.sleep(0.05)


def run_hostile_jobs(url: str, db: psycopg.Connection, tmp_path: Path) -> tuple[int, int]:
    """A succeeded echo and a failed boom job carrying the payloads in args, result, meta,
    error message and traceback, run by a real worker."""
    app = build_app(url)
    try:
        echoed = app.tasks["echo"].enqueue(payload={"script": SCRIPT, "img": IMG})
        failed = app.tasks["boom"].enqueue_with_task_id(f"{IMG}{SCRIPT}", payload=SCRIPT + IMG)
    finally:
        app.close()
    with worker(url, tmp_path):
        wait_state(db, echoed, "succeeded")
        wait_state(db, failed, "failed")
    return echoed, failed


def test_parse_basic_auth_and_prefix() -> None:
    assert parse_basic_auth("a:b,c:d:e") == {"a": "b", "c": "d:e"}
    assert parse_basic_auth("") == {}
    with pytest.raises(ValueError, match="user 'a'") as caught:
        parse_basic_auth("ok:fine,a")
    assert "fine" not in str(caught.value)
    assert normalize_prefix("flower/") == "/flower" and normalize_prefix("/") == ""


def test_payloads_stay_text_and_the_password_is_never_shown(
        database_url: str, db: psycopg.Connection, tmp_path: Path) -> None:
    url = with_password(database_url)
    echoed, failed = run_hostile_jobs(url, db, tmp_path)
    with dashboard(url, tmp_path, "--basic-auth", "admin:pw-admin") as served:
        client = Client(BASIC)
        for path in (*PAGES, f"/jobs/{echoed}", f"/jobs/{failed}", "/jobs?state=failed",
                     "/jobs/999999", "/nope"):
            answer = client.get(served.base + path)
            assert answer.status in (200, 404), (path, answer.status)
            for text in (answer.text, str(answer.headers)):
                assert PASSWORD not in text, path
                # Never the markup itself: only its escaped text.
                assert "<script>window" not in text and "<img src=x" not in text, path
            assert answer.headers.get("content-security-policy", "").startswith(
                "default-src 'none'") or answer.status == 404
        page = client.get(f"{served.base}/jobs/{failed}").text
        assert "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in page  # message, traceback
        assert "&#34;&gt;&lt;img src=x onerror=&#34;window.__xss = 2&#34;&gt;" in page
        assert page.count('class="traceback"') == 1
        page = client.get(f"{served.base}/jobs/{echoed}").text
        assert page.count("&lt;script&gt;window.__xss") >= 3  # args, result, meta progress
        # The task id holds the payloads too, and finds the job.
        found = client.get(f"{served.base}/jobs?{urlencode({'find': IMG + SCRIPT})}")
        assert found.url.endswith(f"/jobs/{failed}"), found.url
        log = served.process.log()
    assert PASSWORD not in log and "pw-admin" not in log
    assert "GET /jobs" in log  # the access log is there, scrubbed


def test_actions_need_credentials_and_a_csrf_token(
        database_url: str, db: psycopg.Connection, tmp_path: Path) -> None:
    _, failed = run_hostile_jobs(database_url, db, tmp_path)
    # Without credentials the pages are open and the actions off.
    with dashboard(database_url, tmp_path) as served:
        client = Client()
        page = client.get(f"{served.base}/jobs/{failed}")
        assert page.status == 200 and 'id="retry"' not in page.text
        # (No page offers a form: any token is refused before it is looked at.)
        refused = client.post(f"{served.base}/jobs/{failed}/retry", {"csrf": "any"})
        assert refused.status == 403 and "need credentials" in refused.text
        assert wait_state(db, failed, "failed") == "failed"
    # A bearer token (from the environment) opens the pages and the actions too.
    with dashboard(database_url, tmp_path, env={"AKADZE_DASHBOARD_TOKEN": "t0ken-abc"}
                   ) as served:
        assert Client().get(served.base + "/jobs").url.endswith("/login")
        assert Client({"Authorization": "Bearer nope"}).get(served.base + "/jobs"
                                                            ).url.endswith("/login")
        client = Client({"Authorization": "Bearer t0ken-abc"})
        assert 'id="retry"' in client.get(f"{served.base}/jobs/{failed}").text
        assert "t0ken-abc" not in served.process.log()
    with dashboard(database_url, tmp_path, "--basic-auth", "admin:pw-admin,ro:x") as served:
        assert Client().get(served.base + "/").status == 401
        wrong = {"Authorization": "Basic " + base64.b64encode(b"admin:nope").decode()}
        assert Client(wrong).get(served.base + "/jobs").status == 401
        client = Client(BASIC)
        page = client.get(f"{served.base}/jobs/{failed}")
        assert 'id="retry"' in page.text
        csrf = client.csrf()
        # No token, a wrong one, or a form posted from another site: refused, unchanged.
        for form, headers in (({}, {}), ({"csrf": "forged"}, {}),
                              ({"csrf": csrf}, {"Origin": "http://evil.example"}),
                              ({"csrf": csrf}, {"Sec-Fetch-Site": "cross-site"})):
            answer = client.post(f"{served.base}/jobs/{failed}/retry", form, headers=headers)
            assert answer.status == 403 and "CSRF" in answer.text, (form, headers)
        assert wait_state(db, failed, "failed") == "failed"
        done = client.post(f"{served.base}/jobs/{failed}/retry",
                           {"csrf": csrf, "next": f"/jobs/{failed}"},
                           headers={"Origin": served.base.rsplit("/", 0)[0]})
        assert done.status == 200 and f"job {failed} requeued" in done.text
        assert done.url.split("?")[0].endswith(f"/jobs/{failed}")
        assert wait_state(db, failed, "queued") == "queued"
        # An off-site "next" is not followed.
        again = client.post(f"{served.base}/jobs/{failed}/cancel",
                            {"csrf": csrf, "next": "//evil.example/x"})
        assert again.status == 200 and again.url.startswith(served.base + "/?")
        assert wait_state(db, failed, "cancelled") == "cancelled"


def test_read_only_offers_and_accepts_no_action(
        database_url: str, db: psycopg.Connection, tmp_path: Path) -> None:
    _, failed = run_hostile_jobs(database_url, db, tmp_path)
    with dashboard(database_url, tmp_path, "--read-only", "--basic-auth",
                   "admin:pw-admin") as served:
        client = Client(BASIC)
        for path in (*PAGES, f"/jobs/{failed}"):
            page = client.get(served.base + path)
            assert page.status == 200 and 'method="post"' not in page.text.replace(
                'action="/logout"', ""), path
        answer = client.post(f"{served.base}/jobs/{failed}/retry", {"csrf": "any"})
        assert answer.status == 403 and "read-only" in answer.text
        answer = client.post(f"{served.base}/queues/purge", {"csrf": "any", "queue": "default"})
        assert answer.status == 403
    assert wait_state(db, failed, "failed") == "failed"


def _security_block(marker: str) -> str:
    text = (PROJECT_ROOT / "SECURITY.md").read_text("utf-8")
    match = re.search(rf"<!-- {re.escape(marker)} -->\n```sql\n(.*?)```", text, re.DOTALL)
    assert match, f"SECURITY.md has no block {marker!r}"
    return match.group(1)


def test_read_only_role_of_security_md_serves_every_page(
        admin_url: str, database_url: str, db: psycopg.Connection, tmp_path: Path) -> None:
    echoed, failed = run_hostile_jobs(database_url, db, tmp_path)
    role = f"akadze_dash_ro_{uuid.uuid4().hex[:8]}"
    dbname = conninfo_to_dict(database_url)["dbname"]
    block = (_security_block("dashboard-role: read-only")
             .replace("akadze_dashboard_ro", role).replace("DATABASE app", f'DATABASE "{dbname}"')
             .replace("ROLE akadze_owner", "ROLE CURRENT_USER"))
    with psycopg.connect(database_url, autocommit=True) as owner:
        owner.execute(block)
    try:
        url = with_password(database_url, "ro-pw-123", user=role)
        with dashboard(url, tmp_path, "--read-only") as served:
            client = Client()
            for path in (*PAGES, f"/jobs/{echoed}", f"/jobs/{failed}", "/jobs?state=failed"):
                page = client.get(served.base + path)
                assert page.status == 200, (path, page.text[-500:])
        # Without --read-only, with credentials, an action is refused by the database: a
        # one-line 503 page, no password, and the job unchanged.
        with dashboard(url, tmp_path, "--basic-auth", "admin:pw-admin") as served:
            client = Client(BASIC)
            client.get(f"{served.base}/jobs/{failed}")
            answer = client.post(f"{served.base}/jobs/{failed}/retry", {"csrf": client.csrf()})
            assert answer.status == 503 and "permission denied" in answer.text
            assert "ro-pw-123" not in answer.text and "ro-pw-123" not in served.process.log()
        assert wait_state(db, failed, "failed") == "failed"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            with psycopg.connect(database_url, autocommit=True) as owner:
                owner.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_keyset_pages_filters_and_find(
        database_url: str, db: psycopg.Connection, tmp_path: Path) -> None:
    db.execute("""
        INSERT INTO akadze.jobs (task, queue, state, meta, finished_at)
        SELECT 't' || (g % 3), CASE WHEN g % 2 = 0 THEN 'even' ELSE 'odd' END,
               CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'succeeded' END,
               jsonb_build_object('task_id', 'tid-' || g), now()
        FROM generate_series(1, 130) AS g""")
    with dashboard(database_url, tmp_path) as served:
        client = Client()
        seen: list[int] = []
        url: str | None = served.base + "/jobs"
        while url:
            page = client.get(url).text
            ids = [int(value) for value in re.findall(r'<td class="n"><a href="/jobs/(\d+)"',
                                                      page)]
            assert len(ids) <= 50
            seen += ids
            found = re.search(r'href="([^"]+)" id="older"', page)
            url = served.base + found.group(1).replace("&amp;", "&") if found else None
        assert seen == sorted(seen, reverse=True) and len(seen) == 130 == len(set(seen))
        page = client.get(served.base + "/jobs?state=failed&queue=even&task=t1").text
        ids = [int(v) for v in re.findall(r'<a href="/jobs/(\d+)">', page)]
        expected = [row[0] for row in db.execute(
            "SELECT id FROM akadze.jobs WHERE state = 'failed' AND queue = 'even' "
            "AND task = 't1' ORDER BY id DESC")]
        assert ids == expected and ids
        target = db.execute("SELECT id FROM akadze.jobs WHERE meta->>'task_id' = 'tid-77'"
                            ).fetchone()[0]
        assert client.get(served.base + "/jobs?find=tid-77").url.endswith(f"/jobs/{target}")
        assert client.get(served.base + f"/jobs?find={target}").url.endswith(f"/jobs/{target}")
        missing = client.get(served.base + "/jobs?find=no-such-id")
        assert 'id="not-found"' in missing.text
        # A job stored without a task id is shown and found by the one derived from its id.
        plain = db.execute("INSERT INTO akadze.jobs (task, queue) VALUES ('t0', 'even') "
                           "RETURNING id").fetchone()[0]
        key = db.execute("SELECT key FROM akadze.task_id_key").fetchone()[0]
        derived = TaskIds(key).derive(plain)
        assert derived in client.get(served.base + "/jobs?queue=even").text
        page = client.get(served.base + f"/jobs/{plain}").text
        assert derived in page and 'id="position"' not in page
        assert client.get(served.base + f"/jobs?find={derived}").url.endswith(f"/jobs/{plain}")
        # A fan-out's job (a Celery group member) shows its position, not kept in its meta.
        member = db.execute("INSERT INTO akadze.jobs (task, queue, position) "
                            "VALUES ('t0', 'even', 7) RETURNING id").fetchone()[0]
        assert '<td id="position">7</td>' in client.get(served.base + f"/jobs/{member}").text


def test_flower_command_takes_flowers_flags(database_url: str, tmp_path: Path) -> None:
    command = ("-m", "akadze_compat", "-b", database_url, "-A", "tests.dashboard.compat_app",
               "flower", "--address", "127.0.0.1", "--basic-auth", "admin:pw-admin",
               "--url-prefix", "flower", "--persistent=True")
    with dashboard(database_url, tmp_path, command=command, prefix="/flower") as served:
        root = served.base.removesuffix("/flower")
        assert Client().get(served.base + "/").status == 401
        client = Client(BASIC)
        page = client.get(root + "/")  # redirected under the prefix
        assert page.status == 200 and page.url == served.base + "/"
        assert 'href="/flower/jobs"' in page.text
        assert client.get(served.base + "/workers").status == 200
        assert "ignoring unsupported option --persistent=True" in served.process.log()


def test_bad_credentials_option_is_one_line_without_the_password(database_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "akadze_core.cli", "dashboard", "--basic-auth",
         "alice:Secret-1,bob"], capture_output=True, text=True, timeout=60, cwd=PROJECT_ROOT,
        env={**os.environ, "AKADZE_DATABASE_URL": database_url,
             "PYTHONPATH": str(PROJECT_ROOT)})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("akadze: error: --basic-auth")
    assert "Secret-1" not in done.stderr + done.stdout


def test_overview_counts_match_the_table(
        database_url: str, db: psycopg.Connection, tmp_path: Path) -> None:
    db.execute("""
        INSERT INTO akadze.jobs (task, queue, state, scheduled_at, started_at, finished_at)
        SELECT 't', 'counted', s.state, now() + s.due * interval '1 minute',
               now() - interval '10 seconds' + s.ago * interval '1 minute',
               CASE WHEN s.state IN ('succeeded', 'failed')
                    THEN now() + s.ago * interval '1 minute' END
        FROM (VALUES ('queued', -1, 0), ('queued', -1, 0), ('queued', -1, 0),
                     ('queued', 10, 0), ('queued', 10, 0), ('running', -1, 0),
                     ('failed', -2, 0), ('failed', -2, 0), ('failed', -2, 0), ('failed', -2, 0),
                     ('succeeded', -2, 0), ('succeeded', -2, 0), ('succeeded', -2, 0),
                     ('succeeded', -2, 0), ('succeeded', -2, 0), ('succeeded', -200, -120))
             AS s(state, due, ago)""")
    with dashboard(database_url, tmp_path) as served:
        page = Client().get(served.base + "/").text
    row = re.search(r'<td><a href="/jobs\?queue=counted">counted</a></td>(.*?)</tr>', page,
                    re.DOTALL)
    assert row, page
    cells = [re.sub(r"<[^>]+>", "", cell).strip()
             for cell in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.DOTALL)]
    # queued, scheduled, running, failed, succeeded 1 h, failed 1 h, per minute, rate, and
    # the latency (due two minutes ago, started ten seconds ago) mean and p95
    assert cells[:10] == ["3", "2", "1", "4", "5", "4", "0.1", "44.4 %", "110.0 s",
                          "110.0 s"], cells
    assert page.count('class="chart"') == 3
