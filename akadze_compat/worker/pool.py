"""``-P prefork``: Celery's prefork pool on akadze_core's process pool.

The worker process claims jobs for every process in one statement and writes outcomes in
batches; its children (fresh interpreters re-running the same command, never forks) only
run task bodies, one at a time each, as Celery's pool processes do. What Celery users
rely on carries over: ``-c`` children, ``--max-tasks-per-child``, a child killed from
outside is replaced (a task it was running ends with ``ProcessLost`` and is retried), a
task past its hard time limit ends with its process, children exit when the worker goes.
See ``akadze_core.processes`` for the mechanics.
"""

from __future__ import annotations

from dataclasses import dataclass

from akadze_core.processes import CHILD_ENV, child_number, is_child

__all__ = ["CHILD_ENV", "ChildInfo", "child_info"]


@dataclass(frozen=True)
class ChildInfo:
    """A pool child's place in its pool (Celery names it ``ForkPoolWorker-<number>``)."""

    number: int


def child_info() -> ChildInfo | None:
    """This process's place in a prefork pool, or None when it is not a pool child."""
    return ChildInfo(child_number()) if is_child() else None
