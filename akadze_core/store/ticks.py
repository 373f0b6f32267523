"""The schedules' statements: the database's clock (schedules run on it, never on a
worker's), the schedules' state rows, ticks recorded or enqueued at most once across the
fleet, and the runtime schedules' versions. Run through ``database``'s named-query calls,
like every statement of ``sql/queries.sql``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from .database import JobRequest, execute_query, fetch_all_async, fetch_one_async


async def schedule_clock(connection: psycopg.AsyncConnection) -> datetime:
    """The database's ``now()``: schedules run on its clock, never on a worker's."""
    clock = await fetch_one_async(connection, "schedule_clock")
    assert clock is not None
    return clock["now"]  # type: ignore[no-any-return]


async def schedule_states(
    connection: psycopg.AsyncConnection, names: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """The state rows of the schedules ``names``, by name."""
    rows = await fetch_all_async(connection, "schedule_list", names=list(names))
    return {row["name"]: row for row in rows}


async def record_schedule_tick(
    connection: psycopg.AsyncConnection, name: str, spec: str, tick: datetime, *, reset: bool
) -> bool:
    """Record ``tick`` as accounted for without enqueueing it: for a schedule seen for the
    first time, or (``reset``) one whose spec changed. False if another worker did it."""
    changed = await execute_query(connection, "schedule_reset" if reset else "schedule_start",
                                  name=name, spec=spec, tick=tick)
    return changed > 0


async def enqueue_schedule_tick(
    connection: psycopg.AsyncConnection, request: JobRequest, *, name: str, spec: str,
    tick: datetime, expected: datetime | None = None,
) -> int | None:
    """Advance schedule ``name`` to ``tick`` and insert ``request`` in one statement; returns
    the job id, or None when the tick was taken already (or the stored spec differs, or the
    stored last tick is no longer ``expected`` when that is given)."""
    row = await fetch_one_async(connection, "schedule_enqueue", **request.params(), name=name,
                                spec=spec, tick=tick, expected=expected)
    return int(row["id"]) if row else None


# The runtime schedules (the worker's side; the API's statements go through fetch_one).

async def runtime_schedule_timing(
    connection: psycopg.AsyncConnection, names: Sequence[str]
) -> list[dict[str, Any]]:
    """Name, spec, paused, version and last tick of the runtime schedules ``names`` that
    exist (a name missing from the answer was removed)."""
    return await fetch_all_async(connection, "schedule_runtime_timing", names=list(names))


async def runtime_schedule_versions(connection: psycopg.AsyncConnection) -> dict[str, int]:
    """Every runtime schedule's version, by name."""
    rows = await fetch_all_async(connection, "schedule_runtime_versions")
    return {row["name"]: int(row["version"]) for row in rows}


async def runtime_schedule_fingerprint(
    connection: psycopg.AsyncConnection
) -> tuple[int, int, int]:
    """(count, sum, max) of the runtime schedules' versions: changed by any add, change or
    removal."""
    row = await fetch_one_async(connection, "schedule_runtime_fingerprint")
    assert row is not None
    return int(row["count"]), int(row["total"]), int(row["newest"])


async def enqueue_runtime_ticks(
    connection: psycopg.AsyncConnection, ticks: Sequence[tuple[str, int, Any, str, Any]]
) -> int:
    """Enqueue one tick per runtime schedule of ``ticks`` (``timetable.DueTick``: name,
    version, tick, tick as ISO text, ...) in one statement, each at most once across the
    fleet; returns how many jobs this call inserted (the others were taken already, paused,
    changed or removed).

    The ticks travel as one JSON text: adapting arrays of names and datetimes cost psycopg
    about 8 µs per tick, more than everything else a pass does for it."""
    due = json.dumps([[tick[0], tick[1], tick[3]] for tick in ticks])
    rows = await fetch_all_async(connection, "schedule_runtime_enqueue", due=due)
    return sum(int(row["jobs"]) for row in rows)
