"""Enqueue workloads, in this process: one job per transaction against a bare psycopg
INSERT on a table of the same shape, and bulk ``enqueue_many`` against COPY."""

from __future__ import annotations

import json
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from akadze_core.store import database

from . import db
from .apps.core_app import NOOP, make_app

# What a hand-written enqueue would send: the same columns, one autocommit statement (so one
# round trip, like akadze's), psycopg preparing it after a few runs as it does for akadze.
BARE_INSERT = (
    f"INSERT INTO {db.BARE_TABLE} (task, queue, args, priority, scheduled_at, max_attempts,"
    " meta) VALUES (%s, %s, %s::jsonb, %s, now(), %s, %s::jsonb) RETURNING id")
BARE_COPY = (f"COPY {db.BARE_TABLE} (task, queue, args, priority, scheduled_at, max_attempts,"
             " meta) FROM STDIN")


@dataclass
class SingleEnqueueResult:
    """Jobs per second, one transaction each; ratios are medians of per-round ratios."""

    count: int
    akadze: float
    bare: float
    ratio: float
    compat: float | None = None
    compat_ratio: float | None = None
    compat_error: str | None = None
    # The bare INSERT of the very row .delay() writes (Celery's args and meta, and a uuid4
    # task id made per row when .delay() stores one), and .delay() against it: what the
    # facade adds, without the larger row's own cost.
    bare_compat_row: float | None = None
    compat_ratio_same_row: float | None = None


