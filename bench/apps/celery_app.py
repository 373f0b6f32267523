"""The Celery-style project ``akadze-compat -A bench.apps.celery_app worker`` runs.

The worker's database comes from ``AKADZE_DATABASE_URL`` (set by the benchmark). Same no-op
as the real Celery app in ``bench/celery_real``: a sync task with its result ignored.
"""

from __future__ import annotations

import os
import time
from typing import Any

from akadze_compat import Celery

NOOP = "bench.noop"
CHORD_MEMBER = "bench.chord_member"
CHORD_BODY = "bench.chord_body"


def make_app(database_url: str | None = None) -> Any:
    """A Celery-compatible app with the no-op task (no URL: ``AKADZE_DATABASE_URL``)."""
    celery = Celery("bench", broker=database_url or os.environ.get("AKADZE_DATABASE_URL"),
                    set_as_current=False)
    celery.conf.task_ignore_result = True

    @celery.task(name=NOOP, ignore_result=True)
    def noop(n: int = 0) -> None:
        """Does nothing."""

    # The canvas workload's chord, as in bench/celery_real: results stored.
    @celery.task(name=CHORD_MEMBER, ignore_result=False)
    def chord_member(n: int = 0) -> None:
        """A chord's no-op member."""

    @celery.task(name=CHORD_BODY, ignore_result=False)
    def chord_body(results: object = None) -> float:
        """A chord's body: returns the wall-clock time at which it started."""
        return time.time()

    return celery


app = make_app()
