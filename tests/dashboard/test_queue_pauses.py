"""Pausing and resuming a queue from the dashboard, against the real ``akadze dashboard``:
the overview marks a paused queue and offers resume; the actions go through the same
credentials and CSRF checks as the others (a cross-site or tokenless POST changes nothing);
a read-only dashboard shows the state and offers no button."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.dashboard.support import Client, dashboard
from tests.dashboard.test_http import BASIC

pytestmark = pytest.mark.slow


def _paused(db: psycopg.Connection) -> list[str]:
    return [row[0] for row in db.execute(
        "SELECT queue FROM akadze.queue_pauses ORDER BY queue").fetchall()]


def test_pause_and_resume_from_the_overview_behind_the_csrf_check(
        database_url: str, db: psycopg.Connection, tmp_path: Path) -> None:
    db.execute("INSERT INTO akadze.jobs (task, queue) VALUES ('noop', 'mail')")
    with dashboard(database_url, tmp_path, "--basic-auth", "admin:pw-admin") as served:
        base = served.base
        client = Client(BASIC)
        page = client.get(base + "/").text
        assert 'action="/queues/pause"' in page and 'class="paused"' not in page
        csrf = client.csrf()
        for form, headers in (({}, {}), ({"csrf": "forged"}, {}),
                              ({"csrf": csrf}, {"Origin": "http://evil.example"}),
                              ({"csrf": csrf}, {"Origin": "null"}),
                              ({"csrf": csrf}, {"Sec-Fetch-Site": "cross-site"}),
                              ({"csrf": csrf}, {"Sec-Fetch-Site": "same-site"})):
            answer = client.post(base + "/queues/pause", {"queue": "mail", **form},
                                 headers=headers)
            assert answer.status == 403 and "CSRF" in answer.text, (form, headers)
        assert _paused(db) == []
        done = client.post(base + "/queues/pause",
                           {"csrf": csrf, "queue": "mail", "next": "/"},
                           headers={"Origin": base, "Sec-Fetch-Site": "same-origin"})
        assert done.status == 200 and "queue mail paused" in done.text
        assert 'class="paused"' in done.text and 'action="/queues/resume"' in done.text
        assert _paused(db) == ["mail"]
        assert db.execute("SELECT paused_by FROM akadze.queue_pauses").fetchone()[0] \
            == "dashboard"
        # A cross-site resume is refused as well.
        refused = client.post(base + "/queues/resume", {"csrf": client.csrf(), "queue": "mail"},
                              headers={"Origin": "http://evil.example"})
        assert refused.status == 403 and _paused(db) == ["mail"]
        resumed = client.post(base + "/queues/resume",
                              {"csrf": client.csrf(), "queue": "mail", "next": "/"})
        assert resumed.status == 200 and "queue mail resumed" in resumed.text
        assert _paused(db) == []
        empty = client.post(base + "/queues/pause", {"csrf": client.csrf(), "queue": ""})
        assert empty.status == 400


def test_read_only_shows_a_paused_queue_and_offers_no_button(
        database_url: str, db: psycopg.Connection, tmp_path: Path) -> None:
    db.execute("INSERT INTO akadze.queue_pauses (queue, paused_by) VALUES ('idle', 'ops')")
    with dashboard(database_url, tmp_path, "--basic-auth", "admin:pw-admin",
                   "--read-only") as served:
        client = Client(BASIC)
        page = client.get(served.base + "/").text
        assert "idle" in page and 'class="paused"' in page
        assert "/queues/resume" not in page and "/queues/pause" not in page
        answer = client.post(served.base + "/queues/pause", {"csrf": "x", "queue": "idle"})
        assert answer.status == 403
