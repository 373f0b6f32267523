"""django-celery-results: ``result_backend='django-db'`` keeps its ``TaskResult`` rows.

The same project (``djresults_probe.py``: Django settings with the app installed, two tasks
run by an embedded worker) on Celery 5.7 with a Redis broker and on akadze: the rows read
through the ORM must be the same, with ``result_extended`` off (no name, arguments,
traceback nor worker: django_celery_results writes them only when it is on) and on.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.addons.results_sides import on_akadze, on_celery
from tests.conftest import create_database, database_url_for, drop_database

pytestmark = pytest.mark.slow
NEEDS = ("django", "django_celery_results", "psycopg")
REDIS = "redis://127.0.0.1:6379/11"


@pytest.fixture
def django_database(admin_url: str) -> Any:
    """An empty database for the Celery side's Django tables."""
    name = create_database(admin_url, None)
    yield database_url_for(admin_url, name)
    drop_database(admin_url, name)


@pytest.mark.parametrize("extended", ["0", "1"])
def test_task_result_rows_match_celery(database_url: str, django_database: str,
                                       extended: str) -> None:
    expected = on_celery("djresults_probe.py", django_database, REDIS, extended, needs=NEEDS)
    got = on_akadze("djresults_probe.py", database_url, database_url, extended, needs=NEEDS)
    assert got == expected
    assert got["ok"]["status"] == "SUCCESS" and got["ok"]["result"] == 5
    assert got["bad"]["result"] == {"exc_type": "ValueError", "exc_message": ["boom", 7],
                                    "exc_module": "builtins"}
    assert got["count"] == 2


def test_without_the_table_outcomes_are_stored_all_the_same(database_url: str) -> None:
    """A project that never ran Django's migrations: the writer finds no table and records
    nothing; the tasks' outcomes are stored as usual (the probe's ``.get()`` returns)."""
    got = on_akadze("djresults_probe.py", database_url, database_url, "0", "nomigrate",
                    needs=NEEDS)
    assert got == {"ok": 5, "table": False}
