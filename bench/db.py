"""The benchmark's own database: dropped and created fresh, and never any other one.

Every workload starts from empty tables (``reset``); backlogs are generated in SQL with
``generate_series`` (how they are filled is not what is measured). ``bench_bare.jobs`` has the
shape of ``akadze.jobs`` (columns, defaults, indexes, storage settings) for the bare-psycopg
baselines.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def migrate(connection: psycopg.Connection) -> None:
    """akadze's ``migrate`` from wherever the installed build has it: ``bench.ab`` runs this
    harness on older commits too, from before akadze_core's subpackages
    (``akadze_core.migrations`` then)."""
    for name in ("akadze_core.store.migrations", "akadze_core.migrations"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise  # the module is there, something it imports is not
            continue
        module.migrate(connection)
        return
    raise ModuleNotFoundError("akadze_core's migrations module")


DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
ADMIN_URL_ENV = "AKADZE_BENCH_ADMIN_URL"
DEFAULT_NAME = "akadze_bench"
# A safety catch: the benchmark drops its database, so it only ever touches these names.
NAME_PREFIX = "akadze_bench"

BARE_TABLE = "bench_bare.jobs"
# The storage settings of akadze.jobs (LIKE ... INCLUDING ALL does not copy them).
_BARE_SCHEMA = """
CREATE SCHEMA bench_bare;
CREATE TABLE bench_bare.jobs (LIKE akadze.jobs INCLUDING ALL)
    WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02,
          autovacuum_analyze_scale_factor = 0.02);
"""


def admin_url(explicit: str | None = None) -> str:
    """The admin URL: ``explicit``, else ``$AKADZE_BENCH_ADMIN_URL``, else local Postgres."""
    return explicit or os.environ.get(ADMIN_URL_ENV) or DEFAULT_ADMIN_URL


def url_for(admin: str, name: str) -> str:
    """``admin`` pointed at database ``name``."""
    params = conninfo_to_dict(admin)
    params["dbname"] = name
    return make_conninfo(**params)


def _checked(name: str) -> str:
    if not name.startswith(NAME_PREFIX):
        raise ValueError(f"refusing database {name!r}: benchmark databases are named "
                         f"{NAME_PREFIX}*")
    return name


def checked_name(name: str) -> str:
    """``name`` if it is a benchmark database's name, else ValueError."""
    return _checked(name)


def recreate(admin: str, name: str = DEFAULT_NAME) -> str:
    """Drop and create database ``name`` with the akadze schema; returns its URL."""
    drop(admin, _checked(name))
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(_checked(name))))
    url = url_for(admin, name)
    with psycopg.connect(url, autocommit=True) as connection:
        migrate(connection)
        connection.execute(_BARE_SCHEMA)
    return url


def drop(admin: str, name: str = DEFAULT_NAME) -> None:
    """Drop database ``name`` (only a benchmark database), disconnecting its sessions."""
    statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
        sql.Identifier(_checked(name)))
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(statement)


def reset(url: str) -> None:
    """Empty the jobs, workers and bare tables (and restart their ids)."""
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f"TRUNCATE akadze.jobs, akadze.workers, {BARE_TABLE} "
                           "RESTART IDENTITY")


def fill(url: str, count: int, *, task: str, queue: str = "default",
         delay_seconds: float = 0.0, chunk: int = 250_000) -> None:
    """Insert ``count`` queued jobs of ``task`` (due in ``delay_seconds``) and ANALYZE.

    ANALYZE because this server may run without autovacuum (then nothing else would): the
    figures are for a table with current statistics, as autovacuum keeps it in production.
    """
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("SET synchronous_commit = off")
        done = 0
        while done < count:
            size = min(chunk, count - done)
            connection.execute(
                "INSERT INTO akadze.jobs (task, queue, args, scheduled_at)"
                " SELECT %(task)s, %(queue)s, jsonb_build_object('n', i),"
                "        now() + %(delay)s * interval '1 second'"
                " FROM generate_series(%(start)s::int, %(stop)s::int) AS i",
                {"task": task, "queue": queue, "delay": delay_seconds,
                 "start": done + 1, "stop": done + size})
            done += size
        connection.execute("ANALYZE akadze.jobs")


