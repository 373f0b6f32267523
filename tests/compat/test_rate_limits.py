"""The facade's limits: Celery's rate_limit (on the task, from task_annotations, from
task_default_rate_limit) becomes the global limit a worker sets, and concurrency_key /
max_concurrency ride with the job from a task option or an apply_async option."""

from __future__ import annotations

import psycopg

from akadze_compat import Celery
from tests.helpers import job


def test_celerys_rate_limits_are_declared_on_the_core_tasks(celery: Celery) -> None:
    celery.conf.task_annotations = {"proj.annotated": {"rate_limit": "5/m"}}
    celery.conf.task_default_rate_limit = "100/h"

    @celery.task(name="proj.own", rate_limit="10/s")
    def own() -> None: ...

    @celery.task(name="proj.annotated")
    def annotated() -> None: ...

    @celery.task(name="proj.defaulted")
    def defaulted() -> None: ...

    core = celery.prepare_worker()
    declared = {name: (rate.count, rate.period)
                for _, name, rate in core.declared_rate_limits()}
    assert declared["proj.own"] == (10, 1.0)
    assert declared["proj.annotated"] == (5, 60.0)
    assert declared["proj.defaulted"] == (100, 3600.0)


def test_concurrency_keys_from_the_task_and_from_apply_async(
        celery: Celery, db: psycopg.Connection) -> None:
    @celery.task(name="proj.keyed", concurrency_key="tenant", max_concurrency=3)
    def keyed() -> None: ...

    @celery.task(name="proj.plain")
    def plain() -> None: ...

    by_task = keyed.delay()
    by_call = plain.apply_async(concurrency_key="tenant-9", max_concurrency=2)
    unkeyed = plain.delay()
    metas = [job(db, result.job_id)["meta"] for result in (by_task, by_call, unkeyed)]
    assert [(meta.get("concurrency_key"), meta.get("max_concurrency")) for meta in metas] == [
        ("tenant", 3), ("tenant-9", 2), (None, None)]
