"""Versioned, idempotent schema migrations, safe when several processes run them at once."""

from __future__ import annotations

import logging

import psycopg

from .errors import SchemaMissing
from .queries import migrations

logger = logging.getLogger("akadze.migrations")

# Any constant works; it only has to be the same in every process that migrates.
_MIGRATION_LOCK = 0x616B61647A65


def latest_version() -> int:
    """The schema version this akadze needs."""
    return migrations()[-1][0]


def migrate(connection: psycopg.Connection) -> list[int]:
    """Apply the missing migrations in one transaction under an advisory lock.

    Returns the versions applied (empty when the schema was already current).
    """
    applied: list[int] = []
    with connection.transaction():
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        connection.execute("CREATE SCHEMA IF NOT EXISTS akadze")
        connection.execute(
            "CREATE TABLE IF NOT EXISTS akadze.migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in connection.execute("SELECT version FROM akadze.migrations")}
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
