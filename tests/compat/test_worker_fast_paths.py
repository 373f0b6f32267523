"""The worker's per-job shortcuts give exactly what the general code they replace gives.

A drain of no-op tasks runs this path thousands of times a second, so it skips work nobody
can observe: handlers that are Task's no-ops, signals without receivers, log lines below the
level, revive calls on scalars, ``Context.update`` on a request built whole. These tests pin
each shortcut to the long way round, and check that a handler, receiver or level added
between two runs is still seen (nothing is cached across runs).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest

from akadze_compat import Celery, Task
from akadze_compat.app.context import Context
from akadze_compat.backends.base import celery_meta
from akadze_compat.serialization import dumps, revive
from akadze_compat.worker import entry
from akadze_core import Job
from tests.compat.conftest import work
from tests.compat.signal_recorder import Recorder

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
TYPED = {"__type__": "decimal", "__value__": "1.50"}

#: ``meta["celery"]`` values: as ``delay()`` writes them, and the shapes a shortcut could
#: get wrong (typed values at any depth, empty and non-empty containers, a custom header
#: named like a request field, limits, a meta that is itself one typed value).
METAS: list[dict[str, Any]] = [
    {},
    {"eta": None, "link": None, "shadow": None, "expires": None, "headers": {},
     "root_id": None, "exchange": None, "priority": None, "parent_id": None,
     "link_error": None, "time_limit": None, "routing_key": None, "ignore_result": True,
     "soft_time_limit": None},
    {"headers": {"tenant": "acme", "id": "not-the-id", "time_limit": 99,
                 "amount": TYPED}, "time_limit": 30, "soft_time_limit": 20,
     "root_id": "root", "parent_id": "parent", "exchange": "ex", "routing_key": "rk",
     "ignore_result": None, "shadow": "shadowed", "eta": "2026-01-02T03:04:05+00:00"},
    {"headers": [], "link": [{"task": "t", "args": [TYPED], "kwargs": {"at": TYPED}}],
     "link_error": [], "retry_args": {"args": [TYPED, [TYPED]], "kwargs": {}},
     "soft_time_limit": 5, "expires": "2026-01-02T03:04:05+00:00"},
    {"state": "PROGRESS", "result": {"done": TYPED, "rows": [{"n": 1}, []]}},
    # A group member sent by a canvas (its group id and index, what it is passed).
    {"group_id": "g-1", "group_index": 3, "pass": "one"},
    TYPED,
]


def make_job(meta: dict[str, Any], *, expires_at: datetime | None = None,
             task_id: str | None = None) -> Job:
    top: dict[str, Any] = {"celery": meta}
    if task_id is not None:
        top["task_id"] = task_id
    return Job(7, "proj.add", "celery", {"args": [], "kwargs": {}}, "running", 2, NOW, 2, 4,
               3, meta=top, expires_at=expires_at)


@pytest.mark.parametrize("meta", METAS)
def test_revived_meta_is_revive_of_the_celery_meta(meta: dict[str, Any]) -> None:
    job = make_job(meta)
    expected = dict(revive(celery_meta(job))) if meta is not TYPED else None
    if expected is None:
        with pytest.raises(TypeError):  # what the long way does with such a meta
            dict(revive(celery_meta(job)))
        with pytest.raises(TypeError):
            entry._revived_meta(job)
        return
    revived = entry._revived_meta(job)
    assert revived == expected and list(revived) == list(expected)
    assert dumps(revived) == dumps(expected)
    assert revived is not celery_meta(job)
    # A new container wherever revive makes one: nothing the run changes leaks back.
    for key, value in revived.items():
        if isinstance(value, (dict, list)):
            assert value is not celery_meta(job)[key]


def reference_request(task: Task, job: Job, meta: dict[str, Any], args: list[Any],
                      kwargs: dict[str, Any]) -> Context:
    """``build_request`` the long way: ``Context(custom_headers, **fields)``."""
    task_id = job.meta.get("task_id") or task.app.core.task_ids().derive(job.id)
    custom_headers = dict(meta.get("headers") or {})
    hard, soft = meta.get("time_limit"), meta.get("soft_time_limit")
    request = Context(
        custom_headers, id=task_id, task=job.task, args=args, kwargs=kwargs,
        retries=max(0, job.attempt - 1), is_eager=False, called_directly=False,
        hostname=entry.worker_hostname, eta=meta.get("eta"),
        expires=meta.get("expires") or (job.expires_at.isoformat() if job.expires_at else None),
        delivery_info={"exchange": meta.get("exchange") or "",
                       "routing_key": meta.get("routing_key") or job.queue,
                       "queue": job.queue, "priority": job.priority,
                       "redelivered": job.run_count > job.attempt},
        headers=custom_headers or None, root_id=meta.get("root_id") or task_id,
        parent_id=meta.get("parent_id"), correlation_id=task_id, reply_to="",
        ignore_result=meta.get("ignore_result"), shadow=meta.get("shadow"),
        callbacks=meta.get("link"), errbacks=meta.get("link_error"), utc=True,
        timelimit=(hard, soft) if hard is not None or soft is not None else None,
        origin=None, _akadze_meta=meta)
    if "group_id" in meta:  # a canvas group member
        request.group, request.group_index = meta["group_id"], meta.get("group_index")
    if request.ignore_result is None:
        request.ignore_result = bool(task.option("ignore_result", "task_ignore_result"))
    return request


@pytest.mark.parametrize("ignore_setting", [False, True])
@pytest.mark.parametrize("meta", [meta for meta in METAS if meta is not TYPED])
@pytest.mark.parametrize("expires_at", [None, NOW])
def test_build_request_is_the_context_constructor(meta: dict[str, Any],
                                                  expires_at: datetime | None,
                                                  ignore_setting: bool) -> None:
    app = Celery("proj", set_as_current=False)
    app.conf.task_ignore_result = ignore_setting

    @app.task(name="proj.add")
    def add() -> None:
        """Never run."""

    for task_id in (None, "chosen-id"):
        job = make_job(meta, expires_at=expires_at, task_id=task_id)
        revived = entry._revived_meta(job)
        built = entry.build_request(add, job, revived, [1], {"y": 2})
        expected = reference_request(add, job, revived, [1], {"y": 2})
        # Same attributes, same values, same order (``repr(request)`` shows them).
        assert list(vars(built).items()) == list(vars(expected).items())
        assert (built.time_limit, built.soft_time_limit) == (expected.time_limit,
                                                             expected.soft_time_limit)
    app.close()


async def test_handlers_receivers_and_levels_added_between_runs_are_used(
        celery: Celery, caplog: pytest.LogCaptureFixture) -> None:
    @celery.task
    def echo(x: int) -> int:
        return x

    caplog.set_level(logging.WARNING, logger="celery.app.trace")
    first = echo.delay(1)
    await work(celery, first.ready)
    assert first.get() == 1
    assert not [record for record in caplog.records if record.name == "celery.app.trace"]

    # After a first run with nothing to call: a handler patched on the class, one set on
    # the instance, receivers and the INFO level must all be seen by the next run.
    events: list[tuple[str, Any]] = []

    def before_start(self: Task, task_id: str, args: Any, kwargs: Any) -> None:
        events.append(("before_start", args))

    def on_success(self: Task, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        events.append(("on_success", retval))

    type(echo).before_start = before_start  # type: ignore[method-assign]
    type(echo).on_success = on_success  # type: ignore[method-assign]
    echo.after_return = lambda status, retval, *rest: events.append(  # type: ignore[method-assign]
        ("after_return", status))
    recorder = Recorder("task_prerun", "task_success", "task_postrun")
    caplog.set_level(logging.INFO, logger="celery.app.trace")
    try:
        second = echo.delay(2)
        await work(celery, second.ready)
    finally:
        recorder.close()
    assert second.get() == 2
    assert events == [("before_start", [2]), ("on_success", 2), ("after_return", "SUCCESS")]
    assert recorder.names() == ["task_prerun", "task_success", "task_postrun"]
    assert recorder.calls[1][1]["result"] == 2 and recorder.calls[1][1]["runtime"] >= 0
    assert recorder.calls[2][1]["retval"] == 2 and recorder.calls[2][1]["state"] == "SUCCESS"
    lines = [record.getMessage() for record in caplog.records
             if record.name == "celery.app.trace"]
    assert len(lines) == 1 and lines[0].startswith(f"Task {echo.name}[{second.id}] "
                                                   "succeeded in ")
    assert lines[0].endswith(": 2")


def test_eager_runs_take_the_same_shortcuts() -> None:
    app = Celery("proj", set_as_current=False)
    calls: list[str] = []

    @app.task
    def double(x: int) -> int:
        return 2 * x

    assert double.apply((2,)).get() == 4 and not calls
    type(double).on_success = lambda self, *args: calls.append("on_success")  # type: ignore[method-assign]
    recorder = Recorder("task_success")
    try:
        assert double.apply((3,)).get() == 6
    finally:
        recorder.close()
    assert calls == ["on_success"] and recorder.names() == ["task_success"]
    app.close()


async def test_decimal_headers_and_retry_args_reach_the_body(celery: Celery) -> None:
    """Typed values in the meta are revived (the shortcut skips only scalars)."""
    seen: dict[str, Any] = {}

    @celery.task(bind=True)
    def pay(self: Task, amount: Decimal) -> str:
        seen["amount"] = amount
        seen["header"] = self.request.get("amount")
        if self.request.retries == 0:
            raise self.retry(args=(Decimal("2.50"),), countdown=0)
        return "paid"

    result = pay.apply_async((Decimal("1.50"),), headers={"amount": Decimal("9.99")})
    await work(celery, result.ready)
    assert result.get() == "paid"
    assert seen == {"amount": Decimal("2.50"), "header": Decimal("9.99")}


async def test_bytes_with_nul_bytes_round_trip_through_the_database(celery: Celery) -> None:
    """Arguments, a header, update_state's meta and the result: bytes stay bytes."""
    seen: dict[str, Any] = {}

    @celery.task(bind=True)
    def echo(self: Task, data: bytes, more: list[Any]) -> Any:
        seen.update(data=data, more=more, header=self.request.get("raw"))
        self.update_state(state="PROGRESS", meta={"chunk": data})
        return {"data": data, "more": more}

    data, more = b"\x00\x01", [b"a\x00b", "text", b"\xff\x00"]
    result = echo.apply_async((data, more), headers={"raw": b"\x00"})
    await work(celery, result.ready)
    assert seen == {"data": data, "more": more, "header": b"\x00"}
    assert result.get() == {"data": data, "more": more}


