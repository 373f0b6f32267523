"""Schema migrations, idempotent and safe when several processes run them at once.

Two kinds of SQL files in ``akadze_core/sql/``, applied by :func:`migrate` in one transaction
under one advisory lock:

* ``migrations/NNNN_name.sql``, versioned: each runs once, in order, recorded in
  ``akadze.migrations``. Tables, columns, indexes, sequences, data.
* ``functions.sql``, repeatable: the SQL functions (``akadze.settle`` and its kin), each
  defined once, edited in place. It runs again whenever its text changes: its sha256 is
  recorded in ``akadze.repeatable_migrations``, and a database whose recorded checksum differs
  from this code's file gets the whole file re-applied (so does any database a versioned
  migration was just applied to, whose DDL may have dropped what the file creates). An
  edited function is thus never left stale in a migrated database, and no migration
  restates a function.

Order: the repeatable file runs after every versioned migration (as Flyway's do). On a fresh
database the functions are then created once the tables they read exist, and on a database
already migrated the versioned step has nothing left to do. What that asks of a migration:

* A versioned migration never needs a function that only ``functions.sql`` defines, since on
  a fresh database it does not exist yet when the migration runs. A trigger that binds one
  of the functions goes into ``functions.sql`` too (``CREATE OR REPLACE TRIGGER``); a backfill
  writes its SQL inline; a function an index expression reads belongs to the migration that
  creates the index (an index must never see its function change meaning).
* ``CREATE OR REPLACE FUNCTION`` cannot rename a function or change its arguments or return
  type: a versioned migration drops the old one (``DROP FUNCTION IF EXISTS``: on a fresh
  database it does not exist yet) and ``functions.sql`` creates the new one right after.
  Deleting a function from the file does not drop it: a migration does.
* Versioned migrations written before ``functions.sql`` existed created functions of their
  own; those statements were removed from them, which is safe for every database: one
  migrated before gets ``functions.sql`` re-applied by its first ``migrate`` of this code
  (it has no checksum recorded), one migrated after gets it after the migrations.

An older akadze run against a database a newer one migrated (a rolling upgrade) leaves the
functions alone: they belong to the newer code.

``sql/schema.sql`` is the current truth of the whole schema, dumped from a freshly migrated
database (:func:`dump_schema`); ``python -m tests.schema_dump`` regenerates it after a
migration or ``functions.sql`` changes, and the tests check the migrations add up to it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import NamedTuple

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..model.errors import SchemaMissing
from .queries import migrations

logger = logging.getLogger("akadze.migrations")

# Any constant works; it only has to be the same in every process that migrates.
_MIGRATION_LOCK = 0x616B61647A65

#: The repeatable files of ``akadze_core/sql``, applied in this order after the versioned
#: migrations whenever their text changes.
REPEATABLE = ("functions.sql",)


class Applied(NamedTuple):
    """What one :func:`apply_migrations` did."""

    #: The versioned migrations applied, in order (empty: the schema was current).
    versions: list[int]
    #: The repeatable files (re-)applied because their checksum had changed.
    repeatable: list[str]


def latest_version() -> int:
    """The schema version this akadze needs."""
    return migrations()[-1][0]


def repeatable_migrations() -> list[tuple[str, str, str]]:
    """(name, sha256 of the text, text) of every repeatable file, in order."""
    found = []
    for name in REPEATABLE:
        text = resources.files("akadze_core").joinpath("sql", name).read_text("utf-8")
        found.append((name, hashlib.sha256(text.encode()).hexdigest(), text))
    return found


def migrate(connection: psycopg.Connection, *, citus: bool = False,
            lanes: int | None = None) -> list[int]:
    """Apply the missing migrations and any changed repeatable file (:func:`apply_migrations`);
    with ``citus``, then distribute the tables for Citus mode (:func:`apply_citus`).

    Returns the versions applied (empty when the schema was already current).
    """
    versions = apply_migrations(connection).versions
    if citus:
        apply_citus(connection, lanes=lanes)
    return versions


def apply_migrations(connection: psycopg.Connection) -> Applied:
    """Apply the missing versioned migrations, then every repeatable file whose checksum
    differs from the recorded one, in one transaction under an advisory lock: a process
    running this at the same time waits, then finds everything recorded and does nothing."""
    with connection.transaction():
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        connection.execute("CREATE SCHEMA IF NOT EXISTS akadze")
        connection.execute(
            "CREATE TABLE IF NOT EXISTS akadze.migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        connection.execute(
            "CREATE TABLE IF NOT EXISTS akadze.repeatable_migrations ("
            " name text PRIMARY KEY, checksum text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in connection.execute("SELECT version FROM akadze.migrations")}
        versions = _apply_versioned(connection, done)
        if done and max(done) > latest_version():
            logger.warning("the akadze schema is at version %d, newer than this akadze's %d: "
                           "its functions are left as the newer akadze made them",
                           max(done), latest_version())
            return Applied(versions, [])
        # After a versioned migration the repeatable files run whatever their checksum: its
        # DDL may have dropped what they create (a DROP ... CASCADE, a DROP FUNCTION).
        return Applied(versions, _apply_repeatable(connection, always=bool(versions)))


def _apply_versioned(connection: psycopg.Connection, done: set[int]) -> list[int]:
    applied: list[int] = []
    for version, name, sql in migrations():
        if version in done:
            continue
        connection.execute(sql.encode())
        connection.execute(
            "INSERT INTO akadze.migrations (version, name) VALUES (%s, %s)", (version, name)
        )
        applied.append(version)
        logger.info("applied migration %04d_%s", version, name)
    return applied


def _apply_repeatable(connection: psycopg.Connection, *, always: bool) -> list[str]:
    recorded: dict[str, str] = dict(connection.execute(
        "SELECT name, checksum FROM akadze.repeatable_migrations").fetchall())
    applied: list[str] = []
    for name, checksum, sql in repeatable_migrations():
        if recorded.get(name) == checksum and not always:
            continue
        connection.execute(sql.encode())
        connection.execute(
            "INSERT INTO akadze.repeatable_migrations (name, checksum) VALUES (%s, %s)"
            " ON CONFLICT (name) DO UPDATE"
            " SET checksum = EXCLUDED.checksum, applied_at = now()", (name, checksum))
        applied.append(name)
        logger.info("applied %s (checksum %s)", name, checksum[:12])
    return applied


# --- Citus mode ---------------------------------------------------------------------------------

#: The Citus dialect's files in ``akadze_core/sql/citus``: distribute.sql runs once, after the
#: versioned migrations; functions.sql again whenever its checksum changes.
CITUS_DISTRIBUTE = "citus/distribute.sql"
CITUS_FUNCTIONS = "citus/functions.sql"
_STATEMENT_BREAK = re.compile(r"^-- statement[ \t]*$", re.MULTILINE)


def citus_statements(name: str) -> list[str]:
    """The statements of a Citus dialect file, in order: Citus forwards DDL to its workers a
    statement at a time, so the file is never sent whole."""
    text = resources.files("akadze_core").joinpath("sql", name).read_text("utf-8")
    return [part.strip() for part in _STATEMENT_BREAK.split(text)
            if any(line.strip() and not line.lstrip().startswith("--")
                   for line in part.splitlines())]


def apply_citus(connection: psycopg.Connection, *, lanes: int | None = None) -> list[str]:
    """Make a migrated coordinator's schema the Citus dialect's (the jobs table distributed
    by its shard, the small tables reference tables, the dialect's functions); returns the
    files applied. Idempotent under a session advisory lock. ``lanes`` (1-16): how many
    shards one queue's jobs without a tenant or unique key spread over.

    Each statement commits on its own: Citus refuses some DDL after other DDL in one
    transaction, so the connection must be in autocommit mode."""
    if not connection.autocommit:
        raise ValueError("apply_citus needs an autocommit connection (Citus applies DDL "
                         "statement by statement)")
    connection.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
    try:
        recorded: dict[str, str] = dict(connection.execute(
            "SELECT name, checksum FROM akadze.repeatable_migrations").fetchall())
        applied = []
        for name, once in ((CITUS_DISTRIBUTE, True), (CITUS_FUNCTIONS, False)):
            text = resources.files("akadze_core").joinpath("sql", name).read_text("utf-8")
            checksum = hashlib.sha256(text.encode()).hexdigest()
            if name in recorded and (once or recorded[name] == checksum):
                continue
            for statement in citus_statements(name):
                connection.execute(statement.encode())
            connection.execute(
                "INSERT INTO akadze.repeatable_migrations (name, checksum) VALUES (%s, %s)"
                " ON CONFLICT (name) DO UPDATE"
                " SET checksum = EXCLUDED.checksum, applied_at = now()", (name, checksum))
            applied.append(name)
            logger.info("applied %s", name)
        if lanes is not None:
            connection.execute("UPDATE akadze.citus_settings SET lanes = %s", (lanes,))
        return applied
    finally:
        connection.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))


SCHEMA_EXISTS = "SELECT to_regclass('akadze.migrations') IS NOT NULL"
SCHEMA_VERSION = "SELECT max(version) FROM akadze.migrations"


#: The command that applies the schema, as the core's messages name it.
MIGRATE_COMMAND = "akadze migrate"


def schema_missing(version: int | None = None,
                   command: str = MIGRATE_COMMAND) -> SchemaMissing:
    """The one error for a schema that is not applied (``version`` None) or is older than
    this code needs; every command and API call words it alike, naming ``command``."""
    if version is None:
        return SchemaMissing(f"the akadze schema is not applied to this database: run "
                             f"`{command}`")
    return SchemaMissing(f"the akadze schema is at version {version}, this akadze needs "
                         f"{latest_version()}: run `{command}`")


def check_version(version: int | None) -> None:
    """Raise ``SchemaMissing`` unless ``version`` is the one this code needs."""
    if version is None or version < latest_version():
        raise schema_missing(version)


# --- the schema as one file --------------------------------------------------------------------

#: Where the current schema is written (``python -m tests.schema_dump``).
SCHEMA_FILE = Path(__file__).resolve().parent.parent / "sql" / "schema.sql"

_SCHEMA_HEADER = """\
-- The akadze schema as the migrations leave a database (akadze_core/store/migrations.py): its
-- tables, indexes, sequences and functions, dumped by pg_dump from a freshly migrated
-- database. Generated, not applied by anything: edit a migration or sql/functions.sql, then
-- regenerate it with
--     python -m tests.schema_dump
-- (tests/integration/test_schema.py checks that the migrations add up to it).

"""

# A dollar-quote tag ($$, $_$, $body$) or a single-quoted string, for telling pg_dump's own
# lines from lines inside a function body.
_QUOTES = re.compile(r"'(?:[^']|'')*'|\$([A-Za-z_]\w*)?\$")


def normalise_dump(text: str) -> str:
    """``pg_dump --schema-only`` output made stable and readable: without its comment lines,
    its session settings (SET, set_config, ``\\restrict``) and runs of blank lines. Lines inside
    a function body are kept as they are."""
    kept: list[str] = []
    open_tag: str | None = None
    for line in text.splitlines():
        if open_tag is None and (line.startswith(("--", "SET ", "\\restrict", "\\unrestrict"))
                                 or line.startswith("SELECT pg_catalog.set_config(")):
            continue
        for match in _QUOTES.finditer(line):
            token = match.group(0)
            if token.startswith("'"):
                continue
            if open_tag is None:
                open_tag = token
            elif token == open_tag:
                open_tag = None
        if line.strip() or (kept and kept[-1].strip()):
            kept.append(line.rstrip())
    while kept and not kept[-1].strip():
        kept.pop()
    return "\n".join(kept) + "\n"


def pg_dump_candidates() -> list[str]:
    """pg_dump programs to try, in order: the one on PATH, Debian's per-version ones (newest
    first), the embedded Postgres's (pgserver)."""
    found = [path for path in [shutil.which("pg_dump")] if path]
    found += [str(path) for path in sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_dump"),
                                           key=lambda p: int(p.parts[-3]) if
                                           p.parts[-3].isdigit() else 0, reverse=True)]
    # The embedded Postgres (pgserver, an optional dependency) ships its own binaries.
    embedded = importlib.util.find_spec("pgserver")
    if embedded is not None and embedded.submodule_search_locations:
        found.append(str(Path(next(iter(embedded.submodule_search_locations)))
                         / "pginstall" / "bin" / "pg_dump"))
    return [path for index, path in enumerate(found)
            if os.access(path, os.X_OK) and path not in found[:index]]


