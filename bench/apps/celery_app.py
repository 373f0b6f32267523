"""The Celery-style project ``akadze-compat -A bench.apps.celery_app worker`` runs.

The worker's database comes from ``AKADZE_DATABASE_URL`` (set by the benchmark). Same no-op
as the real Celery app in ``bench/celery_real``: a sync task with its result ignored.
"""

from __future__ import annotations

import os
from typing import Any

from akadze_compat import Celery

NOOP = "bench.noop"


def make_app(database_url: str | None = None) -> Any:
    """A Celery-compatible app with the no-op task (no URL: ``AKADZE_DATABASE_URL``)."""
    celery = Celery("bench", broker=database_url or os.environ.get("AKADZE_DATABASE_URL"),
                    set_as_current=False)
    celery.conf.task_ignore_result = True

    @celery.task(name=NOOP, ignore_result=True)
    def noop(n: int = 0) -> None:
        """Does nothing."""

    return celery


app = make_app()
