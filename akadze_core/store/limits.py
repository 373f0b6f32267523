"""The rate limits table and the limited claim's wake-up time (docs/how-to/limits.md)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg

from ..model.limits import Rate
from .database import fetch_all, fetch_all_async, fetch_one, fetch_one_async

KINDS = ("queue", "task")


def _params(kind: str, name: str, rate: Rate | None) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"a limit is on a 'queue' or a 'task', not {kind!r}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"a limit's {kind} name must be a non-empty str, not {name!r}")
    if rate is None:
        return {"kind": kind, "name": name}
    return {"kind": kind, "name": name, "rate": rate.count, "period": rate.period}


def set_limit(connection: psycopg.Connection, kind: str, name: str, rate: Rate | None) -> bool:
    """Set (or with ``rate`` None remove) the rate limit of a queue or a task; returns
    whether a limit is now set (with None: whether one was removed)."""
    params = _params(kind, name, rate)
    if rate is None:
        return fetch_one(connection, "limit_clear", **params) is not None
    return fetch_one(connection, "limit_set", **params) is not None


def list_limits(connection: psycopg.Connection) -> list[dict[str, Any]]:
    """Every rate limit: kind, name, rate and period (seconds)."""
    return fetch_all(connection, "limit_list")


async def declare(connection: psycopg.AsyncConnection,
                        limits: Iterable[tuple[str, str, Rate]]) -> None:
    """Set each (kind, name, rate) of ``limits`` (the ones an app's tasks declare)."""
    for kind, name, rate in limits:
        await fetch_one_async(connection, "limit_set", **_params(kind, name, rate))


async def room_wait(connection: psycopg.AsyncConnection, queue: str) -> float | None:
    """Seconds until a limit binding ``queue``'s claims may have room again (None: none of
    them has a start in its window); only asked after a claim that came back short."""
    row = await fetch_one_async(connection, "limit_wait", queue=queue)
    return None if row is None or row["wait"] is None else max(0.0, float(row["wait"]))


async def limited_queues(connection: psycopg.AsyncConnection, queues: list[str]) -> set[str]:
    """Which of ``queues`` have their claims go through the limited claim now."""
    return {row["name"] for row in await fetch_all_async(connection, "limit_queues",
                                                         queues=queues)}