def single_enqueue(url: str, count: int, *, rounds: int = 50,
                   compat: bool = True) -> SingleEnqueueResult:
    """``noop.enqueue(n=i)`` vs ``INSERT ... RETURNING id`` (and ``delay()``), one
    transaction each. The sides take turns in ``rounds`` blocks, in alternating order, and
    the ratio is the median of the blocks' ratios: a change of machine load (or of the WAL
    flush time) during the run hits both sides alike."""
    db.reset(url)
    app = make_app(url)
    task = app.tasks[NOOP]
    celery_task, compat_error = _compat_task(url) if compat else (None, "skipped")
    per_round = max(1, count // rounds)
    sides: dict[str, Any] = {"akadze": lambda i: task.enqueue(n=i)}
    spent: dict[str, list[float]] = {"akadze": [], "bare": []}
    if celery_task is not None:
        sides["compat"] = celery_task.delay
        spent["compat"] = []
        spent["bare_compat_row"] = []
    try:
        with psycopg.connect(url, autocommit=True) as bare:
            sides["bare"] = lambda i: _bare_insert(bare, i)
            if celery_task is not None:
                queue, attempts, head, with_id = _delay_row(bare, celery_task.delay(0).job_id)
                sides["bare_compat_row"] = lambda i: _bare_insert(
                    bare, i, {"args": [i], "kwargs": {}},
                    f'{head}"task_id": "{uuid.uuid4()}"}}' if with_id else head, queue,
                    attempts)
            for i in range(20):  # warm up pools and prepared statements
                for call in sides.values():
                    call(i)
            order = list(spent)
            for round_number in range(rounds):
                for name in order if round_number % 2 == 0 else order[::-1]:
                    call = sides[name]
                    started = time.perf_counter()
                    for i in range(per_round):
                        call(i)
                    spent[name].append(time.perf_counter() - started)
    finally:
        app.close()
        if celery_task is not None:
            celery_task.app.close()
    done = per_round * rounds

    def rate(name: str) -> float:
        return done / sum(spent[name])

    def ratio(name: str, baseline: str = "bare") -> float:  # per round: bare's over the side's
        return statistics.median(b / s for b, s in zip(spent[baseline], spent[name],
                                                        strict=True))

    return SingleEnqueueResult(
        count=done, akadze=rate("akadze"), bare=rate("bare"), ratio=ratio("akadze"),
        compat=rate("compat") if "compat" in spent else None,
        compat_ratio=ratio("compat") if "compat" in spent else None,
        compat_error=compat_error,
        bare_compat_row=rate("bare_compat_row") if "compat" in spent else None,
        compat_ratio_same_row=ratio("compat", "bare_compat_row") if "compat" in spent else None)


def _bare_insert(connection: psycopg.Connection, n: int, args: Any = None,
                 meta: str = "{}", queue: str = "default", max_attempts: int = 3) -> int:
    row = connection.execute(BARE_INSERT, (NOOP, queue, json.dumps(
        {"n": n} if args is None else args), 0, max_attempts, meta)).fetchone()
    assert row is not None
    return int(row[0])


def _delay_row(connection: psycopg.Connection,
               job_id: int) -> tuple[str, int, str, bool]:
    """The queue, max_attempts and meta of the job a .delay() inserted (the same for every
    plain call), and whether it stored a task id. With one, the meta comes without the id
    and its closing brace, ready for a per-row ``"task_id"`` key; without (the id is derived
    from the job's own), the meta as it is: what a hand-written INSERT of the row would
    write."""
    row = connection.execute("SELECT queue, max_attempts, meta ? 'task_id',"
                             " (meta - 'task_id')::text FROM akadze.jobs WHERE id = %s",
                             (int(job_id),)).fetchone()
    assert row is not None
    if not row[2]:
        return str(row[0]), int(row[1]), str(row[3]), False
    text = str(row[3])[:-1].rstrip()
    return str(row[0]), int(row[1]), text if text == "{" else f"{text}, ", True


def _compat_task(url: str) -> tuple[Any, str | None]:
    try:
        from .apps.celery_app import NOOP as CELERY_NOOP
        from .apps.celery_app import make_app as make_celery_app

        celery = make_celery_app(url)
        task = celery.tasks[CELERY_NOOP]
        task.delay(0)
    except Exception as exc:  # the facade is being written: report, do not fail the run
        return None, f"{type(exc).__name__}: {exc}"
    return task, None


@dataclass
class BulkEnqueueResult:
    """Jobs per second of bulk inserts (``akadze_sql_only``: None when the engine's
    internals it relies on are not there)."""

    count: int
    batch: int
    akadze: float
    akadze_sql_only: float | None
    copy: float


def bulk_enqueue(url: str, count: int, *, batch: int) -> BulkEnqueueResult:
    """``enqueue_many`` in batches of ``batch`` (end to end, then its SQL alone with the
    arguments encoded beforehand) vs COPY of the same rows into the bare table."""
    app = make_app(url)
    task = app.tasks[NOOP]
    batches = [[{"n": n} for n in range(start, min(count, start + batch))]
               for start in range(0, count, batch)]
    try:
        task.enqueue_many(batches[0][:10])  # warm up the pool
        db.reset(url)
        started = time.perf_counter()
        for kwargs in batches:
            task.enqueue_many(kwargs)
        end_to_end = time.perf_counter() - started
        db.reset(url)
        sql_only = _sql_only(app, task, batches)
    finally:
        app.close()
    db.reset(url)
    with psycopg.connect(url, autocommit=True) as connection:
        started = time.perf_counter()
        for kwargs in batches:
            with connection.cursor() as cursor, cursor.copy(BARE_COPY) as copy:
                for item in kwargs:
                    copy.write_row((NOOP, "default", json.dumps(item), 0,
                                    _NOW, 3, "{}"))
        copied = time.perf_counter() - started
    db.reset(url)
    return BulkEnqueueResult(count=count, batch=batch, akadze=count / end_to_end,
                             akadze_sql_only=count / sql_only if sql_only else None,
                             copy=count / copied)


def _sql_only(app: Any, task: Any, batches: list[list[dict[str, int]]]) -> float | None:
    """Seconds ``database.insert_jobs`` takes for the batches, their arguments encoded
    beforehand: an internal API (it changes as enqueue_many is optimised), so this is
    skipped rather than failing when its shape is not one known here."""
    try:
        if hasattr(task, "requests"):  # one template request and the args texts
            prepared = [task.requests(chunk) for chunk in batches]
        else:  # one request per job
            prepared = [([task.request(kwargs) for kwargs in chunk],) for chunk in batches]
        started = time.perf_counter()
        for arguments in prepared:
            app.run_pooled(lambda connection, arguments=arguments:
                         database.insert_jobs(connection, *arguments))
        return time.perf_counter() - started
    except (TypeError, AttributeError, ValueError):
        return None


_NOW = "now"  # COPY's text format takes Postgres' special timestamp input 'now'
