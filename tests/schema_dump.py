"""Regenerate akadze_core/sql/schema.sql: migrate a scratch database, dump its akadze schema.

    python -m tests.schema_dump            # rewrite schema.sql
    python -m tests.schema_dump --check    # exit 1 if schema.sql is not what migrate makes

The scratch database is created (and dropped) on the server of ``--admin-url``, else
``AKADZE_TEST_DATABASE_URL``, else the local Postgres the tests use; pg_dump comes from PATH,
Debian's /usr/lib/postgresql or the embedded Postgres (akadze_core.store.migrations).
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import uuid

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from akadze_core.store.migrations import SCHEMA_FILE, dump_schema, migrate, schema_file_text

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def current_schema(admin_url: str) -> str:
    """The text schema.sql should hold: a fresh database on ``admin_url``'s server, migrated
    and dumped."""
    name = f"akadze_schema_dump_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = make_conninfo(**{**conninfo_to_dict(admin_url), "dbname": name})
        with psycopg.connect(url, autocommit=True) as connection:
            migrate(connection)
        return schema_file_text(dump_schema(url))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, compare) schema.sql; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admin-url", default=os.environ.get("AKADZE_TEST_DATABASE_URL",
                                                              DEFAULT_ADMIN_URL),
                        help="a Postgres URL allowed to create databases")
    parser.add_argument("--check", action="store_true",
                        help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    text = current_schema(args.admin_url)
    old = SCHEMA_FILE.read_text("utf-8") if SCHEMA_FILE.exists() else ""
    if args.check:
        if old == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            old.splitlines(keepends=True), text.splitlines(keepends=True),
            "schema.sql", "migrated"))
        print(f"{SCHEMA_FILE} is out of date: run `python -m tests.schema_dump`",
              file=sys.stderr)
        return 1
    SCHEMA_FILE.write_text(text, "utf-8")
    print(f"wrote {SCHEMA_FILE}" + ("" if old != text else " (unchanged)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