@pytest.mark.parametrize("meta", METAS)
def test_the_pools_limits_skip_parsing_only_metas_without_limits(meta: Any) -> None:
    import json

    from akadze_compat.worker.pool import CeleryProcessPool, _meta_of

    app = Celery("limits", set_as_current=False)
    app.conf.task_time_limit = 60

    @app.task(name="proj.add")
    def add() -> None:
        """Nothing."""

    pool = CeleryProcessPool.__new__(CeleryProcessPool)  # no processes: limits() only
    pool.app = app
    row = {"task": "proj.add", "meta": json.dumps({"celery": meta, "task_id": "x"})}
    parsed = _meta_of(row)
    hard = parsed.get("time_limit") or 60
    soft = parsed.get("soft_time_limit") or None
    assert pool.limits(app.core, row) == (soft and float(soft), float(hard))


async def test_a_run_with_nothing_asking_for_the_job_builds_none(
        celery: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    """The request, limits and outcome come off the claimed row: no ``Job`` per run."""
    built: list[int] = []
    make = Job.from_claim.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(Job, "from_claim", classmethod(
        lambda cls, *args, **kwargs: built.append(1) or make(cls, *args, **kwargs)))
    seen: list[Any] = []

    @celery.task(bind=True)
    def echo(self: Task, x: int) -> int:
        seen.append((self.request.id, self.request.retries, self.request.delivery_info))
        return x

    sent = echo.delay(5)
    await work(celery, sent.ready)
    assert sent.get() == 5 and built == []
    assert seen == [(sent.id, 0, {"exchange": "", "routing_key": "celery", "queue": "celery",
                                  "priority": 0, "redelivered": False})]
