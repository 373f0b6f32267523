"""celery-once: ``base=QueueOnce`` refuses a second call with the same arguments while the
first is queued (``AlreadyQueued``; with ``once={'graceful': True}`` a REJECTED
``EagerResult``) and accepts it again once the first ran. Compared with Celery 5.7
(``locks_probe.py``)."""

from __future__ import annotations

import pytest

from tests.addons.results_sides import on_akadze, on_celery

pytestmark = pytest.mark.slow
NEEDS = ("celery_singleton", "celery_once", "redis")
LOCKS = "redis://127.0.0.1:6379/13"


def test_a_duplicate_call_is_refused_as_on_celery(database_url: str) -> None:
    expected = on_celery("locks_probe.py", "redis://127.0.0.1:6379/11",
                         "redis://127.0.0.1:6379/12", LOCKS, needs=NEEDS)
    got = on_akadze("locks_probe.py", database_url, database_url, LOCKS, needs=NEEDS)
    keys = ("once", "once_graceful", "once_after_run")
    assert {key: got[key] for key in keys} == {key: expected[key] for key in keys}
    assert got["once"] == "AlreadyQueued"
    assert got["once_graceful"] == {"type": "EagerResult", "state": "REJECTED", "id": None}
    assert got["once_after_run"] == 4
