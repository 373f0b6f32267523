"""The schema as one file: the migrations add up to sql/schema.sql, every function has one
home (sql/functions.sql, re-applied by migrate when it changes), and a database migrated by
akadze before functions.sql existed upgrades to the same schema."""

from __future__ import annotations

import difflib
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import akadze_core.store.migrations as akadze_migrations
from akadze_core.store.migrations import (
    SCHEMA_FILE,
    Applied,
    apply_migrations,
    dump_schema,
    latest_version,
    pg_dump_candidates,
    repeatable_migrations,
)
from akadze_core.store.queries import migrations
from tests.conftest import create_database, database_url_for, drop_database
from tests.helpers import migrate_together

#: The last main whose migrations created the functions themselves: a database it migrated
#: must upgrade to schema.sql.
PREVIOUS_MAIN = "a4032db"
MIGRATIONS_DIR = "akadze_core/sql/migrations"
REGENERATE = "python -m tests.schema_dump"

needs_pg_dump = pytest.mark.skipif(not pg_dump_candidates(), reason="no pg_dump found")


@pytest.fixture
def schema_sql_dump(admin_url: str) -> Iterator[str]:
    """schema.sql applied to an empty database and dumped again, by the same pg_dump as the
    migrated databases it is compared with (so pg_dump's version cannot make a difference)."""
    name = create_database(admin_url, None)
    url = database_url_for(admin_url, name)
    try:
        with psycopg.connect(url) as connection:
            # As pg_dump's own output does: a function body is checked when it runs.
            connection.execute("SET LOCAL check_function_bodies = off")
            connection.execute(SCHEMA_FILE.read_text("utf-8").encode())
        yield dump_schema(url)
    finally:
        drop_database(admin_url, name)


def assert_same_schema(migrated: str, expected: str) -> None:
    """``migrated`` (a dump) is ``expected`` (schema.sql's dump), or the diff and the fix."""
    if migrated != expected:
        diff = "".join(difflib.unified_diff(
            expected.splitlines(keepends=True), migrated.splitlines(keepends=True),
            "schema.sql", "migrated"))
        pytest.fail(f"the migrations do not add up to akadze_core/sql/schema.sql: if the "
                    f"migrations are right, run `{REGENERATE}` and commit schema.sql\n{diff}")


@needs_pg_dump
def test_migrations_add_up_to_schema_sql(empty_database_url: str,
                                         schema_sql_dump: str) -> None:
    with psycopg.connect(empty_database_url, autocommit=True) as connection:
        apply_migrations(connection)
    assert_same_schema(dump_schema(empty_database_url), schema_sql_dump)


