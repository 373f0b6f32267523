"""celery-progress: the progress a page polls (``Progress(AsyncResult(id)).get_info()``) over a
task's ``update_state(state='PROGRESS', meta=...)``, the same on Celery 5.7 (Redis broker
and results) and on akadze: each step, then the success or the failure as the page shows it
(the success read with ``result.get(task_id)``, a str landing in ``timeout``)."""

from __future__ import annotations

import pytest

from tests.addons.results_sides import on_akadze, on_celery

pytestmark = pytest.mark.slow
NEEDS = ("celery_progress",)


def test_progress_answers_match_celery(database_url: str) -> None:
    expected = on_celery("progress_probe.py", "redis://127.0.0.1:6379/11",
                         "redis://127.0.0.1:6379/12", needs=NEEDS)
    got = on_akadze("progress_probe.py", database_url, database_url, needs=NEEDS)
    assert got == expected
    assert [answer["progress"].get("current") for answer in got["count"]] == [1, 2, 3, 100]
    assert got["count"][-1]["result"] == "counted 3" and got["count"][-1]["success"] is True
    assert got["broken"][-1]["state"] == "FAILURE" and got["broken"][-1]["result"] == "'lost'"
