"""django_celery_results' ``TaskResult`` rows as a project sees them, on either side.

``python djresults_probe.py URL BROKER EXTENDED``: a Django project on the Postgres database
``URL`` with django_celery_results installed and ``result_backend='django-db'``, a worker
embedded as Celery's test suites embed one, two tasks run (one succeeds, one raises); prints
the JSON of their rows, read through the ORM. The same code runs on Celery 5.7 (``BROKER`` a
Redis URL) and on akadze (``BROKER`` the same Postgres database, ``celery`` resolved to
akadze_compat by ``AKADZE_CELERY=1``).
"""

from __future__ import annotations

import json
import sys
import uuid

import django
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict

URL, BROKER, EXTENDED = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
#: "nomigrate": the project never ran its migrations (no TaskResult table).
MIGRATE = sys.argv[4:] != ["nomigrate"]
_db = conninfo_to_dict(URL)
settings.configure(
    INSTALLED_APPS=["django_celery_results"], USE_TZ=True, TIME_ZONE="UTC",
    DEFAULT_AUTO_FIELD="django.db.models.AutoField",
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql",
                           "NAME": _db.get("dbname", ""), "USER": _db.get("user", ""),
                           "HOST": _db.get("host", ""), "PORT": _db.get("port", "")}})
django.setup()

from django.core.management import call_command  # noqa: E402

if MIGRATE:
    call_command("migrate", "django_celery_results", verbosity=0)

from celery import Celery  # noqa: E402
from celery.contrib.testing.worker import start_worker  # noqa: E402
from django_celery_results.models import TaskResult  # noqa: E402

app = Celery("djr", broker=BROKER, backend="django-db", set_as_current=True)
app.conf.result_extended = EXTENDED
app.conf.task_default_queue = f"djr-{uuid.uuid4().hex[:8]}"


@app.task(name="djr.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="djr.fail")
def fail(label: str) -> None:
    raise ValueError(label, 7)


if not MIGRATE:
    from django.db import connection

    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=20):
        value = add.delay(2, y=3).get(timeout=30)
    print(json.dumps({"ok": value,
                      "table": "django_celery_results_taskresult"
                      in connection.introspection.table_names()}))
    sys.exit(0)

with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=20):
    ok = add.delay(2, y=3)
    bad = fail.delay("boom")
    ok.get(timeout=30)
    bad.get(timeout=30, propagate=False)

rows = {}
for name, result in (("ok", ok), ("bad", bad)):
    row = TaskResult.objects.get(task_id=result.id)
    rows[name] = {
        "status": row.status, "result": json.loads(row.result),
        "content_type": row.content_type, "content_encoding": row.content_encoding,
        "meta": json.loads(row.meta) if row.meta else None,
        "task_name": row.task_name, "task_args": row.task_args,
        "task_kwargs": row.task_kwargs, "worker_set": row.worker is not None,
        "traceback": None if row.traceback is None
        else row.traceback.strip().splitlines()[-1],
        "dated": row.date_done is not None and row.date_created is not None,
        "done_after_created": row.date_done >= row.date_created,
    }
rows["count"] = TaskResult.objects.filter(task_id__in=[ok.id, bad.id]).count()
print(json.dumps(rows, sort_keys=True))
