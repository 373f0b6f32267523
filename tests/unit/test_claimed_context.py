"""A claimed job's context builds its ``Job`` only when asked for, and then the same
``Job`` as ``decode_job`` makes; the run's outcome never needs it."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime, timezone
from typing import Any

import pytest

from akadze_core import App, current
from akadze_core.execution.context import JobContext
from akadze_core.execution.executor import decode_job
from akadze_core.execution.threads import ThreadRunner
from akadze_core.model.jobs import Job
from akadze_core.model.outcomes import FAIL, SUCCESS
from akadze_core.worker.completer import Completer
from akadze_core.worker.runs import Runs
from akadze_core.worker.signals import Signals

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)


def _row(task: str, args: str = '{"n": 3}', **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": 41, "task": task, "queue": "default", "args": args, "state": "running",
        "priority": 0, "scheduled_at": NOW, "attempt": 2, "max_attempts": 5,
        "run_count": 3, "meta": '{"k": 1}', "expires_at": None, "cancel_requested": False,
        "created_at": NOW, "started_at": NOW, "upstreams": None,
        "upstream_results": None, "position": None, "claim_token": 99, "last_error": None}
    row.update(extra)
    return row


def _app() -> App:
    return App(database_url="postgresql://postgres@127.0.0.1:5432/unused")


class _Lease:
    worker_id = 7


def _run(app: App, row: dict[str, Any]) -> Any:
    """The outcome the worker's runs hand the completer for claimed ``row`` (started as the
    claim loop starts a claim's rows)."""
    async def main() -> Any:
        threads = ThreadRunner(2)
        runs = Runs(app, Signals(), _Lease(), queues=["default"],  # type: ignore[arg-type]
                    process_pool=None, concurrency=None, outcome_log_level=logging.INFO)
        completer = Completer(lambda: None, lambda batch, rows: None)
        runs.open(completer, threads)
        try:
            runs.start_many([row])
            while runs.running:
                await asyncio.sleep(0)
            [outcome] = completer._next_batch()
            return outcome
        finally:
            threads.close()

    return asyncio.run(main())


def test_a_body_that_never_asks_for_its_job_runs_without_one(monkeypatch: Any) -> None:
    app = _app()
    built: list[int] = []
    make = Job.from_claim.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(Job, "from_claim", classmethod(
        lambda cls, *args, **kwargs: built.append(1) or make(cls, *args, **kwargs)))

    @app.task
    async def noop(n: int) -> int:
        return n

    outcome = _run(app, _row(noop.name))
    assert (outcome.job_id, outcome.run_count, outcome.kind) == (41, 3, SUCCESS)
    assert (outcome.claim_token, outcome.result) == (99, "3")
    assert built == []


def test_current_job_is_the_job_decode_job_makes() -> None:
    app = _app()
    seen: list[Job] = []

    @app.task
    async def look(n: int) -> None:
        seen.append(current().job)
        assert current().job is seen[0]  # built once

    row = _row(look.name, upstream_results="[1, 2]", result_arg="n")
    assert _run(app, row).kind == SUCCESS
    assert seen == [decode_job(app, row)[0]]
    assert seen[0].args == {"n": [1, 2]} and seen[0].upstream_results == [1, 2]
    assert seen[0].meta == {"k": 1} and seen[0].claim_token == 99


def test_a_row_that_cannot_run_fails_from_the_row_alone() -> None:
    app = _app()

    @app.task
    async def noop() -> None:
        pass

    bad_args = _run(app, _row(noop.name, args="[1]"))
    unknown = _run(app, _row("nobody.registered"))
    for outcome in (bad_args, unknown):
        assert (outcome.job_id, outcome.run_count, outcome.kind) == (41, 3, FAIL)
        assert outcome.claim_token == 99


def test_the_contexts_fields_are_the_jobs_without_building_it(monkeypatch: Any) -> None:
    app = _app()
    row = _row("t", expires_at=NOW, position=4, meta='{"celery": {"headers": {}}}')
    built: list[int] = []
    make = Job.from_claim.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(Job, "from_claim", classmethod(
        lambda cls, *args, **kwargs: built.append(1) or make(cls, *args, **kwargs)))
    context = JobContext.claimed(app, row, {"n": 3}, None, 7, None)
    names = ("id", "task", "queue", "priority", "attempt", "max_attempts", "run_count",
             "expires_at", "position", "claim_token", "meta")
    fields = {name: getattr(context, name) for name in names}
    assert built == []
    assert fields["meta"] == {"celery": {"headers": {}}} and fields["position"] == 4
    job = context.job
    assert built == [1]
    assert {name: getattr(job, name) for name in names} == fields
    # The meta decoded before is the Job's own (one dict: a change through either is seen).
    assert job.meta is fields["meta"]
    assert {name: getattr(context, name) for name in names} == fields
    assert job == decode_job(app, row)[0]


def test_a_claimed_meta_reads_as_json_loads_reads_it() -> None:
    texts = ['{}', '{"k": 1}', '{"celery": {"ignore_result": true, "headers": {}}}',
             ' {"k": [1, 2.5, null, "\\u00e9"]} ', '{"k": 1}\n']
    for text in texts:
        assert Job.claimed_meta({"meta": text}) == json.loads(text)
    assert Job.claimed_meta({"meta": None}) == {} and Job.claimed_meta({}) == {}
    assert Job.claimed_meta({"meta": {"k": 2}}) == {"k": 2}  # decoded already
    for bad in ('{"k": 1} x', '{"k":', ''):
        with pytest.raises(json.JSONDecodeError):
            Job.claimed_meta({"meta": bad})
