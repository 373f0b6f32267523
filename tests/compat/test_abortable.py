"""``akadze_compat.contrib.abortable`` against Celery 5.7's ``celery.contrib.abortable``:
ABORTED while an aborted task runs, ``is_aborted()`` in the body and on the result, what a
body that returns or raises after the abort ends in (an in-process worker, real Postgres)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from akadze_compat import Celery, states
from akadze_compat.contrib.abortable import ABORTED, AbortableAsyncResult, AbortableTask
from akadze_compat.result import EagerResult
from tests.compat.conftest import work
from tests.helpers import job


def _abort_while_running(result: AbortableAsyncResult, started: threading.Event,
                         go_on: threading.Event, seen: list[Any]) -> Any:
    """A ``work`` predicate: once the body started, abort it and note what the result says
    while it still runs, then let the body go on."""
    def check() -> bool:
        if started.is_set() and not go_on.is_set():
            result.abort()
            seen.extend([result.state, result.is_aborted(), result.ready()])
            go_on.set()
        return result.ready()

    return check


async def test_a_running_task_reads_aborted_and_a_return_ends_it_success(
        celery: Celery, db: psycopg.Connection) -> None:
    started, go_on = threading.Event(), threading.Event()
    inside: list[bool] = []

    @celery.task(bind=True, base=AbortableTask)
    def export(self: AbortableTask) -> str:
        inside.append(self.is_aborted())
        started.set()
        go_on.wait(10)
        inside.append(self.is_aborted())
        return "stopped early" if self.is_aborted() else "ran to the end"

    result = export.delay()
    assert isinstance(result, AbortableAsyncResult)
    seen: list[Any] = []
    await work(celery, _abort_while_running(result, started, go_on, seen))
    # While it runs after the abort: ABORTED, not ready (Celery's state until the task ends).
    assert seen == [ABORTED, True, False]
    assert inside == [False, True]
    # A body that returns after the abort ends SUCCESS with its value, as in Celery; the
    # result no longer reads aborted (Celery: the state is SUCCESS, not ABORTED).
    assert result.get(timeout=5) == "stopped early"
    assert result.state == states.SUCCESS and not result.is_aborted()


async def test_a_body_that_raises_after_the_abort_ends_revoked_unspent(
        celery: Celery, db: psycopg.Connection) -> None:
    started, go_on = threading.Event(), threading.Event()

    @celery.task(bind=True, base=AbortableTask)
    def export(self: AbortableTask) -> None:
        started.set()
        go_on.wait(10)
        if self.is_aborted():
            raise RuntimeError("aborted")

    result = export.delay()
    seen: list[Any] = []
    await work(celery, _abort_while_running(result, started, go_on, seen))
    assert seen[0] == ABORTED
    assert result.state == states.REVOKED and result.is_aborted()
    row = job(db, result.job_id)
    assert (row["state"], row["attempt"]) == ("cancelled", 0)


async def test_is_aborted_of_another_task_by_id(celery: Celery) -> None:
    started, go_on = threading.Event(), threading.Event()
    looked: list[bool] = []

    @celery.task
    def plain() -> None:
        started.set()
        go_on.wait(10)  # until the watcher looked: it must see a task still running

    @celery.task(bind=True, base=AbortableTask)
    def watcher(self: AbortableTask, task_id: str) -> None:
        looked.append(self.is_aborted(task_id=task_id))
        go_on.set()

    running = plain.delay()
    # revoke() of a plain task sets the same flag: an abortable task sees it by id.
    seen: list[Any] = []

    def check() -> bool:
        if started.is_set() and not seen:
            running.revoke()
            seen.append(watcher.AsyncResult(running.id).state)
            watcher.delay(running.id)
        return len(looked) == 1 and running.ready()

    await work(celery, check)
    assert seen == [ABORTED]
    assert looked == [True]


async def test_abort_of_an_ended_or_unknown_task_changes_nothing(celery: Celery) -> None:
    @celery.task(base=AbortableTask)
    def quick() -> int:
        return 1

    result = quick.delay()
    await work(celery, result.ready)
    result.abort()
    assert result.state == states.SUCCESS and not result.is_aborted()
    unknown = quick.AsyncResult("00000000-0000-4000-8000-000000000000")
    unknown.abort()
    assert unknown.state == states.PENDING and not unknown.is_aborted()


def test_eager_calls_are_never_aborted(celery: Celery) -> None:
    @celery.task(bind=True, base=AbortableTask)
    def export(self: AbortableTask) -> bool:
        return self.is_aborted()

    result = export.apply()
    assert isinstance(result, EagerResult)
    assert result.get() is False
