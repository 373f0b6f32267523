"""Schema migrations: versioned, idempotent, safe when several processes run them at once;
and the embedded Postgres used when no database is configured."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from akadze_core import App, SchemaMissing
from akadze_core.store.database import check_schema
from akadze_core.store.migrations import latest_version, migrate
from akadze_core.store.queries import migrations
from tests.helpers import migrate_together

#: Every migration's version, in order (numbers are given out ahead, so there may be gaps
#: until every branch that holds one is merged).
VERSIONS = [version for version, _name, _sql in migrations()]


def test_migrate_applies_once_and_is_idempotent(empty_database_url: str) -> None:
    with psycopg.connect(empty_database_url, autocommit=True) as connection:
        with pytest.raises(SchemaMissing, match="akadze migrate"):
            check_schema(connection)
        assert migrate(connection) == VERSIONS
        assert migrate(connection) == []
        check_schema(connection)
        versions = connection.execute("SELECT version FROM akadze.migrations").fetchall()
        assert [row[0] for row in versions] == VERSIONS


def test_functions_not_re_applied_since_an_upgrade_are_named(empty_database_url: str) -> None:
    """The hot statements call functions of functions.sql: a database at the current
    version whose file was not re-applied since (migrated by older code) is refused with
    the command to run, not at the worker's first claim, and ``migrate`` mends it."""
    with psycopg.connect(empty_database_url, autocommit=True) as connection:
        migrate(connection)
        connection.execute("DROP FUNCTION akadze.claim_jobs")
        connection.execute("UPDATE akadze.repeatable_migrations SET checksum = 'older'")
        with pytest.raises(SchemaMissing, match=r"functions .* older .* run `akadze migrate`"):
            check_schema(connection)
        assert migrate(connection) == []
        check_schema(connection)


def test_concurrent_migrations_apply_each_version_once(empty_database_url: str) -> None:
    results = migrate_together(empty_database_url, migrate)
    assert sorted(results, key=len) == [[], [], [], VERSIONS]


def test_older_schema_is_reported(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute("DELETE FROM akadze.migrations WHERE version = %s",
                           (latest_version(),))
        if latest_version() == 1:
            with pytest.raises(SchemaMissing, match="not applied"):
                check_schema(connection)
        else:
            with pytest.raises(SchemaMissing, match="run `akadze migrate`"):
                check_schema(connection)


@pytest.mark.slow
def test_app_without_url_uses_the_embedded_postgres(tmp_path: Path) -> None:
    """No URL anywhere: App() starts pgserver under the project root's .akadze/ (found
    upwards from where it runs) and migrates it.

    Run in a subprocess so the embedded server stops with it (pgserver's cleanup).
    """
    script = (
        "import logging\n"
        "logging.basicConfig(level=logging.INFO, format='%(name)s: %(message)s')\n"
        "from akadze_core import App\n"
        "app = App()\n"
        "@app.task('ping')\n"
        "def ping() -> str:\n"
        "    return 'pong'\n"
        "job_id = ping.enqueue()\n"
        "with app.connect() as connection:\n"
        "    print('state', connection.execute('SELECT state FROM akadze.jobs WHERE id = %s',"
        " (job_id,)).fetchone()[0])\n"
        "app.close()\n"
    )
    (tmp_path / "pyproject.toml").touch()
    (tmp_path / "src").mkdir()
    env = {key: value for key, value in os.environ.items()
           if key not in ("AKADZE_DATABASE_URL", "AKADZE_HOME", "AKADZE_EMBEDDED_DIR")}
    completed = subprocess.run([sys.executable, "-c", script], cwd=tmp_path / "src", env=env,
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert "state queued" in completed.stdout
    assert (tmp_path / ".akadze" / "pgdata" / "PG_VERSION").exists()
    embedded_lines = [line for line in completed.stderr.splitlines()
                      if line.startswith("akadze.embedded")]
    assert len(embedded_lines) == 1, completed.stderr
    assert "embedded Postgres" in embedded_lines[0]


def test_logging_never_shows_the_password(caplog: pytest.LogCaptureFixture) -> None:
    app = App("postgresql://postgres:Hunter2Secret@127.0.0.1:1/nope")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(Exception) as raised:
        app.pool()
    assert "Hunter2Secret" not in str(raised.value)
    assert "Hunter2Secret" not in caplog.text