def dump_schema(url: str) -> str:
    """The akadze schema of the database at ``url``, as pg_dump prints it (no owners, no
    privileges), normalised by :func:`normalise_dump`. Tries each of
    :func:`pg_dump_candidates` (one older than the server refuses); raises ``RuntimeError``
    when none could dump it. The password goes to pg_dump in its environment, never on its
    command line."""
    params = conninfo_to_dict(url)
    env = dict(os.environ)
    password = params.pop("password", None)
    if password is not None:
        env["PGPASSWORD"] = str(password)
    command = ["--schema-only", "--schema=akadze", "--no-owner", "--no-privileges",
               "--no-tablespaces", f"--dbname={make_conninfo('', **params)}"]
    failures = []
    for program in pg_dump_candidates():
        completed = subprocess.run([program, *command], env=env, capture_output=True,
                                   text=True, check=False)
        if completed.returncode == 0:
            return normalise_dump(completed.stdout)
        failures.append(f"{program}: {completed.stderr.strip()}")
    raise RuntimeError("could not dump the akadze schema: "
                       + ("; ".join(failures) or "no pg_dump found"))


def schema_file_text(dump: str) -> str:
    """The text of ``sql/schema.sql`` for a :func:`dump_schema` result."""
    return _SCHEMA_HEADER + dump
