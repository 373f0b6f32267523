"""django_celery_beat, natively: two ``akadze-compat worker`` processes run the periodic tasks
of a real Django project's django_celery_beat tables, on Postgres.

The Django side (its migrations, PeriodicTask rows made and edited through the ORM) runs in
the interpreter that has Django and django_celery_beat, which imports Celery: the one
``.ci/run`` builds (``$CELERY_PYTHON``, default ``/tmp/akadze-celery-venv``). The workers
run here, with neither. Everything is asserted from the database.
"""

from __future__ import annotations

import json
import subprocess
import time
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.compat.cli_harness import PROJECTS, CompatWorker
from tests.compat.conftest import SpawnCompat
from tests.compat.differential import celery_python

PROJECT = PROJECTS / "djbeatproj"
pytestmark = pytest.mark.slow


def _django_python() -> str:
    python = celery_python()
    try:
        found = subprocess.run([python, "-c", "import django_celery_beat, psycopg"],
                               capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        found = None
    if found is None or found.returncode != 0:
        pytest.skip(f"no django_celery_beat at {python}: {python} -m pip install django "
                    "django-celery-beat 'psycopg[binary]' (.ci/run does it), or set "
                    "CELERY_PYTHON")
    return python


def orm(python: str, url: str, action: str) -> dict[str, Any]:
    """Run ``orm.py action`` on the Django side; its JSON answer."""
    done = subprocess.run([python, "orm.py", action], cwd=PROJECT, capture_output=True,
                          text=True, timeout=60,
                          env={"DJBEATPROJ_DATABASE_URL": url, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else {}


def rows(db: psycopg.Connection, query: str, *params: Any) -> list[dict[str, Any]]:
    with db.cursor(row_factory=dict_row) as cursor:
        return cursor.execute(query, params).fetchall()


def runs(db: psycopg.Connection, ids: dict[str, int], name: str) -> list[dict[str, Any]]:
    """The jobs enqueued for periodic task ``name``, by tick."""
    return rows(db, "SELECT id, queue, state, priority, args, meta, expires_at,"
                    " (meta->>'tick')::timestamptz AS tick, created_at FROM akadze.jobs"
                    " WHERE meta->>'schedule' = %s ORDER BY tick",
                f"django_celery_beat:{ids[name]}")


def task_row(db: psycopg.Connection, name: str) -> dict[str, Any]:
    [row] = rows(db, "SELECT * FROM django_celery_beat_periodictask WHERE name = %s", name)
    return row


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_workers_run_django_celery_beat_tasks_once_per_tick(
        database_url: str, db: psycopg.Connection, spawn_compat: SpawnCompat,
        tmp_path: Path) -> None:
    python = _django_python()
    orm(python, database_url, "migrate")
    made = orm(python, database_url, "setup")
    ids: dict[str, int] = made["ids"]
    created = datetime.fromisoformat(made["now"])
    env = {"DJBEATPROJ_DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "settings"}
    common = ("-A", "beatproj", "worker", "-P", "threads", "-c", "2", "-Q", "celery,special",
              "-l", "INFO")
    workers: list[CompatWorker] = [
        spawn_compat(*common, "-n", "one@%h", "--scheduler",
                     "django_celery_beat.schedulers:DatabaseScheduler", cwd=PROJECT, env=env),
        spawn_compat(*common, "-n", "two@%h", "-S", "django_celery_beat.schedulers:"
                     "DatabaseScheduler", cwd=PROJECT, env=env),
    ]
    for worker in workers:
        worker.wait_ready()

    # --- the first run of each kind -------------------------------------------------------
    wait_for(lambda: len(runs(db, ids, "clocked-soon")) == 1
             and len(runs(db, ids, "interval")) >= 3
             and not task_row(db, "expiring")["enabled"], 25,
             "clocked-soon, three interval runs and expiring disabled")
    time.sleep(1.5)  # let the last ticks' transactions settle everywhere

    duplicates = rows(db, "SELECT meta->>'schedule' AS name, meta->>'tick' AS tick, count(*)"
                          " FROM akadze.jobs GROUP BY 1, 2 HAVING count(*) > 1")
    assert duplicates == []

    interval = runs(db, ids, "interval")
    ticks = [run["tick"] for run in interval]
    # One run a tick, on the 3 s grid. A tick the scheduler reached late (a busy host) runs
    # once, as the latest: the gaps are whole intervals, never shorter.
    gaps = [(b - a) / timedelta(seconds=3) for a, b in pairwise(ticks)]
    assert all(gap >= 1 and gap == int(gap) for gap in gaps), ticks
    assert all(tick.timestamp() % 3 == 0 for tick in ticks), ticks  # on the epoch's grid
    first = interval[0]
    assert first["args"] == {"args": [], "kwargs": {"label": "interval"}}
    assert first["queue"] == "celery"
    headers = first["meta"]["celery"].get("headers") or {}
    assert headers.get("tenant") == "acme"
    assert headers.get("periodic_task_name") == "interval"
    row = task_row(db, "interval")
    assert row["total_run_count"] == len(interval)
    assert row["last_run_at"] >= interval[-1]["tick"]
    assert row["enabled"]

    # The crontab runs in its own time zone: overdue in Kolkata, hours away in New York.
    cron = runs(db, ids, "cron-kolkata")  # the overdue tick, and the next minute's if it came
    assert 1 <= len(cron) <= 2 and all(run["tick"].second == 0 for run in cron), cron
    # Overdue: it ran at once, for the latest minute, not a minute later.
    assert cron[0]["tick"] <= cron[0]["created_at"] < created + timedelta(seconds=20)
    assert task_row(db, "cron-kolkata")["total_run_count"] == len(cron)
    assert runs(db, ids, "cron-newyork") == []
    assert task_row(db, "cron-newyork")["total_run_count"] == 0

    # one_off: one run, then disabled as django_celery_beat leaves it.
    assert len(runs(db, ids, "oneoff")) == 1
    oneoff = task_row(db, "oneoff")
    assert (oneoff["enabled"], oneoff["total_run_count"], oneoff["last_run_at"]) == \
        (False, 0, None)
    # clocked: once, at its time, also when that time had passed before any worker read it.
    for name, offset in (("clocked-past", -10), ("clocked-soon", 6)):
        [clocked] = runs(db, ids, name)
        assert clocked["tick"] == created + timedelta(seconds=offset), name
        assert not task_row(db, name)["enabled"]
    assert runs(db, ids, "disabled") == []

    # expires: runs only before it (each job expiring then), then disabled.
    expires_at = created + timedelta(seconds=8)
    expiring = runs(db, ids, "expiring")
    assert expiring and all(run["tick"] < expires_at for run in expiring), (expiring, expires_at)
    assert expiring[0]["meta"]["celery"]["expires"] == expires_at.isoformat()
    assert not task_row(db, "expiring")["enabled"]
    # start_time: nothing before it.
    starts = runs(db, ids, "starts-later")
    assert starts and starts[0]["tick"] >= created + timedelta(seconds=6)
    # queue and expire_seconds go with the job; both workers' queues run what is due.
    queued = runs(db, ids, "queued")
    assert queued and {run["queue"] for run in queued} == {"special"}
    assert all(run["expires_at"] == run["tick"] + timedelta(seconds=30) for run in queued), queued
    assert queued[0]["args"] == {"args": ["queued"], "kwargs": {"n": 1}}
    wait_for(lambda: rows(db, "SELECT count(*) AS n FROM akadze.jobs WHERE state = 'queued'"
                              " AND scheduled_at < now() - interval '2 seconds'")[0]["n"] == 0,
             10, "the workers to run the due jobs")
    assert rows(db, "SELECT count(*) AS n FROM akadze.jobs WHERE state = 'succeeded'")[0]["n"] \
        > 0

    # --- an edit through the ORM takes effect without a restart ------------------------------
    edited = datetime.fromisoformat(orm(python, database_url, "edit")["now"])
    settled = edited + timedelta(seconds=2)  # every worker has re-read by then

    def every_two_seconds() -> bool:
        return len([run for run in runs(db, ids, "interval") if run["tick"] > settled]) >= 3

    wait_for(every_two_seconds, 12, "the interval task to run every two seconds")
    after = [run["tick"] for run in runs(db, ids, "interval") if run["tick"] > settled]
    assert all(b - a == timedelta(seconds=2) for a, b in pairwise(after)), \
        (edited, [run["tick"] for run in runs(db, ids, "interval")])
    assert [run["tick"] for run in runs(db, ids, "to-disable") if run["tick"] > settled] == []
    time.sleep(1.5)  # the last tick's transactions settle
    # The edit's save() wrote back the count it had read: a run counted between its read and
    # its write is lost, with django_celery_beat's own scheduler too (at most one here).
    assert 0 <= len(runs(db, ids, "interval")) - task_row(db, "interval")["total_run_count"] \
        <= 1
    assert rows(db, "SELECT meta->>'schedule' AS name, meta->>'tick' AS tick, count(*)"
                    " FROM akadze.jobs GROUP BY 1, 2 HAVING count(*) > 1") == []
    for worker in workers:
        assert worker.proc.poll() is None, worker.log()
        assert "Traceback" not in worker.log(), worker.log()
