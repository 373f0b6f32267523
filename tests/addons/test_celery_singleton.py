"""celery-singleton: a second call with the same arguments while the first is queued gets the
first's result (or ``DuplicateTaskError`` with ``raise_on_duplicate``); once the first ran,
the call is accepted again. Compared with Celery 5.7 (``locks_probe.py``, which runs
celery-once beside it: ``test_celery_once.py`` reads its part)."""

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
    keys = ("singleton", "singleton_raise", "singleton_after_run")
    assert {key: got[key] for key in keys} == {key: expected[key] for key in keys}
    assert got["singleton"] == {"duplicate_same_id": True, "other_args_new_id": True}
    assert got["singleton_raise"] == "DuplicateTaskError"
    assert got["results"] == expected["results"] == [2, 4, 4, 5]