def previous_main_migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of the previous main's migration files, from git."""
    root = Path(__file__).resolve().parents[2]
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    listed = subprocess.run(["git", "ls-tree", "--name-only", f"{PREVIOUS_MAIN}:{MIGRATIONS_DIR}"],
                            cwd=root, capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        pytest.skip(f"commit {PREVIOUS_MAIN} is not in this checkout's history")
    found = []
    for name in listed.stdout.split():
        match = re.match(r"^(\d+)_(\w+)\.sql$", name)
        if match:
            text = subprocess.run(["git", "show", f"{PREVIOUS_MAIN}:{MIGRATIONS_DIR}/{name}"],
                                  cwd=root, capture_output=True, text=True, check=True).stdout
            found.append((int(match[1]), match[2], text))
    return sorted(found)


@needs_pg_dump
def test_a_database_migrated_by_the_previous_main_upgrades_to_schema_sql(
        empty_database_url: str, schema_sql_dump: str) -> None:
    old = previous_main_migrations()
    assert any("CREATE OR REPLACE FUNCTION akadze.settle" in sql for _v, _n, sql in old)
    with psycopg.connect(empty_database_url, autocommit=True) as connection:
        # What that main's migrate did: each file once, recorded in akadze.migrations.
        with connection.transaction():
            connection.execute("CREATE SCHEMA akadze")
            connection.execute("CREATE TABLE akadze.migrations (version integer PRIMARY KEY,"
                               " name text NOT NULL, applied_at timestamptz NOT NULL"
                               " DEFAULT now())")
            for version, name, sql in old:
                connection.execute(sql.encode())
                connection.execute("INSERT INTO akadze.migrations (version, name)"
                                   " VALUES (%s, %s)", (version, name))
        applied = apply_migrations(connection)
        newer = [version for version, _name, _sql in migrations() if version > old[-1][0]]
        assert applied == Applied(newer, ["functions.sql"])
        assert apply_migrations(connection) == Applied([], [])
    assert_same_schema(dump_schema(empty_database_url), schema_sql_dump)


def test_each_function_is_created_in_one_file_only() -> None:
    """No migration restates a function of functions.sql, nor another migration's."""
    creates = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([\w.]+)", re.IGNORECASE)
    homes: dict[str, list[str]] = {}
    files = [(f"migrations/{version:04d}_{name}.sql", sql) for version, name, sql in migrations()]
    files += [(name, sql) for name, _checksum, sql in repeatable_migrations()]
    for file, sql in files:
        for function in set(creates.findall(sql)):
            homes.setdefault(function.lower(), []).append(file)
    assert "akadze.settle" in homes
    assert {function: files for function, files in homes.items() if len(files) > 1} == {}
    assert homes["akadze.settle"] == ["functions.sql"]


def settle_source(connection: psycopg.Connection) -> str:
    row = connection.execute("SELECT prosrc FROM pg_proc"
                             " WHERE oid = 'akadze.settle(bigint[])'::regprocedure").fetchone()
    assert row is not None
    return str(row[0])


def make_functions_stale(connection: psycopg.Connection) -> None:
    """The state of a database migrated by an akadze whose functions.sql was older: another
    body of settle, another checksum."""
    connection.execute("CREATE OR REPLACE FUNCTION akadze.settle(finished bigint[])"
                       " RETURNS integer LANGUAGE sql AS 'SELECT 0'")
    connection.execute("UPDATE akadze.repeatable_migrations SET checksum = 'older'")


def test_an_edited_functions_file_is_re_applied_once(db: psycopg.Connection) -> None:
    current = settle_source(db)
    assert apply_migrations(db) == Applied([], [])
    make_functions_stale(db)
    assert settle_source(db).strip() == "SELECT 0"
    assert apply_migrations(db) == Applied([], ["functions.sql"])
    assert settle_source(db) == current
    (checksum,) = db.execute("SELECT checksum FROM akadze.repeatable_migrations"
                             " WHERE name = 'functions.sql'").fetchone() or (None,)
    assert checksum == repeatable_migrations()[0][1]
    assert apply_migrations(db) == Applied([], [])


def test_a_versioned_migration_re_applies_the_functions_whatever_their_checksum(
        db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """A migration's DDL may drop a function (here, before creating it with another
    signature would): functions.sql, unchanged, still runs after it."""
    dropping = (latest_version() + 1, "drop_settle", "DROP FUNCTION akadze.settle(bigint[])")
    monkeypatch.setattr(akadze_migrations, "migrations", lambda: [*migrations(), dropping])
    assert apply_migrations(db) == Applied([dropping[0]], ["functions.sql"])
    assert settle_source(db).strip() != "SELECT 0"


def test_concurrent_migrates_re_apply_a_changed_functions_file_once(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as connection:
        make_functions_stale(connection)
    results = migrate_together(database_url, apply_migrations)
    assert sorted(results, key=lambda applied: len(applied.repeatable)) == [
        Applied([], []), Applied([], []), Applied([], []), Applied([], ["functions.sql"])]
    with psycopg.connect(database_url, autocommit=True) as connection:
        assert settle_source(connection).strip() != "SELECT 0"


def test_an_older_akadze_leaves_a_newer_databases_functions_alone(
        db: psycopg.Connection) -> None:
    make_functions_stale(db)
    db.execute("INSERT INTO akadze.migrations (version, name) VALUES (%s, 'from_the_future')",
               (latest_version() + 1,))
    assert apply_migrations(db) == Applied([], [])
    assert settle_source(db).strip() == "SELECT 0"