def clone_job(url: str, job_id: int, copies: int) -> None:
    """Insert ``copies`` more rows identical to job ``job_id`` (task, queue, args, meta,
    when due...), as if enqueued the same way that many times, each with its own uuid4
    task id when the original has one (``.delay()`` rows do); then ANALYZE."""
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("SET synchronous_commit = off")
        connection.execute(
            "INSERT INTO akadze.jobs (task, queue, args, priority, max_attempts, expires_at,"
            "                         meta, scheduled_at)"
            " SELECT task, queue, args, priority, max_attempts, expires_at,"
            "        CASE WHEN meta ? 'task_id' THEN jsonb_set(meta, '{task_id}',"
            "                  to_jsonb(gen_random_uuid()::text)) ELSE meta END, scheduled_at"
            " FROM akadze.jobs, generate_series(1, %(copies)s::int)"
            " WHERE id = %(id)s", {"id": job_id, "copies": copies})
        connection.execute("ANALYZE akadze.jobs")


def unfinished(connection: psycopg.Connection, after_id: int = 0) -> bool:
    """Whether any job is still queued or running (two probes of partial indexes); with
    ``after_id``, only among the jobs of ids above it (a drain behind a standing backlog,
    which stays queued, read through the primary key)."""
    if after_id:
        row = connection.execute(
            "SELECT EXISTS (SELECT 1 FROM akadze.jobs WHERE id > %s"
            "               AND state IN ('queued', 'running'))", (after_id,)).fetchone()
        return bool(row and row[0])
    row = connection.execute(
        "SELECT EXISTS (SELECT 1 FROM akadze.jobs WHERE state = 'queued')"
        " OR EXISTS (SELECT 1 FROM akadze.jobs WHERE state = 'running')").fetchone()
    return bool(row and row[0])


def drain_window(connection: psycopg.Connection, after_id: int = 0) -> dict[str, Any]:
    """Counts by outcome and the window from the first claim to the last outcome write
    (database clock, as epoch seconds), and when the first and the last tenth of the
    finished jobs were done (``tenth``: the 10th percentile of ``finished_at``, ``ninth``:
    the 90th), for the rate at the start and at the end of a drain. Only the jobs of ids
    above ``after_id`` count (the backlog a drain runs behind does not)."""
    row = connection.execute(
        "SELECT count(*) FILTER (WHERE state = 'succeeded'), count(*), count(finished_at),"
        " extract(epoch FROM min(started_at))::float8,"
        " extract(epoch FROM max(finished_at))::float8,"
        " extract(epoch FROM percentile_disc(0.1) WITHIN GROUP (ORDER BY finished_at))::float8,"
        " extract(epoch FROM percentile_disc(0.9) WITHIN GROUP (ORDER BY finished_at))::float8"
        " FROM akadze.jobs WHERE id > %s", (after_id,)).fetchone()
    assert row is not None
    succeeded, total, finished, first, last, tenth, ninth = row
    return {"succeeded": succeeded, "total": total, "finished": finished, "first_start": first,
            "last_finish": last, "tenth": tenth, "ninth": ninth}


def backend_pids(connection: psycopg.Connection) -> list[int]:
    """The server processes of the other sessions on this database (the worker's)."""
    rows = connection.execute(
        "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        "   AND backend_type = 'client backend'").fetchall()
    return [row[0] for row in rows]


def server_facts(url: str) -> dict[str, str]:
    """The server version and the settings that move the figures."""
    names = ("server_version", "fsync", "synchronous_commit", "autovacuum", "shared_buffers",
             "max_connections")
    with psycopg.connect(url, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
            (list(names),)).fetchall()
    return dict(rows)
