"""Saved groups: ``GroupResult.save()`` / ``GroupResult.restore(id)`` (Celery's
``backend.save_group``).

A saved group is its ``as_tuple()`` form (the group id, its parent's and members' task ids)
in ``akadze.saved_groups`` (migration 0006); the members' states stay in their jobs.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from akadze_core.integration import dialect, load_queries, run_statement_sync

from .. import serialization

if TYPE_CHECKING:
    from ..app.base import Celery

__all__ = ["delete", "load", "save"]

_QUERIES = load_queries("akadze_compat", "sql/groups.sql")
#: The statements Citus mode runs in their place (akadze.saved_groups is a reference table).
_CITUS = load_queries("akadze_compat", "sql/groups_citus.sql")


def _run(app: Celery, name: str, **params: Any) -> list[dict[str, Any]]:
    text = _CITUS.get(name, _QUERIES[name]) if dialect() == "citus" else _QUERIES[name]
    return list(app.core.run_pooled(
        lambda connection: run_statement_sync(connection, text, **params)))


def save(app: Celery, group_id: str, value: Any) -> None:
    """Store a group's ``as_tuple()`` under its id (replacing a previous save)."""
    _run(app, "group_save", id=group_id, result=serialization.dumps(value))


def load(app: Celery, group_id: str) -> Any:
    """The ``as_tuple()`` form saved under ``group_id``, or None."""
    rows = _run(app, "group_load", id=group_id)
    if not rows:
        return None
    value = rows[0]["result"]
    return json.loads(value) if isinstance(value, str) else value


def delete(app: Celery, group_id: str) -> None:
    """Forget the group saved under ``group_id``."""
    _run(app, "group_delete", id=group_id)
