"""A task's error that quotes the database URL is stored without its password.

The worker log always scrubbed it, but the row is read by others who do not know that
password (``akadze jobs show`` and the dashboard with another role's URL, a client's
``AsyncResult.result``): the error entry is scrubbed when it is made, in the worker.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import psycopg
from click.testing import CliRunner
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from akadze_core import App
from akadze_core.cli.main import cli
from tests.dashboard.support import dashboard
from tests.helpers import job
from tests.integration.outcome_helpers import ran, run_until

PASSWORD = "Pa55-wOrd-9f3k"


def with_password(url: str) -> str:
    """``url`` with PASSWORD (the test server trusts every login, so it still connects)."""
    return make_conninfo(**{**conninfo_to_dict(url), "password": PASSWORD})


def as_uri(url: str) -> str:
    """The URI spelling of a key/value DSN, password included."""
    params = conninfo_to_dict(url)
    return (f"postgresql://{params['user']}:{params['password']}@{params['host']}:"
            f"{params.get('port', 5432)}/{params['dbname']}")


async def test_a_task_error_quoting_the_dsn_is_stored_and_shown_without_the_password(
        database_url: str, db: psycopg.Connection, tmp_path: Path) -> None:
    url = with_password(database_url)
    uri = as_uri(url)
    app = App(url)

    @app.task("leaky", max_attempts=1)
    async def leaky() -> None:
        try:
            raise OSError(f"the key/value form: {url}")
        except OSError as cause:
            # The message quotes the URI, an argument the bare password and a structure the
            # DSN; the traceback the cause's message too.
            raise RuntimeError(f"cannot reach {uri}", {"dsn": url, "pw": [PASSWORD]},
                                  f"password was {PASSWORD}") from cause

    job_id = int(await leaky.enqueue_async())
    try:
        await run_until(app, ran(db, job_id))
    finally:
        await app.close_async()

    row = job(db, job_id)
    assert row["state"] == "failed"
    stored = db.execute("SELECT errors::text FROM akadze.jobs WHERE id = %s",
                        [job_id]).fetchone()
    assert stored is not None and PASSWORD not in stored[0]
    entry = row["errors"][-1]
    assert entry["type"] == "RuntimeError"
    assert "cannot reach postgresql://postgres:***@127.0.0.1:" in entry["message"]
    assert entry["args"][0].startswith("cannot reach postgresql://postgres:***@127.0.0.1:")
    assert "the key/value form: " in entry["traceback"] and "password=***" in entry["traceback"]
    assert entry["args"][1] == {"dsn": entry["args"][1]["dsn"], "pw": ["***"]}
    assert entry["args"][2] == "password was ***"

    # The CLI run with a URL that has no password (another role, another host) cannot
    # scrub what it does not know: the row itself must be clean.
    for args in (["jobs", "show", str(job_id)], ["jobs", "show", str(job_id), "--json"]):
        shown = CliRunner().invoke(cli, args, env={"AKADZE_DATABASE_URL": database_url})
        assert shown.exit_code == 0, shown.output
        assert PASSWORD not in shown.output and "cannot reach" in shown.output
    shown_json = json.loads(CliRunner().invoke(
        cli, ["jobs", "show", str(job_id), "--json"],
        env={"AKADZE_DATABASE_URL": database_url}).stdout)
    assert "RuntimeError" in shown_json["errors"][-1]["traceback"]
    # The dashboard's job page, served with that other URL.
    with dashboard(database_url, tmp_path) as served:
        page = urllib.request.urlopen(f"{served.base}/jobs/{job_id}", timeout=10).read()
    assert b"cannot reach postgresql://postgres:***@" in page
    assert PASSWORD.encode() not in page


async def test_a_celery_tasks_failure_reads_back_without_the_password(
        database_url: str, db: psycopg.Connection) -> None:
    from akadze_compat import Celery
    from akadze_compat.exceptions import Ignore
    from tests.compat.conftest import work

    url = with_password(database_url)
    worker_app = Celery("proj", broker=url, set_as_current=False)
    reader = Celery("proj", broker=database_url, set_as_current=False)

    @worker_app.task(name="t.leaky")
    def leaky() -> None:
        raise RuntimeError(f"cannot reach {as_uri(url)}", PASSWORD)

    @worker_app.task(name="t.custom", bind=True)
    def custom(self: object) -> None:
        # Celery's way to end with a failure of one's own: stored as the task's meta.
        self.backend.mark_as_failure(self.request.id,  # type: ignore[attr-defined]
                                     ValueError(f"bad {url}"))
        raise Ignore()

    failed, marked = leaky.delay(), custom.delay()
    try:
        await work(worker_app, lambda: failed.ready() and marked.ready())
        exc = reader.AsyncResult(failed.id).result
        assert type(exc) is RuntimeError
        assert exc.args[0].startswith("cannot reach postgresql://postgres:***@")
        assert exc.args[1] == "***"
        assert PASSWORD not in (reader.AsyncResult(failed.id).traceback or "x")
        own = reader.AsyncResult(marked.id).result
        assert type(own) is ValueError and "password=***" in str(own)
        stored = db.execute("SELECT string_agg(errors::text || meta::text, '') "
                            "FROM akadze.jobs").fetchone()
        assert stored is not None and PASSWORD not in stored[0]
    finally:
        for app in (worker_app, reader):
            if app._core is not None:
                await app._core.close_async()
            app.close()
