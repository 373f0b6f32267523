"""Saved groups: ``GroupResult.save()`` / ``GroupResult.restore(id)`` (Celery's
``backend.save_group``).

A saved group is its ``as_tuple()`` form (the group id, its parent's and members' task ids)
in ``akadze.compat_groups``. That table is made here on first use (``CREATE TABLE IF NOT
EXISTS``) until the core's migrations carry it; the members' states stay in their jobs.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

if TYPE_CHECKING:
    import psycopg

    from ..app.base import Celery

__all__ = ["delete", "load", "save"]

_CREATE = """
CREATE TABLE IF NOT EXISTS akadze.compat_groups (
    id text PRIMARY KEY,
    result jsonb NOT NULL,
    saved_at timestamptz NOT NULL DEFAULT now()
)
"""
_SAVE = """
INSERT INTO akadze.compat_groups (id, result) VALUES (%(id)s, %(result)s)
ON CONFLICT (id) DO UPDATE SET result = excluded.result, saved_at = now()
"""


def _run(app: Celery, statement: str, params: dict[str, Any]) -> Any:
    def call(connection: psycopg.Connection) -> Any:
        with connection.cursor() as cursor:
            try:
                cursor.execute(statement, params)
            except Exception as exc:
                if getattr(exc, "sqlstate", None) != "42P01":  # undefined_table
                    raise
                cursor.execute(_CREATE)
                cursor.execute(statement, params)
            return cursor.fetchone() if cursor.description else None

    return app.core.run_pooled(call)


def save(app: Celery, group_id: str, value: Any) -> None:
    """Store a group's ``as_tuple()`` under its id (replacing a previous save)."""
    _run(app, _SAVE, {"id": group_id, "result": Jsonb(value)})


def load(app: Celery, group_id: str) -> Any:
    """The ``as_tuple()`` form saved under ``group_id``, or None."""
    row = _run(app, "SELECT result FROM akadze.compat_groups WHERE id = %(id)s",
               {"id": group_id})
    if row is None:
        return None
    value = row[0] if not isinstance(row, dict) else row["result"]
    return json.loads(value) if isinstance(value, str) else value


def delete(app: Celery, group_id: str) -> None:
    """Forget the group saved under ``group_id``."""
    _run(app, "DELETE FROM akadze.compat_groups WHERE id = %(id)s", {"id": group_id})
